"""SGLang's ``--kv-cache-dtype`` values this backend serves and the core KV format (``mxfp8.KV_FORMATS``) each
stores; read by the resolution hooks (launcher) and the pool factory (scheduler)."""
from __future__ import annotations

KV_CACHE_DTYPE_TO_FORMAT = {
    "auto": None,  # the model dtype
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8_e4m3",
    "mxfp8": "mxfp8",
}


def pool_format_for(kv_cache_dtype_str: str | None, kv_cache_dtype) -> str:
    """The InklingKVPool format for SGLang's resolved KV dtype (string flag and torch dtype)."""
    from sglang_inkling_backend import mxfp8

    if kv_cache_dtype_str == "mxfp8":
        return "mxfp8"
    if kv_cache_dtype == mxfp8.DATA_DTYPE:
        return "fp8_e4m3"
    if kv_cache_dtype in mxfp8.UNQUANTIZED_FORMAT_OF_DTYPE:
        return mxfp8.UNQUANTIZED_FORMAT_OF_DTYPE[kv_cache_dtype]
    raise ValueError(
        f"--attention-backend inkling cannot store a KV cache of dtype {kv_cache_dtype} "
        f"(--kv-cache-dtype {kv_cache_dtype_str!r}); allowed --kv-cache-dtype values: "
        f"{', '.join(KV_CACHE_DTYPE_TO_FORMAT)}")
