"""The README and docs/ stay true to the tree: their links resolve, and the README's settings table lists every
``INKLING_*`` environment variable the code reads, and no other.

- Every relative Markdown link (``[text](path)``, ``[text](path#heading)``) in README.md and docs/**/*.md names a
  file or folder that exists, relative to the page; an anchor names a heading of the page it points to.
- Every backticked repository path in README.md and docs/*.md (one starting with a top-level folder, such as
  ``docs/DESIGN.md`` or ``bench/bench_decode.py``) exists from the repository root. The dated studies under
  docs/studies/ are records of a code reading, and name files they proposed: only their links are checked.
- The ``INKLING_*`` names in the package, the main job's launcher (``demo/``), its scripts, tests harnesses and benchmarks
  (``*.py`` and ``*.sh``) are exactly the rows of README.md's settings table.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
CURRENT_PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # not docs/studies/

MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\s]+)`")
# Top-level folders whose paths the pages name from the repository root.
REPO_FOLDERS = ("docs", "scripts", "tests", "bench", "gpu_tests", "integration", "tools", "third_party",
                "sglang_inkling_backend", "demo", ".ci")
# Files a run writes (git-ignored), named as defaults.
WRITTEN_BY_RUNS = {"integration/results/last_run.json"}
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_])INKLING_[A-Z0-9_]*[A-Z0-9]")
TABLE_ROW = re.compile(r"^\| `(INKLING_[A-Z0-9_]+)` \|")
# Where the code that reads the variables lives (the package, the main job's launcher beside it, the scripts, the
# test harnesses and the benchmarks; committed results are records, not readers).
CODE_FOLDERS = ("sglang_inkling_backend", "demo", "scripts", "gpu_tests", "bench", "tools", "integration")
SKIP_FOLDERS = {"__pycache__", "results"}


def _prose_lines(page: Path):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for _, line in _prose_lines(page) if line.startswith("#")}


def _markdown_links():
    for page in PAGES:
        for number, line in _prose_lines(page):
            for match in MARKDOWN_LINK.finditer(line):
                target = match.group(1)
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue  # a URL or an anchor on the same page
                yield f"{page.relative_to(ROOT)}:{number}", page, target


def _repo_paths():
    for page in CURRENT_PAGES:
        for number, line in _prose_lines(page):
            for match in BACKTICKED.finditer(line):
                text = match.group(1)
                if text.split("/")[0] not in REPO_FOLDERS or "/" not in text:
                    continue
                if any(ch in text for ch in "<>$*{}|"):
                    continue  # a placeholder or a glob, not one path
                path = text.split("::")[0]
                path = re.sub(r":\d+(-\d+)?$", "", path)  # file:line
                if path in WRITTEN_BY_RUNS:
                    continue
                yield f"{page.relative_to(ROOT)}:{number}", path


LINKS = list(_markdown_links())
REPO_PATHS = list(_repo_paths())


def test_the_scans_see_the_pages_links():
    assert README in PAGES and ROOT / "docs" / "DESIGN.md" in PAGES
    assert any(target == "docs/DESIGN.md" for _, _, target in LINKS)
    assert len(REPO_PATHS) > 20


@pytest.mark.parametrize("where,page,target", LINKS, ids=[f"{w} {t}" for w, _, t in LINKS])
def test_markdown_link_resolves(where, page, target):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve()
    assert resolved.exists(), f"{where} links {target}, which does not exist ({resolved})"
    if anchor:
        assert resolved.suffix == ".md", f"{where} links an anchor in {target}, which is not a Markdown page"
        assert anchor in _anchors(resolved), f"{where} links #{anchor}, which is no heading of {path}"


@pytest.mark.parametrize("where,path", REPO_PATHS, ids=[f"{w} {p}" for w, p in REPO_PATHS])
def test_backticked_repository_path_exists(where, path):
    assert (ROOT / path).exists(), f"{where} names {path}, which does not exist"


def _code_files():
    for folder in CODE_FOLDERS:
        top = ROOT / folder
        if not top.is_dir():
            continue
        for here, subfolders, files in os.walk(top):
            subfolders[:] = [d for d in subfolders if d not in SKIP_FOLDERS and not d.startswith(".")]
            for name in files:
                if name.endswith((".py", ".sh")):
                    yield Path(here) / name


def _names_in_code() -> dict[str, str]:
    found: dict[str, str] = {}
    for source in _code_files():
        for name in ENV_NAME.findall(source.read_text(encoding="utf-8")):
            found.setdefault(name, str(source.relative_to(ROOT)))
    return found


def _names_in_settings_table() -> list[str]:
    return [m.group(1) for line in README.read_text(encoding="utf-8").splitlines() if (m := TABLE_ROW.match(line))]


def test_the_settings_table_lists_every_inkling_variable_the_code_reads():
    in_code = _names_in_code()
    assert "INKLING_EXTEND_KERNEL" in in_code and "INKLING_FULL_INTEGRATION" in in_code  # the scan works
    table = _names_in_settings_table()
    assert len(table) == len(set(table)), f"README's settings table lists a variable twice: {sorted(table)}"
    missing = {name: where for name, where in in_code.items() if name not in table}
    assert not missing, f"README's settings table lacks {missing} (name: a file that reads it)"


def test_the_settings_table_lists_no_variable_the_code_does_not_read():
    stale = set(_names_in_settings_table()) - set(_names_in_code())
    assert not stale, f"README's settings table lists {sorted(stale)}, which no code reads"


def test_the_env_name_pattern_leaves_out_other_projects_names():
    """SGLang's own switches that contain the word (SGLANG_OPT_USE_INKLING_...) are not this project's settings."""
    assert ENV_NAME.findall("SGLANG_OPT_USE_INKLING_FUSED_ATTN_PROLOGUE=0 INKLING_VERIFY_GRAPHS=1") == [
        "INKLING_VERIFY_GRAPHS"]
