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


def test_a_kv_format_is_a_type_that_says_what_it_is():
    F = kv_formats.KVFormat
    facts = {f: (f.storage_dtype, f.quantized, f.scale, f.block_size) for f in F}
    assert facts == {
        F.BF16: (torch.bfloat16, False, "none", None),
        F.FP16: (torch.float16, False, "none", None),
        F.FP32: (torch.float32, False, "none", None),
        F.FP8_E4M3: (torch.float8_e4m3fn, True, "per-tensor", None),
        F.MXFP8: (torch.float8_e4m3fn, True, "per-block", 32),
    }
    assert [f for f in F if f.block_scaled] == [F.MXFP8] and [f for f in F if f.tensor_scaled] == [F.FP8_E4M3]
    # bytes per token and layer: MXFP8 0.516x bf16 at head_dim 128 (one scale byte per 32 channels)
    assert F.MXFP8.bytes_per_token(1, 128) / F.BF16.bytes_per_token(1, 128) == 264 / 512


def test_a_kv_format_equals_and_hashes_as_its_name():
    """Hosts' flags, tests and logs name formats; a dict keyed by either finds the other."""
    F = kv_formats.KVFormat
    assert F.MXFP8 == "mxfp8" and f"{F.MXFP8}" == "mxfp8" and str(F.FP8_E4M3) == "fp8_e4m3"
    assert {"mxfp8": 1}[F.MXFP8] == 1 and kv_formats.STORAGE_DTYPE["bf16"] is torch.bfloat16
    assert kv_formats.as_kv_format("fp16") is F.FP16 and kv_formats.as_kv_format(F.FP16) is F.FP16


@pytest.mark.parametrize("bad", ["int4", "MXFP8", None, 8, torch.bfloat16])
def test_as_kv_format_refuses_anything_but_a_format_or_its_name(bad):
    with pytest.raises(ValueError, match=r"kv_format must be one of \('bf16', 'fp16', 'fp32', 'fp8_e4m3', 'mxfp8'\)"):
        kv_formats.as_kv_format(bad)


def test_the_package_compares_no_format_names():
    """Format names appear only where a format is defined or a host's flag is mapped onto one."""
    import re
    from pathlib import Path

    package = Path(kv_formats.__file__).resolve().parent
    compare = re.compile(r"""(==|!=|\bin)\s*\(?["'](mxfp8|fp8_e4m3|bf16|fp16|fp32)["']""")
    found = {str(p.relative_to(package)): [m.group(0) for m in compare.finditer(p.read_text(encoding="utf-8"))]
             for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    # kv_formats.py defines the names; settings.py's choices include the Inkling model's query formats
    found = {k: v for k, v in found.items() if v and k not in ("kv_formats.py", "settings.py")}
    assert not found, f"format names compared as strings: {found}"
    assert compare.search('if fmt == "mxfp8":') and compare.search("x in ('bf16', 'fp16')")  # the scan works
