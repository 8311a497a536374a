"""The core's KV formats (``kv_formats.py``): their storage dtypes and what one token costs in each."""

import pytest
import torch

from sglang_inkling_backend import kv_formats, mxfp8


def test_bytes_per_token_per_layer():
    # 2 * Hkv * (D + D/32) against 2 * Hkv * 2D: Inkling per rank (2 KV heads, D 128) and Gemma-3-270M (1, 256)
    assert kv_formats.bytes_per_token_per_layer(2, 128, "mxfp8") == 2 * 2 * (128 + 4) == 528
    assert kv_formats.bytes_per_token_per_layer(2, 128, "bf16") == 1024
    assert kv_formats.bytes_per_token_per_layer(1, 256, "mxfp8") == 528
    assert kv_formats.bytes_per_token_per_layer(1, 256, "fp8_e4m3") == 512
    assert kv_formats.bytes_per_token_per_layer(1, 64, "fp32") == 512
    with pytest.raises(ValueError, match="kv_format must be one of"):
        kv_formats.bytes_per_token_per_layer(1, 128, "int4")


def test_every_format_has_a_storage_dtype_and_the_unquantized_ones_are_named_by_it():
    assert set(kv_formats.STORAGE_DTYPE) == set(kv_formats.KV_FORMATS)
    assert set(kv_formats.QUANTIZED_KV_FORMATS) < set(kv_formats.KV_FORMATS)
    assert all(kv_formats.STORAGE_DTYPE[f] == mxfp8.DATA_DTYPE for f in kv_formats.QUANTIZED_KV_FORMATS)
    assert kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE == {torch.bfloat16: "bf16", torch.float16: "fp16",
                                                      torch.float32: "fp32"}


def test_require_kv_format_names_the_argument():
    assert kv_formats.require_kv_format("mxfp8") == "mxfp8"
    with pytest.raises(ValueError, match=r"pool_format must be one of \('bf16', .*got 'fp4'"):
        kv_formats.require_kv_format("fp4", "pool_format")
