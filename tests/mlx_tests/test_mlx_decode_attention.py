"""Decode attention over an MXFP8 pool, MLX-ops twin against the core oracle (reference.attention)."""

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.mlx.decode_attention import decode_attention_mxfp8  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

NUM_SLOTS, HQ, HKV, D = 256, 8, 2, 64
LENGTHS = [5, 1, 37]


def make_case(page_size, seed=0, q_dtype=torch.float32, rel_extent=None, sinks=False):
    g = torch.Generator().manual_seed(seed)
    layout = ScaleLayout.for_pool(NUM_SLOTS, HKV, D, page_size)
    k = torch.randn(NUM_SLOTS, HKV, D, generator=g) * 3
    v = torch.randn(NUM_SLOTS, HKV, D, generator=g)
    k_data, k_sc = mxfp8.quantize(k)
    v_data, v_sc = mxfp8.quantize(v)
    k_sf, v_sf = layout.empty(), layout.empty()
    all_slots = torch.arange(NUM_SLOTS)
    layout.scatter(k_sf, all_slots, k_sc)
    layout.scatter(v_sf, all_slots, v_sc)
    kv = PagedKV(k_data, v_data, k_sf, v_sf, layout)
    indices = (torch.randperm(NUM_SLOTS - 1, generator=g)[: sum(LENGTHS)] + 1).int()  # slot 0 is padding
    indptr = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int32)
    q = (torch.randn(len(LENGTHS), HQ, D, generator=g) * 2).to(q_dtype)
    extra = {}
    if rel_extent:
        extra["rel_bias"] = torch.randn(len(LENGTHS), HQ, rel_extent, generator=g)
    if sinks:
        extra["sinks"] = torch.randn(HQ, generator=g)
    return kv, q, indptr, indices, extra


def run_both(kv, q, indptr, indices, extra, page_size, **params):
    ref = paged_decode_attention(q, kv, indptr, indices, AttentionParams(**params, **extra))
    ours = decode_attention_mxfp8(
        from_torch(q), from_torch(kv.k_buffer), from_torch(kv.k_scales), from_torch(kv.v_buffer),
        from_torch(kv.v_scales), from_torch(indptr), from_torch(indices), page_size=page_size,
        softmax_scale=params["softmax_scale"], window=params.get("window"),
        logit_cap=params.get("logit_cap", 0.0),
        sinks=from_torch(extra["sinks"]) if "sinks" in extra else None,
        rel_bias=from_torch(extra["rel_bias"]) if "rel_bias" in extra else None,
        implementation="mlx_ops",
    )
    return ref, to_torch(ours)


@pytest.mark.parametrize("page_size", [1, 128])
@pytest.mark.parametrize("window", [None, 4, 1])
def test_twin_matches_reference_windows_and_gqa(page_size, window):
    kv, q, indptr, indices, extra = make_case(page_size)
    ref, ours = run_both(kv, q, indptr, indices, extra, page_size, softmax_scale=D ** -0.5, window=window)
    assert ours.shape == (3, HQ, D) and ours.dtype == torch.float32
    assert (ours - ref).abs().max().item() < 2e-5


def test_twin_matches_reference_inkling_mode_with_sinks_and_cap():
    kv, q, indptr, indices, extra = make_case(1, seed=3, q_dtype=torch.bfloat16, rel_extent=6, sinks=True)
    ref, ours = run_both(kv, q, indptr, indices, extra, 1, softmax_scale=1.0 / D, logit_cap=5.0, window=8)
    assert (ours - ref).abs().max().item() < 2e-5


def test_window_one_returns_the_new_tokens_value():
    kv, q, indptr, indices, extra = make_case(1, seed=5)
    _, ours = run_both(kv, q, indptr, indices, extra, 1, softmax_scale=0.1, window=1)
    last_slots = indices[indptr[1:].long() - 1].long()
    v_last = kv.read(last_slots)[1]  # [B, Hkv, D]
    assert torch.equal(ours, v_last.repeat_interleave(HQ // HKV, dim=1))


def test_bad_inputs_are_rejected_with_their_names():
    kv, q, indptr, indices, _ = make_case(1)
    args = [from_torch(q), from_torch(kv.k_buffer), from_torch(kv.k_scales), from_torch(kv.v_buffer),
            from_torch(kv.v_scales), from_torch(indptr), from_torch(indices)]
    with pytest.raises(ValueError, match="k_scales is required"):
        decode_attention_mxfp8(*args[:2], None, *args[3:], softmax_scale=1.0, implementation="mlx_ops")
    with pytest.raises(ValueError, match="k_scales must be uint8"):
        decode_attention_mxfp8(*args, softmax_scale=1.0, page_size=128, implementation="mlx_ops")
    bad_indices = from_torch(torch.full_like(indices, NUM_SLOTS))
    with pytest.raises(ValueError, match="kv_indices must be slots"):
        decode_attention_mxfp8(*args[:6], bad_indices, softmax_scale=1.0, implementation="mlx_ops")
    with pytest.raises(ValueError, match="kv_indptr"):
        decode_attention_mxfp8(*args[:5], from_torch(indptr[:-1]), args[6], softmax_scale=1.0,
                               implementation="mlx_ops")


def test_metal_implementation_raises_clearly_without_metal(caplog):
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    kv, q, indptr, indices, _ = make_case(1)
    with pytest.raises(RuntimeError, match="mx.metal.is_available"):
        decode_attention_mxfp8(from_torch(q), from_torch(kv.k_buffer), from_torch(kv.k_scales),
                               from_torch(kv.v_buffer), from_torch(kv.v_scales), from_torch(indptr),
                               from_torch(indices), softmax_scale=1.0, implementation="metal")
    assert any("Metal" in r.message for r in caplog.records)
