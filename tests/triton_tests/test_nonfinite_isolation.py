"""One bad value never poisons another token: a NaN or inf in the V of a key changes only the output rows that
keep that key (its own and later positions, within the window; in a verify tree, the drafts that see it), in the torch route and the Triton extend kernel, for
bf16, per-tensor fp8 and MXFP8 pools. Rows that do not keep the key give the clean run's bytes; rows that keep it
give a non-finite value in the channel that holds it (NaN for NaN, inf for +inf) and the clean values elsewhere.
Before, a 0 weight times the NaN reached every row of the key's tile: one NaN in token 15 of a 20-token prefill
made all 20 rows NaN.

Under the Triton interpreter the kernels read 8-bit pools as bytes (``INKLING_E4M3_BY_INTEGERS=1``): the
interpreter's own e4m3 -> float32 cast reads the NaN byte 0x7F as 480 (checked below), where a GPU's conversion,
and the byte decoder, give NaN."""
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention as torch_decode  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_extend_attention as torch_extend  # noqa: E402
from sglang_inkling_backend.triton.decode_attention import paged_decode_attention as triton_decode  # noqa: E402
from sglang_inkling_backend.triton.extend_attention import paged_extend_attention as triton_extend  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the extend tests' pool builder
from test_triton_extend import DEV, make_pool  # noqa: E402

HQ, HKV, D, TOKENS, BAD = 4, 2, 32, 20, 15  # the bad key: position 15 of a 20-token prefill, KV head 0, channel 3
E4M3_NAN = 0x7F


def pool(fmt):
    """A 128-slot pool (an MXFP8 pool's one page) of the format, random K/V: the extend tests' builder."""
    return make_pool(fmt, HKV, D, 128, torch.Generator().manual_seed(5))


def poison(kv: PagedKV, value: str) -> PagedKV:
    v = kv.v_buffer.clone()
    if v.dtype == torch.float8_e4m3fn:  # e4m3 has NaN and no inf: its NaN byte
        v.view(torch.uint8)[BAD, 0, 3] = E4M3_NAN
    else:
        v[BAD, 0, 3] = float(value)
    return PagedKV(kv.k_buffer, v, kv.k_scales, kv.v_scales, kv.layout, kv.k_scale, kv.v_scale)


ROUTES = {"torch": torch_extend, "triton": lambda *a, **k: triton_extend(*a, block_rows=16, block_n=16, **k)}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("fmt, value", [("bf16", "nan"), ("bf16", "inf"), ("fp8", "nan"), ("mxfp8", "nan")])
@pytest.mark.parametrize("window", [None, 4])
def test_a_non_finite_v_changes_only_the_rows_that_keep_its_key(route, fmt, value, window, monkeypatch):
    if route == "triton" and fmt != "bf16" and os.environ.get("TRITON_INTERPRET") == "1":
        monkeypatch.setenv("INKLING_E4M3_BY_INTEGERS", "1")
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(TOKENS, HQ, D, generator=gen).to(DEV)
    params = AttentionParams(D ** -0.5, window=window)
    qo = torch.tensor([0, TOKENS], dtype=torch.int32, device=DEV)
    indices = torch.arange(TOKENS, dtype=torch.int32, device=DEV)
    run = lambda kv: ROUTES[route](q, kv, qo, indices, qo, params).float()  # noqa: E731
    clean_kv = pool(fmt)
    clean, bad = run(clean_kv), run(poison(clean_kv, value))
    pos = torch.arange(TOKENS, device=DEV)
    keeps = (pos >= BAD) & ((pos - BAD <= window - 1) if window is not None else True)
    assert torch.equal(bad[~keeps], clean[~keeps])  # the clean run's bytes: nothing reached them
    hit = bad[keeps][:, : HQ // HKV, 3]  # the query heads of KV head 0, the bad channel
    expect = float("inf") if value == "inf" else float("nan")
    assert torch.equal(torch.isnan(hit), torch.full_like(hit, expect != expect, dtype=torch.bool))
    if value == "inf":
        assert bool((hit == float("inf")).all())
    rest = bad[keeps].clone()
    rest[:, : HQ // HKV, 3] = 0.0
    other = clean[keeps].clone()
    other[:, : HQ // HKV, 3] = 0.0
    torch.testing.assert_close(rest, other, rtol=0, atol=0)  # every other value of those rows as clean
    assert int(keeps.sum()) == (TOKENS - BAD if window is None else window)  # the classes are not empty


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])
def test_a_non_finite_draft_v_reaches_only_the_drafts_that_see_it(route, fmt, monkeypatch):
    """A verify step: 16 cached keys, then a tree of 4 drafts (0 the root; 1 and 2 its children, siblings; 3 the
    child of 1). A NaN in draft 1's V reaches drafts 1 and 3, not draft 0 nor its sibling 2."""
    if route == "triton" and fmt != "bf16" and os.environ.get("TRITON_INTERPRET") == "1":
        monkeypatch.setenv("INKLING_E4M3_BY_INTEGERS", "1")
    prefix, sees = 16, [[0], [0, 1], [0, 2], [0, 1, 3]]
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i, row in enumerate(sees):
        mask[i, row] = True
    verify = SpecVerify(mask.flatten().to(DEV), torch.tensor([0, 16], device=DEV), torch.tensor([0, 1, 1, 2],
                                                                                              device=DEV))
    q = torch.randn(4, HQ, D, generator=torch.Generator().manual_seed(8)).to(DEV)
    params = AttentionParams(D ** -0.5)
    qo = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, prefix + 4], dtype=torch.int32, device=DEV)
    indices = torch.arange(prefix + 4, dtype=torch.int32, device=DEV)
    run = lambda kv: ROUTES[route](q, kv, indptr, indices, qo, params, verify=verify).float()  # noqa: E731
    clean_kv = pool(fmt)
    v = clean_kv.v_buffer.clone()
    if v.dtype == torch.float8_e4m3fn:
        v.view(torch.uint8)[prefix + 1, 0, 3] = E4M3_NAN
    else:
        v[prefix + 1, 0, 3] = float("nan")
    clean = run(clean_kv)
    bad = run(PagedKV(clean_kv.k_buffer, v, clean_kv.k_scales, clean_kv.v_scales, clean_kv.layout))
    assert torch.equal(bad[[0, 2]], clean[[0, 2]])  # the root and the sibling: the clean bytes
    assert bool(torch.isnan(bad[[1, 3]][:, : HQ // HKV, 3]).all())  # the draft and its child


DECODES = {"torch": torch_decode, "triton": triton_decode}


@pytest.mark.parametrize("route", sorted(DECODES))
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp8"])
@pytest.mark.parametrize("window", [None, 4])
def test_a_decode_past_the_window_of_a_non_finite_v_gives_the_clean_bytes(route, fmt, window, monkeypatch):
    """The decode query at position 19 keeps key 15 without a window and not with 4 visible keys."""
    if route == "triton" and fmt != "bf16" and os.environ.get("TRITON_INTERPRET") == "1":
        monkeypatch.setenv("INKLING_E4M3_BY_INTEGERS", "1")
    q = torch.randn(1, HQ, D, generator=torch.Generator().manual_seed(7)).to(DEV)
    params = AttentionParams(D ** -0.5, window=window)
    indptr = torch.tensor([0, TOKENS], dtype=torch.int32, device=DEV)
    indices = torch.arange(TOKENS, dtype=torch.int32, device=DEV)
    run = lambda kv: DECODES[route](q, kv, indptr, indices, params).float()  # noqa: E731
    clean_kv = pool(fmt)
    clean, bad = run(clean_kv), run(poison(clean_kv, "nan"))
    if window is None:
        assert bool(torch.isnan(bad[0, : HQ // HKV, 3]).all())
        bad[0, : HQ // HKV, 3] = clean[0, : HQ // HKV, 3]
    assert torch.equal(bad, clean)


def test_why_the_interpreter_reads_8_bit_pools_as_bytes_here():
    """The interpreter's e4m3 cast loses NaN (a GPU's does not): the reason for INKLING_E4M3_BY_INTEGERS above.
    If a Triton release fixes it, this fails and the byte path above can go."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter's cast only: a GPU converts e4m3 natively")
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, o_ptr):
        tl.store(o_ptr + tl.arange(0, 2), tl.load(x_ptr + tl.arange(0, 2)).to(tl.float32))

    out = torch.empty(2)
    cast[(1,)](torch.tensor([E4M3_NAN, 0x38], dtype=torch.uint8).view(torch.float8_e4m3fn), out)
    assert out.tolist() == [480.0, 1.0]
