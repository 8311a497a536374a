"""Every committed-results path the repository names exists.

Scans the tracked-looking *.py, *.md and *.sh files (not .git, not a virtual environment, not build output) for
``bench/results/...`` paths, and the READMEs under bench/results/ for the relative ``../...`` paths they link, and
checks each resolves to a file or folder in this checkout. Brace groups (``2026-11-30-h200.{json,png}``) expand to
every member; ``*`` globs must match at least one file. Placeholders (``<date>``, ``$OUT``) are skipped.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".h16", ".gpu", ".whl",
             ".hypothesis", ".cache"}
SUFFIXES = {".py", ".md", ".sh"}

# A path character run; trailing sentence punctuation is stripped afterwards.
_PATH_CHARS = r"[A-Za-z0-9_.\-/{},*]"
REPO_PATH = re.compile(r"bench/results(?:/" + _PATH_CHARS + r"*)?")
RELATIVE_PATH = re.compile(r"`(\.\./" + _PATH_CHARS + r"+)`")


def _source_files():
    """Walks the checkout, never descending into a skipped folder (a set-up .venv holds tens of thousands of files)."""
    for folder, subfolders, files in os.walk(ROOT):
        # hidden folders (.git, .venv, the device tool's carried copies) are not the repository's sources
        subfolders[:] = [d for d in subfolders
                         if d not in SKIP_DIRS and not d.endswith(".egg-info") and not d.startswith(".")]
        for name in files:
            if Path(name).suffix in SUFFIXES:
                yield Path(folder) / name


def _expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end():]
    return list(itertools.chain.from_iterable(_expand_braces(head + alt + tail) for alt in match.group(1).split(",")))


def _clean(raw: str) -> str:
    return raw.rstrip(".,;:)'\"`")


def _exists(path: Path) -> bool:
    if "*" in str(path):
        return bool(glob.glob(str(path)))
    return path.exists()


def _named_paths():
    """(file:line, path as written, resolved path) for every results path the repository names."""
    found = []
    for source in _source_files():
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        inside_results = RESULTS in source.parents
        for number, line in enumerate(lines, 1):
            where = f"{source.relative_to(ROOT)}:{number}"
            for match in REPO_PATH.finditer(line):
                written = _clean(match.group(0))
                if "<" in line[match.end():match.end() + 1] or "$" in line[match.end():match.end() + 1]:
                    continue  # bench/results/<date>-... or bench/results/$NAME: a placeholder, not a path
                for each in _expand_braces(written):
                    found.append((where, each, ROOT / each))
            if inside_results and source.suffix == ".md":
                for match in RELATIVE_PATH.finditer(line):
                    written = _clean(match.group(1))
                    for each in _expand_braces(written):
                        found.append((where, each, (source.parent / each).resolve()))
    return found


NAMED = _named_paths()


def test_the_scan_finds_the_results_index_and_current_grid():
    """The scan itself works: it sees paths that are known to be named (the README's grid and this index)."""
    written = {path for _, path, _ in NAMED}
    assert "bench/results/current/2026-12-02-h200.json" in written
    assert any(path.startswith("../history/") for path in written)
    assert len(NAMED) > 40


def test_brace_and_punctuation_handling():
    assert _expand_braces("a/b.{json,png}") == ["a/b.json", "a/b.png"]
    assert _clean("bench/results/current/).") == "bench/results/current/"


@pytest.mark.parametrize("where,written,resolved", NAMED, ids=[f"{w} {p}" for w, p, _ in NAMED])
def test_named_results_path_exists(where, written, resolved):
    assert _exists(resolved), f"{where} names {written}, which does not exist ({resolved})"


def test_results_top_level_is_index_current_and_history():
    """bench/results/ holds the index, current/ and history/<date>-<topic>/ folders only."""
    assert sorted(p.name for p in RESULTS.iterdir()) == ["README.md", "current", "history"]
    for folder in (RESULTS / "history").iterdir():
        assert folder.is_dir(), folder
        assert re.fullmatch(r"20\d\d-\d\d-\d\d-[a-z0-9]+(-[a-z0-9]+)*", folder.name), folder.name
        assert (folder / "README.md").is_file(), f"{folder.name} has no README.md"
    assert (RESULTS / "current" / "README.md").is_file()


def test_index_names_every_history_folder():
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    missing = [f.name for f in (RESULTS / "history").iterdir() if f"history/{f.name}/" not in index]
    assert not missing, f"bench/results/README.md lacks a line for {missing}"
