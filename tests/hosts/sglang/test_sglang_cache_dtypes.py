"""SGLang's one map from ``--kv-cache-dtype`` (the flag, and the torch dtype SGLang resolves it to) to the core's KV
format. The module imports no sglang."""

import pytest
import torch

from sglang_inkling_backend import kv_formats
from sglang_inkling_backend.hosts.sglang.cache_dtypes import KV_FORMAT_OF_FLAG, dtype_format, flag_format, pool_format


def test_every_flag_names_a_core_format_or_the_model_dtype():
    assert KV_FORMAT_OF_FLAG["auto"] is None
    assert {f for f in KV_FORMAT_OF_FLAG.values() if f is not None} <= set(kv_formats.KV_FORMATS)
    assert [flag_format(flag) for flag in ("bf16", "bfloat16", "fp8_e4m3", "mxfp8")] == [
        "bf16", "bf16", "fp8_e4m3", "mxfp8"]
    with pytest.raises(ValueError, match=r"--kv-cache-dtype fp8_e5m2; allowed values: auto, bf16, bfloat16, "
                                         r"fp8_e4m3, mxfp8$"):
        flag_format("fp8_e5m2")


@pytest.mark.parametrize("flag, dtype, expected", [
    ("mxfp8", torch.float8_e4m3fn, "mxfp8"), ("fp8_e4m3", torch.float8_e4m3fn, "fp8_e4m3"),
    (None, torch.float8_e4m3fn, "fp8_e4m3"), ("auto", torch.bfloat16, "bf16"), ("auto", torch.float16, "fp16"),
    ("bf16", torch.bfloat16, "bf16"), (None, torch.float32, "fp32")])
def test_the_pool_format_of_a_resolved_dtype(flag, dtype, expected):
    assert pool_format(flag, dtype) == expected


def test_a_dtype_not_stored_here_is_refused_with_the_allowed_flags():
    assert dtype_format(torch.float8_e5m2) is None
    with pytest.raises(ValueError, match=r"cannot store a KV cache of dtype torch.float8_e5m2 \(--kv-cache-dtype "
                                         r"'fp8_e5m2'\); allowed --kv-cache-dtype values: auto, bf16, bfloat16, "
                                         r"fp8_e4m3, mxfp8$"):
        pool_format("fp8_e5m2", torch.float8_e5m2)
