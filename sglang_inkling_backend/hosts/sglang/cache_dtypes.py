"""SGLang's ``--kv-cache-dtype`` values this backend serves and the core KV format (``kv_formats.KV_FORMATS``) each
stores: the one map between them, read by the resolution hooks (launcher), the pool factory (scheduler) and the
attention backend."""
from __future__ import annotations

from typing import Optional

from sglang_inkling_backend import kv_formats, mxfp8
from sglang_inkling_backend.kv_formats import KVFormat

KV_FORMAT_OF_FLAG = {
    "auto": None,  # the model dtype
    "bf16": KVFormat.BF16,
    "bfloat16": KVFormat.BF16,
    "fp8_e4m3": KVFormat.FP8_E4M3,
    "mxfp8": KVFormat.MXFP8,
}


def flag_format(kv_cache_dtype: str) -> Optional[KVFormat]:
    """The KV format ``--kv-cache-dtype`` names (None for auto: the model dtype's)."""
    if kv_cache_dtype not in KV_FORMAT_OF_FLAG:
        raise ValueError(
            f"--attention-backend inkling does not support --kv-cache-dtype {kv_cache_dtype}; allowed values: "
            f"{', '.join(KV_FORMAT_OF_FLAG)}")
    return KV_FORMAT_OF_FLAG[kv_cache_dtype]


def dtype_format(kv_cache_dtype) -> Optional[KVFormat]:
    """The KV format of a pool of SGLang's resolved torch dtype, read without the flag: e4m3 bytes are per-tensor
    fp8 (SGLang stores MXFP8 as e4m3 bytes too; only the flag tells them apart). None for a dtype not stored here."""
    if kv_cache_dtype == mxfp8.DATA_DTYPE:
        return KVFormat.FP8_E4M3
    return kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE.get(kv_cache_dtype)


def pool_format(kv_cache_dtype_str: Optional[str], kv_cache_dtype) -> KVFormat:
    """The InklingKVPool format for SGLang's resolved KV dtype (string flag and torch dtype)."""
    # MXFP8 and per-tensor fp8 pools hold the same e4m3 dtype: only the flag tells them apart
    flagged = KV_FORMAT_OF_FLAG.get(kv_cache_dtype_str)
    kv_format = flagged if flagged is KVFormat.MXFP8 else dtype_format(kv_cache_dtype)
    if kv_format is None:
        raise ValueError(
            f"--attention-backend inkling cannot store a KV cache of dtype {kv_cache_dtype} "
            f"(--kv-cache-dtype {kv_cache_dtype_str!r}); allowed --kv-cache-dtype values: "
            f"{', '.join(KV_FORMAT_OF_FLAG)}")
    return kv_format
