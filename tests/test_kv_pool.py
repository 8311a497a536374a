"""The pool: byte-exact writes and reads, scale tiers through moves and the host tier, capacity, and errors
that leave the buffers untouched."""

import pytest
import torch

from sglang_inkling_backend import HostKVTier, InklingKVPool, LayerPlan, mxfp8, tokens_that_fit
from sglang_inkling_backend.kv_pool import bytes_per_token

PLAN = LayerPlan.from_windows({0: 4, 1: None, 3: None}, num_layers=4, num_q_heads=4, num_kv_heads=2, head_dim=128)


def _pool(kv_format="mxfp8", **kw):
    return InklingKVPool(PLAN, size=256, page_size=128, kv_format=kv_format, **kw)


def _snapshot(pool):
    return [t.clone() for layer in pool.layers.values() for t in layer.tensors()]


def test_shapes_and_zeroed_scales():
    pool = _pool()
    k = pool.get_key_buffer(1)
    sfk, sfv = pool.get_kv_scale_buffer(1)
    assert k.shape == (384, 2, 128) and k.dtype == torch.float8_e4m3fn
    assert sfk.shape == (3, 2, 32, 4, 4) and sfk.dtype == torch.uint8 and int(sfk.sum()) == 0
    assert pool.get_kv_scale_buffer(1)[0].view(torch.float8_e8m0fnu).dtype == torch.float8_e8m0fnu
    flat = InklingKVPool(PLAN, size=64, page_size=16, kv_format="mxfp8")
    assert flat.get_kv_scale_buffer(0)[0].shape == (80, 2, 4)
    with pytest.raises(ValueError, match="layer 2 has no KV in this pool"):
        pool.get_key_buffer(2)
    with pytest.raises(ValueError, match="get_kv_scale_buffer needs kv_format='mxfp8'"):
        _pool("bf16").get_kv_scale_buffer(1)


def test_mxfp8_write_is_byte_exact_at_the_layout_positions():
    pool = _pool()
    g = torch.Generator().manual_seed(1)
    loc = torch.tensor([1, 127, 128, 255, 300])
    k = torch.randn(5, 2, 128, generator=g).bfloat16()
    v = (torch.randn(5, 2, 128, generator=g) * 100).bfloat16()
    pool.set_kv_buffer(SimpleLayer(3), loc, k, v)
    kd, ks = mxfp8.quantize(k)
    vd, vs = mxfp8.quantize(v)
    assert torch.equal(pool.get_key_buffer(3)[loc].view(torch.uint8), kd.view(torch.uint8))
    assert torch.equal(pool.get_value_buffer(3)[loc].view(torch.uint8), vd.view(torch.uint8))
    sfk, sfv = pool.get_kv_scale_buffer(3)
    # slot 300: page 2, po 44 -> sf[2, h, 12, 1, b]
    assert sfk[2, :, 12, 1, :].tolist() == ks[4].tolist()
    assert sfv[0, :, 1, 0, :].tolist() == vs[0].tolist()  # slot 1: page 0, po 1
    assert int((sfk != 0).sum()) == ks.numel()  # nothing else was written
    k_read, _ = pool.read_kv(3, loc)
    assert torch.equal(k_read, mxfp8.dequantize(kd, ks, torch.float32))


class SimpleLayer:
    def __init__(self, layer_id):
        self.layer_id = layer_id


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3"])
def test_bf16_and_fp8_writes(kv_format):
    pool = _pool(kv_format, k_scale=2.0, v_scale=0.5)
    k = torch.randn(3, 2, 128).bfloat16()
    v = torch.randn(3, 2, 128).bfloat16()
    loc = torch.tensor([5, 6, 7])
    pool.set_kv_buffer(0, loc, k, v.reshape(3, 256))
    if kv_format == "bf16":
        assert torch.equal(pool.get_key_buffer(0)[loc], k)
        assert torch.equal(pool.get_value_buffer(0)[loc], v)
    else:
        assert torch.equal(pool.get_key_buffer(0)[loc].view(torch.uint8),
                           (k.float() / 2.0).to(torch.float8_e4m3fn).view(torch.uint8))
        k_read, v_read = pool.read_kv(0, loc)
        assert torch.equal(k_read, (k.float() / 2.0).to(torch.float8_e4m3fn).float() * 2.0)
        assert torch.equal(v_read, (v.float() / 0.5).to(torch.float8_e4m3fn).float() * 0.5)


def test_set_kv_buffer_errors_leave_buffers_untouched():
    pool = _pool()
    before = _snapshot(pool)
    k = torch.randn(2, 2, 128)
    with pytest.raises(ValueError, match=r"loc must be slots in \[0, 384\) for layer 1, got \[5, 384\]"):
        pool.set_kv_buffer(1, torch.tensor([5, 384]), k, k)
    with pytest.raises(ValueError, match=r"cache_v must hold \[2, Hkv=2, D=128\] values"):
        pool.set_kv_buffer(1, torch.tensor([5, 6]), k, torch.randn(2, 2, 64))
    with pytest.raises(TypeError, match="loc must be int32 or int64 slot ids, got torch.float32"):
        pool.set_kv_buffer(1, torch.tensor([5.0, 6.0]), k, k)
    with pytest.raises(TypeError, match="cache_k must be a bf16/fp16/fp32 tensor"):
        pool.set_kv_buffer(1, torch.tensor([5, 6]), k.to(torch.int32), k)
    with pytest.raises(TypeError, match="layer must be an int layer id"):
        pool.set_kv_buffer("1", torch.tensor([5, 6]), k, k)
    after = _snapshot(pool)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_pool_construction_errors():
    with pytest.raises(ValueError, match="kv_format must be one of"):
        InklingKVPool(PLAN, 256, 128, kv_format="int8")
    with pytest.raises(ValueError, match="multiples of page_size=128 for mxfp8"):
        InklingKVPool(PLAN, 200, 128, kv_format="mxfp8")
    odd = LayerPlan.from_windows({0: None}, head_dim=80)
    with pytest.raises(ValueError, match=r"layer 0's head_dim must be a multiple of 32 for MXFP8 .*got 80"):
        InklingKVPool(odd, 256, 128, kv_format="mxfp8")
    with pytest.raises(TypeError, match="plan must be a LayerPlan"):
        InklingKVPool({0: None}, 256, 128)


def test_swa_sub_pool_is_smaller():
    pool = _pool(swa_size=128)
    assert pool.get_key_buffer(0).shape[0] == 256 and pool.get_key_buffer(1).shape[0] == 384


def test_move_kv_cache_carries_scales():
    pool = _pool()
    src, dst = torch.tensor([10, 140]), torch.tensor([250, 3])
    pool.set_kv_buffer(1, src, torch.randn(2, 2, 128) * 7, torch.randn(2, 2, 128))
    pool.move_kv_cache(dst, src)
    layout = pool.scale_layout(1)
    sfk, sfv = pool.get_kv_scale_buffer(1)
    assert torch.equal(layout.gather(sfk, dst), layout.gather(sfk, src))
    assert torch.equal(pool.get_key_buffer(1)[dst].view(torch.uint8), pool.get_key_buffer(1)[src].view(torch.uint8))


def test_host_tier_round_trip_is_byte_exact():
    pool = _pool()
    g = torch.Generator().manual_seed(2)
    loc = torch.arange(128, 256)  # page 1, every slot
    for layer in (0, 1, 3):
        pool.set_kv_buffer(layer, loc, torch.randn(128, 2, 128, generator=g) * 30,
                           torch.randn(128, 2, 128, generator=g))
    before = _snapshot(pool)
    tier = HostKVTier(pool, num_pages=4)
    tier.backup(torch.tensor([1]), torch.tensor([2]))
    for t in (t for layer in pool.layers.values() for t in layer.tensors()):
        t.zero_()
    tier.restore(torch.tensor([2]), torch.tensor([1]))
    after = _snapshot(pool)
    for a, b in zip(before, after):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    # the scale atom of page 1 really carried non-zero bytes
    assert int((pool.get_kv_scale_buffer(1)[0][1] != 0).sum()) == 2 * 128 * 4
    with pytest.raises(ValueError, match=r"host_pages must be pages in \[0, 4\)"):
        tier.backup(torch.tensor([1]), torch.tensor([4]))
    with pytest.raises(ValueError, match=r"device_pages must be pages in \[0, 3\)"):
        tier.restore(torch.tensor([0]), torch.tensor([3]))


def test_bytes_and_capacity_bf16_vs_mxfp8():
    # 3 attention layers x 2 KV heads x D 128: bf16 3 * 1024 B/token, MXFP8 3 * 528
    assert bytes_per_token(PLAN, "bf16") == 3072 and bytes_per_token(PLAN, "mxfp8") == 1584
    budget = 1 << 30
    assert tokens_that_fit(budget, PLAN, "bf16") == budget // 3072 == 349525
    assert tokens_that_fit(budget, PLAN, "mxfp8") == budget // 1584 == 677867
    pool = _pool()
    data = 3 * 2 * 384 * 2 * 128
    scales = 3 * 2 * 384 * 2 * 4
    assert pool.num_bytes() == data + scales


def test_mxfp8_writes_go_through_a_routes_fused_store_after_the_checks():
    """``fused_store`` (the host sets its route's kernel): called with the layer's PagedKV and the checked slots,
    never for a write the checks refuse."""
    pool = _pool()
    calls = []

    def fused(kv, loc, k, v, validate=True):
        calls.append((kv.k_buffer.data_ptr(), kv.k_scales.data_ptr(), loc.tolist(), validate))
        kd, ks = mxfp8.quantize(k)
        kv.k_buffer[loc] = kd

    pool.fused_store = fused
    k = torch.randn(2, 2, 128).bfloat16()
    pool.set_kv_buffer(SimpleLayer(1), torch.tensor([5, 9]), k, k)
    assert calls == [(pool.get_key_buffer(1).data_ptr(), pool.get_kv_scale_buffer(1)[0].data_ptr(), [5, 9], False)]
    assert torch.equal(pool.get_key_buffer(1)[5].view(torch.uint8), mxfp8.quantize(k)[0][0].view(torch.uint8))
    with pytest.raises(ValueError, match="loc must be slots"):
        pool.set_kv_buffer(SimpleLayer(1), torch.tensor([5, 9999]), k, k)
    assert len(calls) == 1


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "fp8_e4m3", "mxfp8"])
def test_kv_that_require_grad_store_the_same_bytes_and_leave_the_pool_out_of_autograd(fmt):
    """A caller's K/V that require grad: the pool's buffers never join its autograd graph (an indexed write of a
    value that requires grad would make the buffer require grad) and hold the bytes of the same K/V without grad."""
    from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec

    def stored(requires_grad):
        p = InklingKVPool(LayerPlan([LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=32)]), size=256,
                          page_size=128 if fmt == "mxfp8" else 1, kv_format=fmt)
        k = torch.randn(3, 2, 32, generator=torch.Generator().manual_seed(5))
        v = 2 * k
        if requires_grad:
            k, v = k.requires_grad_(), v.requires_grad_()
        p.set_kv_buffer(0, torch.tensor([130, 131, 132]), k, v)
        return p.layers[0].tensors()

    with_grad, without = stored(True), stored(False)
    assert all(not t.requires_grad and t.grad_fn is None for t in with_grad)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(with_grad, without))
