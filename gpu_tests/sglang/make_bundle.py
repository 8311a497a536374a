"""Assemble what the GPU machine needs to run the real SGLang 0.5.23 server with this backend, under the device
tool's 64 MiB carry limit: one ``.tar.xz`` holding a site-packages folder with

- SGLang 0.5.23 from its wheel, trimmed: the Rust extensions (``srt/rust_extensions/*.so``, 42 MB; the Python
  server path does not load them), ``multimodal_gen/`` and ``test/`` removed;
- the small pure-Python / manylinux cp312 wheels SGLang imports at start-up that the GPU image lacks;
- this project, from a wheel built here (so its ``sglang.srt.plugins`` entry point metadata exists there).

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \\
        --platform manylinux1_x86_64 -d WHEELS $(python3 gpu_tests/sglang/make_bundle.py --print-requirements)
    python3 gpu_tests/sglang/make_bundle.py --wheels WHEELS --out ../main/.gpu/sglang_site.tar.xz

Test-only: nothing here ships in the project's wheel.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What SGLang 0.5.23 imports at start-up on the CUDA path that the GPU image (KINDS.md's package list) lacks.
REQUIREMENTS = [
    "sglang==0.5.23", "apache-tvm-ffi==0.1.11", "xgrammar==0.2.7", "compressed-tensors==0.18.0",
    "msgspec==0.23.0", "orjson==3.13.0", "pybase64==1.5.1", "starlette==1.10.0", "fastapi==0.165.0",
    "uvicorn==0.54.0", "pyzmq==27.3.0", "setproctitle==1.3.8", "partial-json-parser==0.2.1.1.post7",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    "interegular==0.3.3", "openai==3.57.0", "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1",
    "python-multipart==0.0.34", "dill==0.4.1", "loguru==0.7.3", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1", "soundfile==0.14.0",
    "cffi==2.0.0", "pycparser==3.12",  # soundfile needs cffi; transformers imports soundfile when present
    "gguf==0.19.0",  # sglang.srt.layers.quantization imports it
    "httpx2==2.16.2", "httpcore2==2.16.2", "truststore==0.10.5",  # openai 3.x imports httpx2
    "opentelemetry-api==1.45.2",  # fastapi 0.165 imports opentelemetry
]
SGLANG_DROP = ["sglang/multimodal_gen", "sglang/test"]
LIMIT_BYTES = 64 * 1024 * 1024


def unpack_wheel(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


def trim_sglang(site: Path) -> int:
    removed = 0
    for rel in SGLANG_DROP:
        path = site / rel
        if path.exists():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
    for so in (site / "sglang/srt/rust_extensions").glob("*.so"):
        removed += so.stat().st_size
        so.unlink()
    return removed


def build_project_wheel(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest),
                    str(REPO)], check=True)
    wheels = sorted(dest.glob("sglang_inkling_backend-*.whl"))
    if not wheels:
        raise RuntimeError(f"no sglang_inkling_backend wheel built in {dest}")
    return wheels[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder of the downloaded wheels (REQUIREMENTS)")
    parser.add_argument("--out", type=Path, help="the .tar.xz to write")
    parser.add_argument("--print-requirements", action="store_true")
    args = parser.parse_args(argv)
    if args.print_requirements:
        print(" ".join(REQUIREMENTS))
        return 0
    if args.wheels is None or args.out is None:
        parser.error("--wheels and --out are required")
    names = {w.name.split("-")[0].lower().replace("_", "-"): w for w in args.wheels.glob("*.whl")}
    missing = [r for r in REQUIREMENTS if r.split("==")[0].lower().replace("_", "-") not in names]
    if missing:
        parser.error(f"--wheels {args.wheels}: no wheel for {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        for requirement in REQUIREMENTS:
            unpack_wheel(names[requirement.split("==")[0].lower().replace("_", "-")], site)
        removed = trim_sglang(site)
        unpack_wheel(build_project_wheel(Path(tmp) / "project"), site)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.out, "w:xz", preset=6) as tar:
            tar.add(site, arcname="site")
    size = args.out.stat().st_size
    print(f"wrote {args.out}: {size / 2**20:.1f} MiB (sglang trimmed by {removed / 2**20:.0f} MB unpacked)")
    if size > LIMIT_BYTES - 8 * 2**20:
        print(f"WARNING: {size / 2**20:.1f} MiB leaves under 8 MiB of the 64 MiB carry for the tree", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
