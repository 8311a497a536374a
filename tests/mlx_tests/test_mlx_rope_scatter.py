"""Fused RoPE + pool scatter on MLX (the MLX-ops twin): rotation, the slot rules, the MXFP8 bytes in the pool."""

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.kv_pool import InklingKVPool  # noqa: E402
from sglang_inkling_backend.layer_plan import LayerPlan  # noqa: E402
from sglang_inkling_backend.mlx import rope_scatter as rs  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool  # noqa: E402

HQ, HKV, D = 8, 2, 64
POSITIONS = [3, 0, 4095, 70000]


def rope_reference(x: torch.Tensor, positions, base: float) -> torch.Tensor:
    """Half-split rotation, theta = position * base^(-2i/D) in fp32 (the contract), cos/sin in float64."""
    d = x.shape[-1]
    inv = torch.tensor([base ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float32)
    theta = (torch.tensor(positions, dtype=torch.float32)[:, None] * inv).double()[:, None, :]
    x1, x2 = x.double()[..., : d // 2], x.double()[..., d // 2:]
    return torch.cat([x1 * theta.cos() - x2 * theta.sin(), x1 * theta.sin() + x2 * theta.cos()], dim=-1)


def inputs(dtype=torch.bfloat16, seed=0, tokens=len(POSITIONS)):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(tokens, HQ, D, generator=g) * 2).to(dtype)
    k = (torch.randn(tokens, HKV, D, generator=g) * 2).to(dtype)
    v = torch.randn(tokens, HKV, D, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2 ** -8), (torch.float32, 2e-6)])
def test_rotation_matches_reference(dtype, tol):
    q, k, _ = inputs(dtype)
    q_rot, k_rot = rs.rope_qk(from_torch(q), from_torch(k), mx.array(POSITIONS, dtype=mx.int32),
                              rs.RopeParams(10000.0, D), implementation="mlx_ops")
    for ours, x in ((q_rot, q), (k_rot, k)):
        ours = to_torch(ours)
        assert ours.dtype == dtype
        ref = rope_reference(x, POSITIONS, 10000.0)
        assert ((ours.double() - ref).abs() <= tol * ref.abs() + 1e-5).all()


def test_rotation_matches_mx_fast_rope():
    """SGLang's fallback is mx.fast.rope(traditional=False, base, scale=1, offset=positions)."""
    q, _, _ = inputs(torch.float32)
    q_mx = from_torch(q)
    positions = mx.array([3, 0, 17, 300], dtype=mx.int32)
    ours, _ = rs.rope_qk(q_mx, from_torch(q[:, :HKV]), positions, rs.RopeParams(10000.0, D),
                         implementation="mlx_ops")
    fast = mx.concatenate([  # one token at a time: older mlx takes only scalar offsets
        mx.fast.rope(q_mx[t:t + 1, :, None, :], D, traditional=False, base=10000.0, scale=1.0, offset=int(p))
        for t, p in enumerate(positions.tolist())])
    assert mx.abs(ours - fast[:, :, 0, :]).max().item() < 1e-4


def test_float_pool_scatter_writes_rotated_k_raw_v_and_skips_negative_slots():
    q, k, v = inputs(torch.bfloat16)
    pool_rows = 12
    k_pool = mx.full((pool_rows, HKV, D), 7.0, dtype=mx.bfloat16)
    v_pool = mx.full((pool_rows, HKV, D), 7.0, dtype=mx.bfloat16)
    slots = mx.array([5, -1, 2, 11], dtype=mx.int32)
    q_rot, k_rot, k_pool_out, v_pool_out = rs.rope_pool_fused(
        from_torch(q), from_torch(k), from_torch(v), mx.array(POSITIONS, dtype=mx.int32), slots, k_pool, v_pool,
        head_dim=D, num_qo_heads=HQ, num_kv_heads=HKV, rope_base=10000.0, implementation="mlx_ops")
    kp, vp = to_torch(k_pool_out), to_torch(v_pool_out)
    k_rot_t = to_torch(k_rot)
    for token, slot in ((0, 5), (2, 2), (3, 11)):
        assert torch.equal(kp[slot], k_rot_t[token])
        assert torch.equal(vp[slot], v[token])
    untouched = [s for s in range(pool_rows) if s not in (5, 2, 11)]
    assert (kp[untouched] == 7.0).all() and (vp[untouched] == 7.0).all()  # slot -1 did not write the last row
    assert k_pool_out is k_pool  # updated in place, as the upstream primitive's aliased outputs


def test_slot_out_of_range_raises_before_any_write():
    q, k, v = inputs(torch.float32)
    k_pool = mx.zeros((8, HKV, D))
    v_pool = mx.zeros((8, HKV, D))
    with pytest.raises(ValueError, match="slots must be < pool size 8"):
        rs.rope_pool_fused(from_torch(q), from_torch(k), from_torch(v), mx.array(POSITIONS, dtype=mx.int32),
                           mx.array([1, 2, 8, 3], dtype=mx.int32), k_pool, v_pool, head_dim=D, num_qo_heads=HQ,
                           num_kv_heads=HKV, rope_base=10000.0, implementation="mlx_ops")
    assert mx.all(k_pool == 0).item() and mx.all(v_pool == 0).item()


def test_bad_shapes_and_dtypes_name_the_argument():
    q, k, v = inputs(torch.float32)
    pos = mx.array(POSITIONS, dtype=mx.int32)
    rope = rs.RopeParams(10000.0, D)
    with pytest.raises(ValueError, match="positions must be int32"):
        rs.rope_qk(from_torch(q), from_torch(k), pos.astype(mx.int64), rope, implementation="mlx_ops")
    with pytest.raises(ValueError, match="^k must have shape"):
        rs.rope_qk(from_torch(q), from_torch(k[:2]), pos, rope, implementation="mlx_ops")
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        rs.rope_qk(from_torch(q), from_torch(k.bfloat16()), pos, rope, implementation="mlx_ops")
    with pytest.raises(ValueError, match="rope base"):
        rs.RopeParams(0.0, D)


@pytest.mark.parametrize("page_size,core_size", [(1, 15), (128, 128)])
def test_mxfp8_pool_bytes_equal_the_core_pool(page_size, core_size):
    """The MLX MXFP8 pool after the fused write holds exactly the bytes the core torch pool holds after
    set_kv_buffer(k_rot, v) at the same slots, data and scale tiers, in the same layout."""
    q, k, v = inputs(torch.bfloat16, seed=1)
    plan = LayerPlan.from_windows({0: None, 1: 4, 2: None}, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    core = InklingKVPool(plan, core_size, page_size, "mxfp8")
    num_slots = core_size + page_size
    pool = MlxMXFP8KVPool(num_slots, len(plan.full_layer_ids), HKV, D, page_size)
    slots = [9, -1, 3, num_slots - 1]
    layer = 2
    full_index = plan.full_kv_pool_index_by_layer[layer]  # 1: layer 2 is the second full layer
    q_rot, k_rot = rs.rope_scatter_mxfp8(from_torch(q), from_torch(k), from_torch(v),
                                         mx.array(POSITIONS, dtype=mx.int32), mx.array(slots, dtype=mx.int32),
                                         pool, full_index, rs.RopeParams(10000.0, D), implementation="mlx_ops")
    written = torch.tensor([i for i, s in enumerate(slots) if s >= 0])
    core.set_kv_buffer(layer, torch.tensor([s for s in slots if s >= 0]), to_torch(k_rot)[written], v[written])
    sfk, sfv = core.get_kv_scale_buffer(layer)
    assert torch.equal(to_torch(pool.k_buffer[full_index]), core.get_key_buffer(layer).view(torch.uint8))
    assert torch.equal(to_torch(pool.v_buffer[full_index]), core.get_value_buffer(layer).view(torch.uint8))
    assert torch.equal(to_torch(pool.k_scale_buffer[full_index]), sfk)
    assert torch.equal(to_torch(pool.v_scale_buffer[full_index]), sfv)
    # the other full layer's buffers were not touched
    assert not mx.any(pool.k_buffer[0]).item() and not mx.any(pool.k_scale_buffer[0]).item()
    # and reading back gives k_rot / v up to MXFP8 rounding
    k_back, v_back = pool.read_kv(full_index, mx.array([9], dtype=mx.int32))
    assert torch.allclose(to_torch(k_back)[0], to_torch(k_rot)[0].float(), rtol=2 ** -3, atol=1e-2)


def test_mxfp8_scatter_rejects_a_bad_pool_index_before_writing():
    q, k, v = inputs(torch.float32)
    pool = MlxMXFP8KVPool(16, 2, HKV, D)
    with pytest.raises(ValueError, match="full_kv_pool_index must be in"):
        rs.rope_scatter_mxfp8(from_torch(q), from_torch(k), from_torch(v), mx.array(POSITIONS, dtype=mx.int32),
                              mx.array([1, 2, 3, 4], dtype=mx.int32), pool, 2, rs.RopeParams(10000.0, D),
                              implementation="mlx_ops")
    assert not any(mx.any(b).item() for b in pool.k_buffer + pool.k_scale_buffer)


def test_metal_path_raises_clearly_without_metal():
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    q, k, _ = inputs(torch.float32)
    with pytest.raises(RuntimeError, match="Metal back-end"):
        rs.rope_qk(from_torch(q), from_torch(k), mx.array(POSITIONS, dtype=mx.int32), rs.RopeParams(1e4, D),
                   implementation="metal")


def test_auto_falls_back_to_the_twin_with_a_log_line(caplog):
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    from sglang_inkling_backend.mlx import metal_kernels

    metal_kernels._log_twin_fallback.cache_clear()  # the line is logged once per process and kernel
    q, k, _ = inputs(torch.float32)
    with caplog.at_level("WARNING"):
        rs.rope_qk(from_torch(q), from_torch(k), mx.array(POSITIONS, dtype=mx.int32), rs.RopeParams(1e4, D))
    assert any("running the MLX-ops twin" in r.message for r in caplog.records)
