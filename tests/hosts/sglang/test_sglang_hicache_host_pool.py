"""What SGLang 0.5.23's hierarchical cache would do with this backend's MXFP8 pool, on the CPU (issue #35; the
transfers themselves are CUDA kernels, so the round trip here is SGLang's row layout done with torch indexing):
SGLang picks its MXFP8 host pool (``MHATokenToKVPoolMXFP8Host``) from the pool's own description, and a page
moved the way that host pool moves it (K/V payload per slot, each layer's scales as one row of bytes per page)
reads back bit for bit in another page. The same with SGLang's CUDA transfer kernels, and documents reloaded through
the real server: ``gpu_tests/sglang/check_hicache_pages_gpu.py``, bench/results/current/sglang-h200/spec-hicache/."""
from __future__ import annotations

import pytest
import torch

from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

prepare_sglang_cpu_import()
pytest.importorskip("sglang")

from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost, get_mha_host_pool_cls  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402

from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class  # noqa: E402

HKV, D, PAGE, LAYERS = 2, 64, 128, 2


def mxfp8_pool():
    return inkling_pool_class("mxfp8")(4 * PAGE, PAGE, torch.float8_e4m3fn, HKV, D, LAYERS, "cpu", False)


def test_sglang_picks_its_mxfp8_host_pool_for_this_pool():
    info = mxfp8_pool().get_device_pool_infos()[0].buffer_info
    assert get_mha_host_pool_cls(info) is MHATokenToKVPoolMXFP8Host
    # 16-bit and per-tensor fp8 pages are plain bytes: SGLang's MHA host pool, the pool's own dtype
    for fmt, dtype in (("bf16", torch.bfloat16), ("fp8_e4m3", torch.float8_e4m3fn)):
        other = inkling_pool_class(fmt)(4 * PAGE, 1, dtype, HKV, D, LAYERS, "cpu", False).get_device_pool_infos()
        assert get_mha_host_pool_cls(other[0].buffer_info) is MHATokenToKVPoolHost
        assert other[0].buffer_info.scales is None


def test_a_page_moved_as_the_mxfp8_host_pool_moves_it_reads_back_bit_for_bit():
    pool = mxfp8_pool()
    info = pool.get_device_pool_infos()[0].buffer_info
    g = torch.Generator().manual_seed(3)
    src_page, dst_page = 2, 3
    slots = torch.arange(src_page * PAGE, (src_page + 1) * PAGE)
    for layer_id in range(LAYERS):
        layer = RadixAttention(HKV * 2, D, D ** -0.5, HKV, layer_id=layer_id)
        scale = torch.logspace(-3, 3, PAGE).view(PAGE, 1, 1)  # every page row holds many different exponents
        k = (torch.randn(PAGE, HKV, D, generator=g) * scale).bfloat16()
        v = (torch.randn(PAGE, HKV, D, generator=g) * scale).bfloat16()
        pool.set_kv_buffer(layer, slots, k, v)
    before = [pool.core.read_kv(i, slots) for i in range(LAYERS)]
    # the host pool's device views (mha_mxfp8.py): payload rows per slot, scale bytes as [page, bytes] rows
    for layer_id in range(LAYERS):
        for kind in ("k", "v"):
            data = getattr(info.buffers, kind)[layer_id]
            data[dst_page * PAGE:(dst_page + 1) * PAGE].copy_(data[src_page * PAGE:(src_page + 1) * PAGE].clone())
            scales = getattr(info.scales, kind)[layer_id]
            rows = scales.view(torch.uint8).reshape(scales.shape[0], -1)
            rows[dst_page].copy_(rows[src_page].clone())
    moved = torch.arange(dst_page * PAGE, (dst_page + 1) * PAGE)
    for layer_id in range(LAYERS):
        got = pool.core.read_kv(layer_id, moved)
        for a, b in zip(got, before[layer_id]):
            assert torch.equal(a, b)
    # the same move with the scale rows left behind reads other values: the scales travel with the page
    other = torch.arange(1 * PAGE, 2 * PAGE)
    for kind in ("k", "v"):
        data = getattr(info.buffers, kind)[0]
        data[1 * PAGE:2 * PAGE].copy_(data[src_page * PAGE:(src_page + 1) * PAGE].clone())
    assert not torch.equal(pool.core.read_kv(0, other)[0], before[0][0])


def test_both_leaves_of_a_hybrid_sliding_window_pool_get_the_mxfp8_host_pool():
    """A hybrid sliding-window model's pool (SGLang's SWAKVPool over this backend's MXFP8 pools): SGLang builds one
    host pool per leaf (hybrid_pool_assembler.build_hybrid_swa_group; its shared page envelope is for its own
    UnifiedMHATokenToKVPool only), and each leaf's description picks the MXFP8 host pool, scales included."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = SWAKVPool(size=4 * PAGE, size_swa=2 * PAGE, page_size=PAGE, dtype=torch.float8_e4m3fn, head_num=HKV,
                     head_dim=D, swa_attention_layer_ids=[0, 1], full_attention_layer_ids=[2], device="cpu",
                     token_to_kv_pool_class=inkling_pool_class("mxfp8"), enable_kv_cache_copy=False)
    for leaf, layers in ((pool.full_kv_pool, 1), (pool.swa_kv_pool, 2)):
        info = leaf.get_device_pool_infos()[0].buffer_info
        assert get_mha_host_pool_cls(info) is MHATokenToKVPoolMXFP8Host
        assert len(info.scales.k) == len(info.scales.v) == layers
