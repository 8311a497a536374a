"""The MLX decode context from the core factory: worked examples (layers 0, 1, 4 windowed, 3 and 5 full, 2 without
attention: the pool-index maps, left padding and masks), the missing-map error, RoPE parameters from a full layer,
and the fused state routed to the full-attention pool buffer."""

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext  # noqa: E402
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec  # noqa: E402
from sglang_inkling_backend.mlx import context as mctx  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool  # noqa: E402
from sglang_inkling_backend.mlx.rope_scatter import RopeParams  # noqa: E402

WINDOWS = {0: 4, 1: 4, 3: None, 4: 4, 5: None}  # layer 2 has no attention


def _plan(**common):
    return LayerPlan.from_windows(WINDOWS, num_q_heads=4, num_kv_heads=2, head_dim=64, **common)


def _caches(plan, batch):
    return [[f"cache(layer={layer}, req={b})" for b in range(batch)] for layer in plan.attention_layer_ids]


def test_layer_maps_example():
    ctx = mctx.make_mlx_decode_context(_plan(), [3, 1], _caches(_plan(), 2))
    assert ctx.attention_pool_index_by_layer == {0: 0, 1: 1, 3: 2, 4: 3, 5: 4}
    assert ctx.full_kv_pool_index_by_layer == {3: 0, 5: 1}
    assert ctx.cache_for(3, 1) == "cache(layer=3, req=1)"


def test_decode_padding_examples_with_mlx_masks():
    plan = _plan()
    ctx = mctx.make_mlx_decode_context(plan, [5, 2, 9], _caches(plan, 3))
    pads, mask = ctx.decode_padding(None)
    assert pads == [4, 7, 0]
    assert isinstance(mask, mx.array) and mask.dtype == mx.bool_ and mask.shape == (3, 1, 1, 10)
    assert mask[:, 0, 0, :].sum(axis=1).tolist() == [6, 3, 10]
    pads, mask = ctx.decode_padding(4)
    assert pads == [0, 1, 0]
    assert mask[:, 0, 0, :].astype(mx.int32).tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert ctx.decode_padding(4) is ctx.decode_padding(4)  # memoised per window
    ctx2 = mctx.make_mlx_decode_context(plan, [7, 9], _caches(plan, 2))
    assert ctx2.decode_padding(4) == ([0, 0], None)
    assert mctx.positions(ctx).tolist() == [5, 2, 9]


def test_missing_full_map_error_with_the_fused_kernel_on():
    plan = _plan(rope_theta=10000.0)
    fused = mctx.MlxFusedRopeScatter(mctx.rope_params_from_plan(plan), MlxMXFP8KVPool(16, 2, 2, 64),
                                     mx.array([1], dtype=mx.int32))
    with pytest.raises(ValueError, match="BatchedDecodeContext requires full_kv_pool_index_by_layer when the "
                                         "fused AOT RoPE \\+ pool-scatter kernel is active"):
        BatchedDecodeContext([3], _caches(plan, 1), fused_rope_scatter=fused)
    # the factory fills the map from the plan, so the same state is accepted there
    ctx = mctx.make_mlx_decode_context(plan, [3], _caches(plan, 1), fused_rope_scatter=fused)
    assert ctx.fused_rope_scatter is fused


def test_rope_parameters_come_from_a_full_layer():
    # Gemma-like: sliding layers use base 10k, full layers 1M; the first attention layer is a sliding one
    specs = [LayerSpec(window=4 if w else None, num_q_heads=4, num_kv_heads=2, head_dim=64,
                       rope_theta=10_000.0 if w else 1_000_000.0) for w in (True, True, False, True, False)]
    plan = LayerPlan(specs)
    assert mctx.rope_params_from_plan(plan) == RopeParams(1_000_000.0, 64)
    with pytest.raises(ValueError, match="no rope_theta"):
        mctx.rope_params_from_plan(_plan())


def test_fused_state_writes_the_full_layers_pool_buffer_only():
    plan = _plan(rope_theta=10000.0)
    pool = MlxMXFP8KVPool(16, len(plan.full_layer_ids), 2, 64)
    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10)  # request row r, position p -> slot 10r + p
    seq_lens = [3, 0]
    slots = mctx.new_token_slots(req_to_token, [1, 0], seq_lens)
    assert slots.tolist() == [13, 0]
    fused = mctx.MlxFusedRopeScatter(mctx.rope_params_from_plan(plan), pool, mx.array([13, -1], dtype=mx.int32),
                                     implementation="mlx_ops")
    ctx = mctx.make_mlx_decode_context(plan, seq_lens, _caches(plan, 2), fused_rope_scatter=fused)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 64, generator=g).bfloat16() for h in (4, 2, 2))
    layer = 5  # the second full layer: pool buffer 1, though its cache index is 4
    q_rot, k_rot = ctx.fused_rope_scatter(from_torch(q), from_torch(k), from_torch(v), mctx.positions(ctx),
                                          ctx.full_kv_pool_index_by_layer[layer])
    kd, ks = mxfp8.quantize(to_torch(k_rot)[0])
    assert torch.equal(to_torch(pool.k_buffer[1])[13], kd.view(torch.uint8))
    assert torch.equal(to_torch(pool.k_scale_buffer[1])[13], ks)
    assert not mx.any(pool.k_buffer[0]).item()  # buffer 0 (layer 3) untouched
    assert not mx.any(pool.k_buffer[1][15]).item()  # slot -1 did not write the last row
    with pytest.raises(ValueError, match="no entry"):
        mctx.new_token_slots(req_to_token, [4], [0])
