"""vLLM's block cache as this backend lays it out (host-free: no vLLM needed): the bytes land where SGLang's pool
puts them, every region stays inside the layer's pages, and shapes that do not fit are refused naming the
argument."""

import pytest
import torch

from sglang_inkling_backend import InklingKVPool, LayerPlan, kv_views, mxfp8
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, cell_bytes, vllm_layer_view

HKV, D, N = 2, 64, 128


def vllm_view(num_blocks: int, layout: BlockCacheLayout, dtype=torch.uint8, pad: int = 0) -> torch.Tensor:
    return vllm_layer_view(layout, num_blocks, dtype=dtype, pad=pad)


def test_cell_bytes_are_the_formats_bytes_per_head_and_token():
    assert cell_bytes("bf16", 128) == 512
    assert cell_bytes("fp8_e4m3", 128) == 256
    assert cell_bytes("mxfp8", 128) == 264  # 2 * (128 + 4): 0.516x bf16
    assert cell_bytes("mxfp8", 256) == 528  # what vLLM logged for Gemma-3-270M's cell (notes/vllm_cpu_probe.md)


def test_mxfp8_bytes_identical_to_the_sglang_pool_for_the_same_tokens():
    layout = BlockCacheLayout("mxfp8", HKV, D, N)
    blocks = 3
    cache = vllm_view(blocks, layout)
    kv = layout.paged_kv(cache)
    plan = LayerPlan.from_windows({0: None}, num_q_heads=4, num_kv_heads=HKV, head_dim=D)
    pool = InklingKVPool(plan, size=blocks * N - N, page_size=N, kv_format="mxfp8")  # + one page of padding slots
    g = torch.Generator().manual_seed(3)
    slots = torch.tensor([5, 127, 128, 200, 383])
    k = (torch.randn(5, HKV, D, generator=g) * 7).bfloat16()
    v = (torch.randn(5, HKV, D, generator=g) / 3).bfloat16()
    kv_views.store_kv_unchecked(kv, slots, k, v)
    pool.set_kv_buffer(0, slots, k, v)
    ours = [kv.k_buffer.view(torch.uint8), kv.v_buffer.view(torch.uint8), kv.k_scales, kv.v_scales]
    theirs = [pool.get_key_buffer(0).view(torch.uint8), pool.get_value_buffer(0).view(torch.uint8),
              *pool.get_kv_scale_buffer(0)]
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and torch.equal(a, b)
    # Where the bytes are in vLLM's buffer: K data of slot 200 (block 1, offset 72) at 200 * HKV * D.
    raw = torch.as_strided(cache, (blocks * layout.page_bytes,), (1,))
    kd, ks = mxfp8.quantize(k)
    assert torch.equal(raw[200 * HKV * D: 201 * HKV * D], kd[3].reshape(-1).view(torch.uint8))
    written = int((raw != 0).sum())
    assert written == int((kd.view(torch.uint8) != 0).sum() + (mxfp8.quantize(v)[0].view(torch.uint8) != 0).sum()
                          + (ks != 0).sum() + (mxfp8.quantize(v)[1] != 0).sum())


@pytest.mark.parametrize("kv_format,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                             ("fp8_e4m3", torch.uint8)])
def test_float_and_fp8_regions_round_trip(kv_format, dtype):
    layout = BlockCacheLayout(kv_format, HKV, D, 16)
    cache = vllm_view(4, layout, dtype=dtype)
    kv = layout.paged_kv(cache, k_scale=0.5, v_scale=2.0)
    assert kv.num_slots == 64 and kv.num_kv_heads == HKV and kv.head_dim == D
    g = torch.Generator().manual_seed(4)
    k = torch.randn(3, HKV, D, generator=g).bfloat16()
    v = torch.randn(3, HKV, D, generator=g).bfloat16()
    slots = torch.tensor([0, 17, 63])
    kv_views.store_kv_unchecked(kv, slots, k, v)
    rk, rv = kv.read(slots)
    if kv_format == "fp8_e4m3":
        assert torch.equal(rk, mxfp8.quantize_per_tensor(k, 0.5).float() * 0.5)
        assert torch.equal(rv, mxfp8.quantize_per_tensor(v, 2.0).float() * 2.0)
    else:
        assert torch.equal(rk, k.float()) and torch.equal(rv, v.float())


def test_padded_pages_keep_every_region_inside_the_layer():
    layout = BlockCacheLayout("mxfp8", HKV, D, N)
    cache = vllm_view(2, layout, pad=256)
    kv = layout.paged_kv(cache)
    start = cache.data_ptr()
    end = start + cache.stride(0) + layout.page_bytes  # the last block's page ends here
    for t in (kv.k_buffer, kv.v_buffer, kv.k_scales, kv.v_scales):
        assert start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= end


def test_bad_layouts_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="block_size 128"):
        BlockCacheLayout("mxfp8", HKV, D, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        BlockCacheLayout("mxfp8", HKV, 48, N)
    with pytest.raises(ValueError, match="kv_format must be one of"):
        BlockCacheLayout("fp8_e5m2", HKV, D, N)
    layout = BlockCacheLayout("mxfp8", HKV, D, N)
    with pytest.raises(ValueError, match="needs 33792"):
        layout.paged_kv(vllm_view(2, BlockCacheLayout("bf16", HKV, D, N)))  # a bf16 page is not an MXFP8 page
    with pytest.raises(ValueError, match="4-D per-layer view"):
        layout.paged_kv(torch.zeros(10, dtype=torch.uint8))
    view = vllm_view(2, layout)
    lbnhc = view.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # token-major inside the block
    with pytest.raises(ValueError, match="one dense page"):
        layout.paged_kv(lbnhc)


@pytest.mark.parametrize("every", [2, 3])
def test_a_view_of_every_other_block_of_a_larger_buffer_is_refused(every):
    """The layout writes the layer's whole region (K, V and scales across its blocks): a view that skips blocks
    would have its store write the bytes of the blocks it skips, which are not the layer's."""
    layout = BlockCacheLayout("bf16", HKV, D, 16)
    larger = vllm_view(2 * every, layout)
    view = larger[::every]
    with pytest.raises(ValueError, match=rf"kv_cache's block stride is {every * layout.page_bytes} bytes, two pages"):
        layout.paged_kv(view)
    layout.paged_kv(vllm_view(2, layout, pad=layout.page_bytes - 1))  # padding under a page: the layer's own


def test_a_layers_pagedkv_is_made_once_per_view_and_again_for_another():
    """vLLM hands a layer the same kv_cache view every step: LayerAttention builds (and checks) its PagedKV once.
    Another view, even of the same buffer (every other block: refused), or another per-tensor scale, is built and
    checked again."""
    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    from sglang_inkling_backend.layer_plan import LayerSpec

    attention = LayerAttention(LayerSpec(num_q_heads=4, num_kv_heads=HKV, head_dim=D), "fp8_e4m3", torch.bfloat16)
    layout = BlockCacheLayout("fp8_e4m3", HKV, D, 16)
    larger = vllm_view(4, layout)
    view = larger[:2]
    first = attention.paged_kv(view)
    assert attention.paged_kv(view) is first and attention.paged_kv(larger[:2]) is first  # an equal view, too
    with pytest.raises(ValueError, match="block stride"):
        attention.paged_kv(larger[::2])
    other = attention.paged_kv(larger[2:])  # the other half of the buffer: its own PagedKV
    assert other is not first and other.k_buffer.data_ptr() != first.k_buffer.data_ptr()
    attention.bind_fp8_scales(0.5, 0.25)  # the checkpoint's scales, bound after loading
    scaled = attention.paged_kv(larger[2:])
    assert scaled is not other and (scaled.k_scale, scaled.v_scale) == (0.5, 0.25)
