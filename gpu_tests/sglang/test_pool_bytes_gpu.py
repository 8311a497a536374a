"""GPU only (3 passed on the H200: bench/results/current/sglang-h200/pool_bytes.log): for the same bf16 K/V rows,
SGLang 0.5.23's own MXFP8 pool writer and ours produce
identical fp8 bytes and UE8M0 scale bytes, so pages one writes the other reads.

SGLang's writer is ``quant_store_kv_mxfp8`` (sglang/kernels/ops/kvcache/mxfp8_quant_store_kv.py), the kernel
``MHATokenToKVPoolMXFP8.set_kv_buffer`` runs when no scales are passed (its default fused path), on buffers shaped as
that pool allocates them: data ``[slots, Hkv, D]`` e4m3, scales ``(pages, Hkv, 32, page/32, D/32)`` (page 128).
Ours: ``InklingKVPool.set_kv_buffer``. Slot 0 is left out: SGLang's writer skips it (the CUDA-graph padding sink).

Not a CPU test: under TRITON_INTERPRET=1 the scales already match byte for byte, but the interpreter's fp8e4nv cast
is not round-to-nearest-even (seen: -272 -> -288 where RNE gives -256; 124.5 -> 64 where the nearest is 128), so
686 of 12225 non-zero K bytes differed there, every one of them with ours the correctly rounded value.

    python -m pytest -q gpu_tests/sglang/test_pool_bytes_gpu.py     # with gpu_env.sh's PYTHONPATH
"""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("heads,head_dim,rows", [(2, 128, 3000), (1, 256, 3000), (8, 128, 20000)])
def test_sglang_mxfp8_writer_and_ours_write_the_same_bytes(heads, head_dim, rows):
    store = pytest.importorskip("sglang.kernels.ops.kvcache.mxfp8_quant_store_kv")
    from sglang_inkling_backend.kv_pool import InklingKVPool
    from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec

    page, device = 128, "cuda"
    size = ((rows + page) // page + 1) * page
    g = torch.Generator(device="cpu").manual_seed(rows + heads)
    octaves = torch.randint(-20, 20, (rows, heads, head_dim // 32, 1), generator=g).float()
    k = torch.randn(rows, heads, head_dim, generator=g) * torch.exp2(octaves).repeat_interleave(32, -1).reshape(
        rows, heads, head_dim)
    v = torch.randn(rows, heads, head_dim, generator=g) * 3
    k[0, 0, :32] = 0  # an all-zero block: scale byte 19
    k[1, 0, :32] = 0
    k[1, 0, 5] = 448 * 2.0 ** -3  # an exact 448 * 2^k maximum
    k, v = k.bfloat16().to(device), v.bfloat16().to(device)
    loc = (torch.randperm(size + page - 1, generator=g)[:rows] + 1).to(device)

    ours = InklingKVPool(LayerPlan([LayerSpec(num_q_heads=heads, num_kv_heads=heads, head_dim=head_dim)]), size=size,
                         page_size=page, kv_format="mxfp8", device=device)
    ours.set_kv_buffer(0, loc, k, v)
    slots = size + page
    kc = torch.zeros((slots, heads, head_dim), dtype=torch.float8_e4m3fn, device=device)
    vc = torch.zeros_like(kc)
    sfk = torch.zeros((slots // page, heads, 32, page // 32, head_dim // 32), dtype=torch.float8_e8m0fnu,
                      device=device)
    sfv = torch.zeros_like(sfk)
    store.quant_store_kv_mxfp8(k, v, loc, kc, vc, sfk, sfv, page_size=page)

    our_sfk, our_sfv = ours.get_kv_scale_buffer(0)
    assert tuple(our_sfk.shape) == tuple(sfk.shape)
    for name, theirs, mine in (("K data", kc, ours.get_key_buffer(0)), ("V data", vc, ours.get_value_buffer(0)),
                               ("K scales", sfk, our_sfk), ("V scales", sfv, our_sfv)):
        a, b = theirs.view(torch.uint8), mine.view(torch.uint8)
        differing = int((a != b).sum())
        assert differing == 0, f"{name}: {differing} of {a.numel()} bytes differ"
