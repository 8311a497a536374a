"""The K/V store's time on one GPU (2026-12-03 session, one H200): the Triton MXFP8 store, the same through
kv_views.store_kv_unchecked, the bf16 store, and a contiguous copy of strided K/V (a split of a fused qkv).
Run from the repository root: PYTHONPATH=$PWD python3 bench/results/history/2026-12-03-store-timing/store_time.py"""
import torch, time
from sglang_inkling_backend.attention_inputs import PagedKV
from sglang_inkling_backend.scale_layout import ScaleLayout
from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8
from sglang_inkling_backend import kv_views
N, H, D = 131072, 8, 128
slots_n = N + 128
dev = "cuda"
k = torch.randn(N, H * 3 * D // 1, device=dev, dtype=torch.bfloat16)[:, :H * D].reshape(N, H, D)  # strided like a qkv split
v = torch.randn(N, H, D, device=dev, dtype=torch.bfloat16)
layout = ScaleLayout.for_pool(slots_n, H, D, 128)
kv = PagedKV(torch.zeros(slots_n, H, D, dtype=torch.float8_e4m3fn, device=dev), torch.zeros(slots_n, H, D, dtype=torch.float8_e4m3fn, device=dev), layout.empty(dev), layout.empty(dev), layout)
kvb = PagedKV(torch.zeros(slots_n, H, D, dtype=torch.bfloat16, device=dev), torch.zeros(slots_n, H, D, dtype=torch.bfloat16, device=dev))
slots = torch.arange(128, N + 128, device=dev)
def t(fn, n=20):
    fn(); torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - s) / n * 1e3
print("mxfp8 store ms", t(lambda: store_kv_mxfp8(kv, slots, k, v)))
print("mxfp8 store via kv_views ms", t(lambda: kv_views.store_kv_unchecked(kv, slots, k, v, mxfp8_store=store_kv_mxfp8)))
print("bf16 store ms", t(lambda: kv_views.store_kv_unchecked(kvb, slots, k, v)))
print("contiguous copy ms", t(lambda: (k.contiguous(), v.contiguous())))
print("bytes bf16 K+V MB", 2 * N * H * D * 2 / 1e6)
