"""Triton paged decode attention and the fused MXFP8 store against the torch reference, on the CPU under the Triton
interpreter (small shapes).

Error bounds: under the interpreter the kernel's dots run in float32 (the interpreter's bf16 dot is broken, see
``triton.inputs.dot_dtype``) and the test asks for a float32 output. For float pools kernel and reference
then differ only by float32 summation order and the exp2/log2 softmax: bound 1e-5 relative (Frobenius; seen
~1e-7). For fp8 and MXFP8 pools the bound is 5e-4 because the tile kernel's fp16 tiles
(``dequant_tile_relative``) round the probabilities to fp16 for the p.V product: fp16's unit roundoff is
2**-11 = 4.9e-4 (seen ~6e-5). Both are
far below any real bug (a wrong scale, a missed key or a wrong bias offset moves the output by 1e-2 or more). The
GPU's bf16/fp16 dots are covered by gpu_tests/check_triton_gpu.py. Stored MXFP8 bytes must be identical:
the store kernel encodes with integer operations, exact under the interpreter too.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

triton = pytest.importorskip("triton")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention as reference_decode  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton.decode_attention import paged_decode_attention, run_decode  # noqa: E402
from sglang_inkling_backend.triton.plan import DecodeConfig, choose_num_splits, plan_decode  # noqa: E402
from sglang_inkling_backend.triton.kv_store import store_kv, store_kv_mxfp8, store_kv_unquantized  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL_FLOAT = 1e-5  # float pools: float32 arithmetic throughout under the interpreter
TOL = 5e-4  # fp8 / MXFP8 pools: probabilities rounded to fp16 (unit roundoff 2**-11)


def tol_for(fmt):
    return TOL_FLOAT if fmt in ("bfloat16", "float16", "float32") else TOL


def empty_mx_pool(slots, hkv, d, page):
    layout = ScaleLayout.for_pool(slots, hkv, d, page)
    data = lambda: torch.zeros(slots, hkv, d, dtype=torch.float8_e4m3fn, device=DEV)
    return PagedKV(data(), data(), layout.empty(DEV), layout.empty(DEV), layout)


def make_pool(fmt, hkv, d, slots=256, page=128, gen=None):
    # small pools: filling one runs the store kernel once per slot and head under the interpreter
    k = torch.randn(slots, hkv, d, generator=gen).to(DEV)
    v = torch.randn(slots, hkv, d, generator=gen).to(DEV)
    if fmt == "mxfp8":
        pool = empty_mx_pool(slots, hkv, d, page)
        store_kv_mxfp8(pool, torch.arange(slots, device=DEV), k.bfloat16(), v.bfloat16())
        return pool
    if fmt == "fp8":
        return PagedKV((k / 0.25).to(torch.float8_e4m3fn), (v / 0.5).to(torch.float8_e4m3fn), k_scale=0.25,
                       v_scale=0.5)
    return PagedKV(k.to(getattr(torch, fmt)), v.to(getattr(torch, fmt)))


def make_batch(lens, slots, gen):
    indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(DEV)
    indices = torch.randperm(slots, generator=gen)[: sum(lens)].to(torch.int32).to(DEV)
    return indptr, indices


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


MODES = {
    "plain": lambda b, hq, d, g: AttentionParams(d ** -0.5),
    "inkling": lambda b, hq, d, g: AttentionParams(1.0 / d, rel_bias=torch.randn(b, hq, 96, generator=g).to(DEV)),
    "inkling-local": lambda b, hq, d, g: AttentionParams(1.0 / d, window=64,
                                                         rel_bias=torch.randn(b, hq, 64, generator=g).to(DEV)),
    "generic": lambda b, hq, d, g: AttentionParams(d ** -0.5, window=150, logit_cap=2.0,
                                                   sinks=torch.randn(hq, generator=g).to(DEV)),
}


CASES = ([("mxfp8", 128, mode) for mode in sorted(MODES)]  # every mode on the production layout
         + [("mxfp8", 16, "generic"),  # the flat scale layout
            ("bfloat16", 1, "generic"), ("float16", 1, "inkling"), ("float32", 1, "plain"), ("fp8", 1, "generic")])


@pytest.mark.parametrize("fmt,page,mode", CASES)
def test_decode_matches_reference(fmt, page, mode):
    gen = torch.Generator().manual_seed(hash((fmt, page, mode)) % 2**31)
    hq, hkv, d = 8, 2, 64
    pool = make_pool(fmt, hkv, d, page=page, gen=gen)
    lens = [1, 70, 129]  # one key, a partial tile, a split boundary (3 splits of 64 keys)
    indptr, indices = make_batch(lens, pool.num_slots, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES[mode](len(lens), hq, d, gen)
    ref = reference_decode(q, pool, indptr, indices, params)
    for num_splits in (1, 3):  # the direct path and the split + merge path
        out = torch.full(q.shape, float("nan"), device=DEV)
        paged_decode_attention(q, pool, indptr, indices, params, num_splits=num_splits, out=out)
        assert not torch.isnan(out).any()
        assert rel_err(out, ref) < tol_for(fmt), (num_splits, rel_err(out, ref))


def inkling_mxfp8_case(hq, hkv, d, lens, seed):
    """An MXFP8 pool, a batch of ``lens`` keys, q and Inkling-mode params, and the reference decode of them."""
    gen = torch.Generator().manual_seed(seed)
    pool = make_pool("mxfp8", hkv, d, gen=gen)
    indptr, indices = make_batch(lens, pool.num_slots, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES["inkling"](len(lens), hq, d, gen)
    return pool, indptr, indices, q, params, reference_decode(q, pool, indptr, indices, params)


@pytest.mark.parametrize("hq,hkv,d", [(4, 1, 128), (6, 2, 64), (32, 1, 32)])
def test_decode_head_geometries(hq, hkv, d):
    """GQA groups of 1..32 (padded to the dot's 16 rows or more, non-powers of two), head_dim 32..128."""
    pool, indptr, indices, q, params, ref = inkling_mxfp8_case(hq, hkv, d, [100, 3], seed=hq * 1000 + d)
    out = torch.full(q.shape, float("nan"), device=DEV)
    paged_decode_attention(q, pool, indptr, indices, params, out=out)
    assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("variant", [dict(block_n=32, num_stages=1), dict(block_n=16, num_warps=1)])
def test_decode_kernel_variants(variant):
    """The configurations the benchmark sweeps compute the same function."""
    hq, hkv, d = 8, 2, 64
    pool, indptr, indices, q, params, ref = inkling_mxfp8_case(hq, hkv, d, [1, 129], seed=7)
    for num_splits in (1, 4):
        plan = plan_decode(indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                           config=DecodeConfig(num_splits=num_splits, **variant))
        out = run_decode(plan, q, pool, indptr, indices, params, out=torch.full(q.shape, float("nan"), device=DEV))
        assert rel_err(out, ref) < TOL


def test_decode_bf16_output_and_plan_reuse():
    """Default output is q's dtype; one plan serves several layers (pools) of a batch."""
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d = 8, 2, 64
    lens = [100, 40]
    pools = [make_pool("mxfp8", hkv, d, slots=256, gen=gen) for _ in range(2)]
    indptr, indices = make_batch(lens, 256, gen)
    q = torch.randn(2, hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES["plain"](2, hq, d, gen)
    plan = plan_decode(indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, config=DecodeConfig(num_splits=2))
    for pool in pools:
        out = run_decode(plan, q, pool, indptr, indices, params)
        assert out.dtype == torch.bfloat16
        # bf16 output: 2**-9 relative rounding per element
        assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 4e-3


def test_choose_num_splits():
    assert choose_num_splits(128, 8, 32768, 132, 64) == 2  # 1024 programs: 2 splits reach 8 x 132
    assert choose_num_splits(1, 2, 32768, 132, 64) == 128  # one long request: 256-key splits
    assert choose_num_splits(1, 2, 100, 132, 64) == 1  # a short one is never split
    # one round of resident programs: at most resident x SMs programs, never one more
    assert choose_num_splits(8, 2, 32768, 132, 32, resident=12) == 99  # 16 pairs x 99 = 1584 = 12 x 132
    assert choose_num_splits(128, 2, 32768, 132, 32, resident=12) == 6  # 256 x 6 = 1536 <= 1584 < 256 x 7
    assert choose_num_splits(32, 2, 4096, 132, 32, resident=12) == 16  # 24 would fit; splits stay >= 256 keys
    assert choose_num_splits(2048, 1, 1024, 132, 32, resident=8) == 1  # more pairs than a round: no split


def test_plan_decode_splits_large_batches_into_one_round_of_resident_programs():
    """The planned block configuration splits into at most one round (12 x 132 programs at head_dim 128, 8 x 132 at
    256); the same kernel with a caller's waves, or another warp count, goes by waves instead."""
    indptr = torch.arange(0, 9 * 32768, 32768, dtype=torch.int32)  # B=8 requests of 32k keys
    plan = plan_decode(indptr, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=32768, page_size=128)
    assert (plan.kernel, plan.block_n) == ("blocks", 32)
    assert plan.num_splits == 94 and plan.split_len == 352  # 99 asked; 352-key splits (11 tiles) need 94
    assert 8 * 2 * plan.num_splits <= 12 * 132
    wide = plan_decode(indptr, num_q_heads=4, num_kv_heads=1, head_dim=256, max_seq_len=32768, page_size=128)
    assert wide.kernel == "blocks" and wide.num_splits == 128  # 132 asked: 256 keys
    assert 8 * wide.num_splits <= 8 * 132
    by_waves = plan_decode(indptr, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=32768, page_size=128,
                           config=DecodeConfig(waves=4))
    assert by_waves.num_splits == 32  # ceil(4 x 132 / 16) = 33 asked: 993 -> 1024-key splits, 32 of them
    two_warps = plan_decode(indptr, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=32768,
                            page_size=128, config=DecodeConfig(num_warps=2))
    assert two_warps.num_splits == 128  # waves=32: 264 asked, capped at 256-key splits


@pytest.mark.parametrize("batch,hq,hkv,d,keys,splits", [
    (8, 64, 8, 128, 1024, 8),  # 64 pairs: ceil(4 x 132 / 64) = 9 asked -> 114 -> 128-key splits, 8 of them
    (8, 4, 1, 256, 4096, 64),  # 8 pairs: 66 asked, splits of >= 64 keys: 64
    (32, 4, 1, 256, 1024, 16),  # 32 pairs: 17 asked -> 61 -> 64-key splits, 16 of them
    (8, 16, 2, 128, 4096, 32),  # 16 pairs: 33 asked -> 125 -> 128-key splits, 32
])
def test_plan_decode_middle_batches_take_the_block_kernel_at_four_programs_per_sm(batch, hq, hkv, d, keys, splits):
    """Between the large batches and the small ones the transposed-V block kernel runs about 4 x 132 programs
    (the split counts timed in bench/results/history/2026-11-29-decode-mid-grid-block-kernel/ and
    bench/results/history/2026-11-29-decode-small-batch-splits/)."""
    indptr = torch.arange(0, (batch + 1) * keys, keys, dtype=torch.int32)
    plan = plan_decode(indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=keys, page_size=128)
    assert (plan.kernel, plan.num_splits) == ("blocks", splits)


def test_decode_rejects_bad_input():
    gen = torch.Generator().manual_seed(0)
    pool = make_pool("mxfp8", 2, 64, slots=256, gen=gen)
    indptr, indices = make_batch([10, 20], 256, gen)
    q = torch.randn(2, 8, 64).bfloat16().to(DEV)
    p = AttentionParams(0.1)
    with pytest.raises(TypeError, match="q must be"):
        paged_decode_attention(q.to(torch.int32), pool, indptr, indices, p)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(torch.randn(2, 8, 32).to(DEV), pool, indptr, indices, p)
    with pytest.raises(ValueError, match="multiple of the pool's KV heads"):
        paged_decode_attention(torch.randn(2, 7, 64).to(DEV), pool, indptr, indices, p)
    with pytest.raises(ValueError, match="rel_bias"):
        paged_decode_attention(q, pool, indptr, indices, AttentionParams(0.1, rel_bias=torch.zeros(3, 8, 4)))
    with pytest.raises(ValueError, match="sinks"):
        paged_decode_attention(q, pool, indptr, indices, AttentionParams(0.1, sinks=torch.zeros(4)))
    with pytest.raises(ValueError, match="kv_indptr must have"):
        paged_decode_attention(q, pool, indptr[:2], indices, p)
    with pytest.raises(TypeError, match="kv_indices"):
        paged_decode_attention(q, pool, indptr, indices.float(), p)
    with pytest.raises(ValueError, match="kv_indices must be slots"):
        paged_decode_attention(q, pool, indptr, torch.full_like(indices, 256), p)
    with pytest.raises(ValueError, match="at least one key"):
        paged_decode_attention(q, pool, torch.tensor([0, 0, 5], dtype=torch.int32), indices, p)
    with pytest.raises(ValueError, match="out must be"):
        paged_decode_attention(q, pool, indptr, indices, p, out=torch.empty(2, 8, 32))
    with pytest.raises(TypeError, match="kv must be a PagedKV"):
        paged_decode_attention(q, (pool.k_buffer, pool.v_buffer), indptr, indices, p)
    plan = plan_decode(indptr, num_q_heads=8, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="plan was made for window"):
        run_decode(plan, q, pool, indptr, indices, AttentionParams(0.1, window=8))


# --- the fused MXFP8 store ---------------------------------------------------------------------------------------
def special_values(n, hkv, d, gen):
    """Wide dynamic range per block, all-zero blocks, exact 448 * 2**k maxima, NaN/inf blocks, e4m3 ties."""
    spread = torch.exp2(torch.randint(-40, 40, (n, hkv, d // 32, 1), generator=gen).float())
    x = (torch.randn(n, hkv, d // 32, 32, generator=gen) * spread).reshape(n, hkv, d)
    x[0] = 0
    x[1, :, :32] = 448.0 * 2.0 ** -5
    x[2, 0, 3] = float("nan")
    x[3, 0, 40 % d] = float("inf")
    x[4, 0, 1] = float("-inf")
    ties = torch.tensor([448.0, 1.0625, 1.1875, 13.0, 2 ** -9 * 1.5, 2 ** -10, 3 * 2 ** -10, -0.0, 0.3125,
                         -17.0, 208.0, 2 ** -6 * 1.0625, 240.0, 232.0, -0.0009765625])
    x[5, 0, :32] = 0
    x[5, 0, : ties.numel()] = ties
    return x


@pytest.mark.parametrize("page", [128, 16])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_store_bytes_identical_to_quantize_and_scatter(page, src_dtype):
    gen = torch.Generator().manual_seed(page)
    slots, hkv, d, n = 512, 2, 64, 200
    loc = torch.randperm(slots, generator=gen)[:n].to(DEV)
    k = special_values(n, hkv, d, gen).to(src_dtype).to(DEV)
    v = (torch.randn(n, hkv, d, generator=gen) * 5).to(src_dtype).to(DEV)
    pool = empty_mx_pool(slots, hkv, d, page)
    store_kv_mxfp8(pool, loc, k.reshape(n, hkv * d), v)  # the flat [N, Hkv * D] form too
    ref = empty_mx_pool(slots, hkv, d, page)
    (kd, ks), (vd, vs) = mxfp8.quantize(k), mxfp8.quantize(v)
    ref.k_buffer[loc], ref.v_buffer[loc] = kd, vd
    ref.layout.scatter(ref.k_scales, loc, ks)
    ref.layout.scatter(ref.v_scales, loc, vs)
    for name in ("k_buffer", "v_buffer", "k_scales", "v_scales"):
        got, want = getattr(pool, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)
        assert torch.equal(got, want), (name, int((got != want).sum()))


def test_store_rejects_bad_input_before_writing():
    pool = empty_mx_pool(256, 2, 64, 128)
    before = [t.clone() for t in (pool.k_buffer.view(torch.uint8), pool.k_scales)]
    k = torch.randn(4, 2, 64).bfloat16().to(DEV)
    loc = torch.tensor([1, 2, 3, 4]).to(DEV)
    with pytest.raises(ValueError, match="loc must be slots"):
        store_kv_mxfp8(pool, torch.tensor([1, 2, 3, 256]).to(DEV), k, k)
    with pytest.raises(ValueError, match="v must hold"):
        store_kv_mxfp8(pool, loc, k, k[:3])
    with pytest.raises(TypeError, match="k must be bf16"):
        store_kv_mxfp8(pool, loc, k.to(torch.int32), k)
    with pytest.raises(TypeError, match="loc must be"):
        store_kv_mxfp8(pool, loc.float(), k, k)
    with pytest.raises(ValueError, match="needs an MXFP8 PagedKV"):
        store_kv_mxfp8(PagedKV(k, k), loc, k, k)
    assert torch.equal(before[0], pool.k_buffer.view(torch.uint8)) and torch.equal(before[1], pool.k_scales)


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_unquantized_store_writes_what_indexed_writes_write(pool_dtype, src_dtype):
    """store_kv_unquantized (one kernel for K and V) against the two indexed writes it replaces: the same bytes,
    every other slot untouched, with 3 KV heads (not a power of two: the head block is masked), the flat
    [N, Hkv * D] form and a strided K (a split of a fused qkv), values of another dtype cast as ``Tensor.to``
    casts them."""
    gen = torch.Generator().manual_seed(11)
    slots, hkv, d, n = 300, 3, 64, 57
    loc = torch.randperm(slots, generator=gen)[:n].to(DEV)
    qkv = (torch.randn(n, 3 * hkv * d, generator=gen) * 1e3).to(src_dtype).to(DEV)
    k, v = qkv[:, hkv * d:2 * hkv * d], qkv[:, 2 * hkv * d:].reshape(n, hkv, d)
    fill = torch.randn(slots, hkv, d, generator=gen).to(pool_dtype).to(DEV)
    pool, ref = PagedKV(fill.clone(), fill.clone()), PagedKV(fill.clone(), fill.clone())
    store_kv(pool, loc, k, v)
    ref.k_buffer[loc], ref.v_buffer[loc] = k.reshape(n, hkv, d).to(pool_dtype), v.to(pool_dtype)
    for name in ("k_buffer", "v_buffer"):
        got, want = getattr(pool, name), getattr(ref, name)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (name, int((got != want).sum()))
    assert not torch.equal(pool.k_buffer, fill)  # it wrote


def test_unquantized_store_rejects_bad_input_before_writing():
    k = torch.randn(4, 2, 64).bfloat16().to(DEV)
    pool = PagedKV(torch.zeros(64, 2, 64, dtype=torch.bfloat16, device=DEV), torch.zeros(64, 2, 64,
                                                                                         dtype=torch.bfloat16,
                                                                                         device=DEV))
    loc = torch.tensor([1, 2, 3, 4]).to(DEV)
    with pytest.raises(ValueError, match="loc must be slots"):
        store_kv(pool, torch.tensor([1, 2, 3, 64]).to(DEV), k, k)
    with pytest.raises(ValueError, match="loc must not name a slot twice"):
        store_kv_unquantized(pool, torch.tensor([1, 2, 2, 4]).to(DEV), k, k)
    with pytest.raises(ValueError, match="v must hold"):
        store_kv(pool, loc, k, k[:3])
    with pytest.raises(ValueError, match="needs a .* pool, this one is mxfp8"):
        store_kv_unquantized(empty_mx_pool(256, 2, 64, 128), loc, k, k)
    fp8 = PagedKV(torch.zeros(64, 2, 64, device=DEV).to(mxfp8.DATA_DTYPE),
                  torch.zeros(64, 2, 64, device=DEV).to(mxfp8.DATA_DTYPE), k_scale=2.0, v_scale=2.0)
    with pytest.raises(ValueError, match=r"store_kv writes \('mxfp8', 'bf16', 'fp16', 'fp32'\) pools, this one is "
                                         r"fp8_e4m3"):
        store_kv(fp8, loc, k, k)
    assert not pool.k_buffer.any() and not pool.v_buffer.any()


def test_a_pool_with_the_triton_store_writes_the_torch_quantizers_bytes():
    """InklingKVPool.fused_store = store_kv_mxfp8 (what the SGLang host sets for the Triton route): the same bytes
    and scales as the pool's torch quantizer, strided K (a split of a fused qkv) included."""
    from sglang_inkling_backend import InklingKVPool, LayerPlan
    plan = LayerPlan.from_windows({0: None}, num_q_heads=4, num_kv_heads=2, head_dim=64)
    fused, plain = (InklingKVPool(plan, size=256, page_size=128, kv_format="mxfp8", device=DEV) for _ in range(2))
    fused.fused_store = store_kv_mxfp8
    g = torch.Generator().manual_seed(3)
    qkv = (torch.randn(40, 3 * 128, generator=g) * 5).bfloat16().to(DEV)
    k, v = qkv[:, 128:256], qkv[:, 256:]
    loc = (torch.randperm(255, generator=g)[:40] + 1).to(DEV)
    for pool in (fused, plain):
        pool.set_kv_buffer(0, loc, k, v)
    for a, b in zip(fused.layers[0].tensors(), plain.layers[0].tensors()):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert int((fused.get_kv_scale_buffer(0)[0] != 0).sum()) == 40 * 2 * 2
