"""Assemble what the GPU machine needs to run the real vLLM 0.33.0 engine with this backend, under the device tool's
64 MiB carry limit: one ``.tar.xz`` holding a site-packages folder ``vsite/`` with

- vLLM 0.33.0 from its CUDA wheel, its Python tree whole, its compiled ops ``_C_stable_libtorch.abi3.so`` (built on
  torch's stable ABI: every torch symbol it needs is exported by torch 2.11, and it loads and registers its ops
  there) with its fat binaries cut to what an sm_90 GPU loads (``fatbin.py``) and its symbol table stripped; the
  other compiled parts removed: ``vllm_flash_attn`` (fa2/fa3, vLLM's own FLASH_ATTN backend), ``_moe_C`` (MoE;
  vLLM imports it in a try), FlashMLA, qutlass, DeepGEMM (its library and CUDA headers), the sm_100 FMHA, the Rust front end ``vllm-rs``;
- the wheels vLLM imports on its start, engine and ``vllm serve`` paths that the GPU image lacks (``ROOTS`` and
  what they require, as resolved for vllm 0.33.0 on Python 3.12): appended after the image's site-packages by a
  ``.pth`` file (``gpu_env.sh``), so where the image has a package its copy is the one imported;
- this project, from a wheel built here (the ``vllm.general_plugins`` entry point metadata).

FlashInfer 0.7.2.post1 and apache-tvm-ffi (which vLLM imports at start) travel as ``.fi072``
(``bench/pack_flashinfer072.sh``).

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_39_x86_64 ... --platform manylinux1_x86_64 -d WHEELS vllm==0.33.0 \\
        $(python3 gpu_tests/vllm/make_bundle.py --print-requirements)
    python3 gpu_tests/vllm/make_bundle.py --wheels WHEELS --out .vgpu/vllm_site.tar.xz

Test-only: nothing here ships in the project's wheel.
"""
from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fatbin  # noqa: E402
import sglang_twin  # noqa: E402

build_project_wheel = sglang_twin.load("make_bundle").build_project_wheel  # the project wheel, as SGLang's bundle

VLLM = "vllm==0.33.0"
# What a vLLM 0.33 start imports that the GPU image lacks, with what each requires (versions as pip resolves vllm
# 0.33.0's requirements). Found by importing vLLM's engine, worker, model runner, models, attention backends, sampler,
# CLI and benchmarks, and building and serving `vllm serve`'s HTTP app, on a CPU venv of torch 2.11 and IMAGE_PACKAGES
# with these appended after its site-packages (check_bundle_cpu.sh). vLLM's METADATA asks for more (anthropic, mcp,
# mistral_common, opentelemetry-exporter-otlp, ...): a start with llama/gemma3 and the default server flags imports
# none of them.
REQUIREMENTS = [
    "annotated-types==0.8.0", "astor==0.8.1", "blake3==1.0.11", "cachetools==8.0.3", "cbor2==6.3.0",
    "compressed-tensors==0.17.0", "depyf==0.20.0", "dill==0.4.1", "dnspython==2.9.2", "email-validator==2.4.0",
    "fastapi==0.136.3", "httpcore2==2.17.0", "httptools==0.9.0", "httpx2==2.17.0", "ijson==3.6.0",
    "importlib-metadata==8.7.0", "interegular==0.3.3", "jiter==0.19.0", "jmespath==1.1.0",
    "jsonschema-specifications==2025.9.1", "jsonschema==4.26.0", "lark==1.2.2", "llguidance==1.7.6",
    "lm-format-enforcer==0.11.3", "loguru==0.7.3", "model-hosting-container-standards==0.1.16", "msgspec==0.23.0",
    "openai==3.63.0", "opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions-ai==0.5.1", "opentelemetry-semantic-conventions==0.66b2", "orjson==3.13.0",
    "oss-harmony==0.0.11", "outlines-core==0.2.14", "partial-json-parser==0.2.1.1.post7",
    "prometheus-fastapi-instrumentator==8.1.0", "pybase64==1.5.1", "pydantic-core==2.50.5",
    "pydantic-extra-types==2.11.1", "pydantic==2.14.4", "python-json-logger==4.2.0", "python-multipart==0.0.34",
    "pyzmq==27.3.0", "referencing==0.37.0", "rpds-py==2026.9.1", "setproctitle==1.3.8", "sniffio==1.3.1",
    "sse-starlette==3.7.1", "starlette==1.10.0", "truststore==0.10.5", "typing-inspection==0.4.5", "uvicorn==0.55.0",
    "watchfiles==1.3.0", "xgrammar==0.2.8",
]
# What the same path imports from the GPU image ('cuda'; /work/.library/device/KINDS.md lists its packages, read
# 2026-11-17): the bundle's .pth comes after the image's site-packages, so a bundled copy of one of these would never
# be imported. check_bundle_cpu.sh installs them in its venv to stand for the image; gpu_env.sh checks they import.
IMAGE_PACKAGES = [
    "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs", "certifi", "cloudpickle", "einops",
    "frozenlist", "grpcio", "h11", "msgpack", "multidict", "nvidia-ml-py", "opencv-python-headless", "packaging",
    "prometheus-client", "propcache", "protobuf", "psutil", "py-cpuinfo", "pyyaml", "regex", "requests", "rich",
    "sentencepiece", "six", "tiktoken", "tqdm", "typer", "uvloop", "yarl", "zipp",
]
# Removed from vLLM's tree: compiled parts this path never loads (the module docstring says why each).
VLLM_DROP = ["vllm/vllm-rs", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/_qutlass_C.abi3.so",
             "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so", "vllm/_flashkda_C.abi3.so",
             "vllm/_deepselect_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
             "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/third_party/deep_gemm/_C_extension.abi3.so",
             "vllm/third_party/deep_gemm/include", "vllm/third_party/fmha_sm100"]
VLLM_OPS = "vllm/_C_stable_libtorch.abi3.so"
LIMIT_BYTES = 64 * 1024 * 1024


def dist_key(name: str) -> str:
    return name.lower().replace("_", "-")


def wheel_key(wheel: Path) -> str:
    return dist_key(wheel.name.split("-")[0])


def trim_vllm(site: Path, arch: int) -> tuple[int, int]:
    removed = 0
    for rel in VLLM_DROP:
        path = site / rel
        if path.is_dir():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        elif path.exists():
            removed += path.stat().st_size
            path.unlink()
    ops = site / VLLM_OPS
    before = ops.stat().st_size
    kept, _ = fatbin.strip_library(ops, ops, arch)
    subprocess.run(["strip", "--strip-unneeded", str(ops)], check=True)
    return removed + before - ops.stat().st_size, kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder of the downloaded wheels (vllm and REQUIREMENTS)")
    parser.add_argument("--out", type=Path, help="the .tar.xz to write")
    parser.add_argument("--arch", type=int, default=90, help="the GPU architecture whose code is kept (90: H100/H200)")
    parser.add_argument("--print-requirements", action="store_true")
    parser.add_argument("--print-image-packages", action="store_true", help="what the bundle expects of the image")
    args = parser.parse_args(argv)
    if args.print_requirements:
        print(" ".join(sorted(set(REQUIREMENTS))))
        return 0
    if args.print_image_packages:
        print(" ".join(IMAGE_PACKAGES))
        return 0
    if args.wheels is None or args.out is None:
        parser.error("--wheels and --out are required")
    names = {wheel_key(w): w for w in args.wheels.glob("*.whl")}
    wanted = [VLLM] + sorted(set(REQUIREMENTS))
    missing = [r for r in wanted if dist_key(r.split("==")[0]) not in names]
    if missing:
        parser.error(f"--wheels {args.wheels}: no wheel for {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "vsite"
        site.mkdir()
        for requirement in wanted:
            with zipfile.ZipFile(names[dist_key(requirement.split("==")[0])]) as zf:
                zf.extractall(site)
        removed, kept = trim_vllm(site, args.arch)
        with zipfile.ZipFile(build_project_wheel(Path(tmp) / "project")) as zf:
            zf.extractall(site)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.out, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
            tar.add(site, arcname="vsite")
    size = args.out.stat().st_size
    print(f"wrote {args.out}: {size / 2**20:.1f} MiB (vllm trimmed by {removed / 2**20:.0f} MB unpacked; "
          f"{kept / 2**20:.1f} MB of sm_{args.arch} fat-binary code kept)")
    if size > LIMIT_BYTES - 24 * 2**20:
        print(f"WARNING: {size / 2**20:.1f} MiB leaves under 24 MiB of the 64 MiB carry for the tree and .fi072",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
