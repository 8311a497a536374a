"""vLLM's entry points (``pyproject.toml``): ``register`` for ``vllm.general_plugins`` (run in every vLLM process)
and ``cpu_platform`` for ``vllm.platform_plugins``."""
from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

BACKEND_CLASS = "sglang_inkling_backend.hosts.vllm.backend.InklingVllmBackend"
CPU_PLATFORM_CLASS = "sglang_inkling_backend.hosts.vllm.platform.InklingCpuPlatform"


def register() -> None:
    """Put this backend in vLLM's ``CUSTOM`` slot (``--attention-backend CUSTOM``). Idempotent; if another plugin
    holds ``CUSTOM`` already, raise naming it (one slot per process)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from sglang_inkling_backend.hosts.vllm.version import check_vllm_version, is_cpu_build

    check_vllm_version()
    _log_through_vllm()
    try:
        current = AttentionBackendEnum.CUSTOM.get_path()
    except ValueError:
        current = None  # CUSTOM is empty until a plugin registers
    if current and current != BACKEND_CLASS:
        raise RuntimeError(f"sglang-inkling-backend: vLLM's CUSTOM attention backend is already registered to "
                           f"{current}; uninstall that plugin or disable it with VLLM_PLUGINS")
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
    if is_cpu_build() and os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        logger.warning("inkling: VLLM_TARGET_DEVICE=cpu makes vLLM skip platform plugins, so on this CPU build "
                       "--attention-backend CUSTOM would be ignored (vLLM runs CPU_ATTN); unset VLLM_TARGET_DEVICE")


def _log_through_vllm() -> None:
    """Send this package's log lines (the route chosen, refusals) through vLLM's handlers, so they appear in the
    server's log next to vLLM's own; vLLM configures only its own logger."""
    ours, theirs = logging.getLogger("sglang_inkling_backend"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


def cpu_platform():
    """The CPU platform that honours ``CUSTOM``, on vLLM's CPU build; None elsewhere (CUDA/ROCm platforms honour a
    selected ``CUSTOM`` themselves, and an out-of-tree platform would displace them)."""
    from sglang_inkling_backend.hosts.vllm.version import is_cpu_build

    return CPU_PLATFORM_CLASS if is_cpu_build() else None
