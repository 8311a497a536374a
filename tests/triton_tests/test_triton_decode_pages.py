"""Decode over whole pages (``plan_decode(page_size=...)``, a CSR of whole pages): the page-aligned tile kernel and
the block kernel (``decode_blocks``) against the torch reference on the CPU under the Triton interpreter, the page
contract's validation, and the configuration choice. The page-table API is tested in test_triton_page_table.py.

Error bounds as in test_triton_decode_attention.py: under the interpreter the dots run in float32; the tile
kernel rounds the probabilities to fp16 for 8-bit pools (bound 5e-4, fp16's unit roundoff is 2**-11); the block
kernel's p.V dot runs in float32 there (bound 1e-5, like float pools).
"""

import math
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
from sglang_inkling_backend.triton.inputs import validate_slots  # noqa: E402
from sglang_inkling_backend.triton.plan import DecodeConfig, choose_config, plan_decode  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def whole_pages_batch(lens, page, gen):
    """Each request owns whole pages, in random order (page 0 left out, SGLang's padding sink): token t of a request
    sits in slot page_table[t // page] * page + t % page. Returns (indptr, indices, slots in the pool)."""
    counts = [math.ceil(n / page) for n in lens]
    order = torch.randperm(sum(counts), generator=gen) + 1
    parts, used = [], 0
    for n, c in zip(lens, counts):
        t = torch.arange(n)
        parts.append(order[used + t // page] * page + t % page)
        used += c
    indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    return indptr.to(DEV), torch.cat(parts).to(torch.int32).to(DEV), (sum(counts) + 1) * page


def make_pool(fmt, slots, hkv, d, page, gen):
    """A pool filled through the torch quantizer (the store kernel's bytes are tested identical to it elsewhere);
    blocks scaled by 2**-2 .. 2**2, so a wrong block scale moves the output while the softmax stays spread over
    many keys (a wider range makes it one-hot, and a dropped split then changes nothing measurable)."""
    spread = torch.exp2(torch.randint(-2, 3, (slots, hkv, d // 32, 1), generator=gen).float())
    k = (torch.randn(slots, hkv, d // 32, 32, generator=gen) * spread).reshape(slots, hkv, d)
    v = (torch.randn(slots, hkv, d // 32, 32, generator=gen) * spread.flip(2)).reshape(slots, hkv, d)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(slots, hkv, d, page)
        pool = PagedKV(torch.empty(slots, hkv, d, dtype=torch.float8_e4m3fn), torch.empty(slots, hkv, d,
                       dtype=torch.float8_e4m3fn), layout.empty("cpu"), layout.empty("cpu"), layout)
        loc = torch.arange(slots)
        for x, data, scales in ((k, pool.k_buffer, pool.k_scales), (v, pool.v_buffer, pool.v_scales)):
            q8, sf = mxfp8.quantize(x.bfloat16())
            data.copy_(q8.view(slots, hkv, d))
            layout.scatter(scales, loc, sf.view(slots, hkv, d // 32))
        return PagedKV(pool.k_buffer.to(DEV), pool.v_buffer.to(DEV), pool.k_scales.to(DEV), pool.v_scales.to(DEV),
                       layout)
    if fmt == "fp8":
        return PagedKV((k / 8).to(torch.float8_e4m3fn).to(DEV), (v / 4).to(torch.float8_e4m3fn).to(DEV), k_scale=8.0,
                       v_scale=4.0)
    return PagedKV(k.to(getattr(torch, fmt)).to(DEV), v.to(getattr(torch, fmt)).to(DEV))


def mxfp8_batch(lens, hq, hkv, d, page, gen):
    """Requests of ``lens`` keys on whole pages of an MXFP8 pool, with a bf16 query: (indptr, indices, pool, q)."""
    indptr, indices, slots = whole_pages_batch(lens, page, gen)
    pool = make_pool("mxfp8", slots, hkv, d, page, gen)
    return indptr, indices, pool, torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


MODES = {
    "plain": lambda b, hq, d, g: AttentionParams(d ** -0.5),
    "inkling": lambda b, hq, d, g: AttentionParams(1.0 / d, rel_bias=torch.randn(b, hq, 96, generator=g).to(DEV)),
    # window 100: the first page-aligned tile starts before the window, so its leading keys are masked
    "inkling-local": lambda b, hq, d, g: AttentionParams(1.0 / d, window=100,
                                                         rel_bias=torch.randn(b, hq, 64, generator=g).to(DEV)),
    "generic": lambda b, hq, d, g: AttentionParams(d ** -0.5, window=150, logit_cap=2.0,
                                                   sinks=torch.randn(hq, generator=g).to(DEV)),
}
KERNELS = {"tiles": dict(kernel="tiles", block_n=32, num_warps=2),
           "blocks": dict(kernel="blocks", block_n=32, num_warps=1)}
CASES = ([("mxfp8", 128, mode) for mode in sorted(MODES)]  # the production layout, every mode
         + [("mxfp8", 32, "inkling-local"),  # the flat scale layout, pages of 32
            ("bfloat16", 128, "generic"), ("fp8", 128, "inkling")])


def tolerance(fmt, kernel):
    return 5e-4 if fmt in ("mxfp8", "fp8") and kernel == "tiles" else 1e-5


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("fmt,page,mode", CASES)
def test_whole_pages_match_reference(kernel, fmt, page, mode):
    gen = torch.Generator().manual_seed(hash((kernel, fmt, page, mode)) % 2**31)
    hq, hkv, d = 8, 2, 64
    lens = [1, 70, 259]  # one key; a partial page; pages + a partial tile (3 splits of 96 keys)
    indptr, indices, slots = whole_pages_batch(lens, page, gen)
    pool = make_pool(fmt, slots, hkv, d, page, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES[mode](len(lens), hq, d, gen)
    ref = reference_decode(q, pool, indptr, indices, params)
    for num_splits in (1, 3):  # the direct path and the split + merge path
        out = torch.full(q.shape, float("nan"), device=DEV)
        paged_decode_attention(q, pool, indptr, indices, params, num_splits=num_splits, out=out,
                               plan_options=dict(page_size=page, config=DecodeConfig(**KERNELS[kernel])))
        assert not torch.isnan(out).any()
        assert rel_err(out, ref) < tolerance(fmt, kernel), (num_splits, rel_err(out, ref))


@pytest.mark.parametrize("kernel", ["blocks"])
def test_block_kernel_head_dim_256_and_group_4(kernel):
    """Gemma-3's geometry (8 channel blocks per head, 4 query heads per KV head) through the block kernel."""
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d = 4, 1, 256
    indptr, indices, pool, q = mxfp8_batch([200, 5], hq, hkv, d, 128, gen)
    params = MODES["inkling"](2, hq, d, gen)
    out = paged_decode_attention(q, pool, indptr, indices, params, out=torch.full(q.shape, float("nan")),
                                 plan_options=dict(page_size=128, config=DecodeConfig(**dict(KERNELS[kernel],
                                                                                             block_n=16))))
    assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 1e-5


def test_validate_slots_checks_the_page_contract():
    gen = torch.Generator().manual_seed(5)
    indptr, indices, slots = whole_pages_batch([70, 200], 32, gen)
    pool = make_pool("bfloat16", slots, 1, 32, 32, gen)
    validate_slots(pool, indptr, indices, page_size=32)  # whole pages: accepted
    validate_slots(pool, indptr, indices)  # and without the contract
    moved = indices.clone()
    moved[75] = moved[75] + 1 if int(moved[75]) % 32 != 31 else moved[75] - 1  # token 5 of request 1 off its place
    with pytest.raises(ValueError, match=r"not whole pages of page_size=32: entry 75 \(token 5 of its request\)"):
        validate_slots(pool, indptr, moved, page_size=32)
    swapped = indices.clone()
    swapped[[0, 40]] = swapped[[40, 0]]  # tokens 0 and 40 sit in different pages
    with pytest.raises(ValueError, match="not whole pages"):
        validate_slots(pool, indptr, swapped, page_size=32)
    with pytest.raises(ValueError, match="not whole pages"):  # through the one-call API (validate=True)
        paged_decode_attention(torch.randn(2, 2, 32), pool, indptr, swapped, AttentionParams(0.1),
                               plan_options=dict(page_size=32))


def test_plan_rejects_bad_page_options():
    indptr = torch.tensor([0, 100], dtype=torch.int32)
    common = dict(num_q_heads=8, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="page_size must be a positive multiple of block_n=64"):
        plan_decode(indptr, page_size=96, config=DecodeConfig(block_n=64), **common)
    with pytest.raises(ValueError, match="page_size must be a positive multiple of block_n"):
        plan_decode(indptr, page_size=8, **common)  # pages smaller than the smallest tile
    with pytest.raises(ValueError, match="kernel='blocks' needs page_size"):
        plan_decode(indptr, config=DecodeConfig(kernel="blocks"), **common)
    with pytest.raises(ValueError, match="kernel must be one of"):
        plan_decode(indptr, page_size=128, config=DecodeConfig(kernel="fast"), **common)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16, got 48"):
        plan_decode(indptr, config=DecodeConfig(block_n=48), **common)
    with pytest.raises(TypeError, match="config must be a DecodeConfig, got dict"):
        plan_decode(indptr, page_size=128, config=dict(kernel="blocks"), **common)
    with pytest.raises(ValueError, match="max_seq_len is needed with an int batch"):
        plan_decode(1, page_size=128, **common)


def test_plan_reuses_across_layers_and_window_splits_cover_the_window():
    """A window that does not start on a tile boundary: splits start at the tile before it, and the merge counts
    the same splits (a missed split would drop keys, an extra one would read -inf partials)."""
    gen = torch.Generator().manual_seed(9)
    hq, hkv, d = 4, 1, 32
    indptr, indices, slots = whole_pages_batch([300, 33], 64, gen)
    params = AttentionParams(d ** -0.5, window=150)
    plan = plan_decode(indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, window=150, page_size=64,
                       config=DecodeConfig(kernel="blocks", block_n=32, num_warps=1, num_splits=6))
    # request 0's window is keys 150 .. 299; its tiles start at 128, so 172 keys in 6 splits of 32 (a merge that
    # counted only the window's 150 keys would see 5 and drop keys 288 .. 299)
    assert plan.split_len == 32 and plan.num_splits == 6
    for layer in range(2):
        pool = make_pool("mxfp8", slots, hkv, d, 64, gen)
        q = torch.randn(2, hq, d, generator=gen).bfloat16().to(DEV)
        out = run_decode(plan, q, pool, indptr, indices, params, out=torch.full(q.shape, float("nan")))
        assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 1e-5, layer


@pytest.mark.parametrize("merge_block_d", [32, 64, 128])
def test_merge_over_channel_blocks_matches_reference(merge_block_d):
    """Stage 2 spread over channel blocks (one program per request, query head and merge_block_d channels), with
    sinks and a window (the merge folds the sinks and counts the window's splits): the same output at every
    block width. 41 splits of 32 keys: more than the 32 splits one load round took before, so the loop runs."""
    gen = torch.Generator().manual_seed(17)
    hq, hkv, d = 4, 1, 128
    indptr, indices, pool, q = mxfp8_batch([1300, 90], hq, hkv, d, 128, gen)
    params = AttentionParams(d ** -0.5, window=1250, logit_cap=2.0, sinks=torch.randn(hq, generator=gen).to(DEV))
    plan = plan_decode(indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, window=1250, page_size=128,
                       config=DecodeConfig(kernel="blocks", block_n=32, num_warps=1, num_splits=41,
                                           merge_block_d=merge_block_d))
    assert plan.num_splits == 41 and plan.merge_block_d == merge_block_d  # 1281 keys (window + a tile)
    out = run_decode(plan, q, pool, indptr, indices, params, out=torch.full(q.shape, float("nan")))
    assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 1e-5


@pytest.mark.parametrize("batch,hq,d,expect", [
    (1, 16, 128, 32),  # 16 pairs: 4 blocks of 32 channels, 64 programs
    (1, 4, 256, 32),  # 4 pairs: 8 blocks
    (8, 16, 128, 64),  # 128 pairs, fewer than 132 SMs: 2 blocks, 256 programs
    (16, 16, 128, 128),  # 256 pairs: the whole head
    (32, 64, 128, 128),
    (1, 4, 96, 96),  # not a power of two: the whole head (the kernels refuse it at run time)
])
def test_choose_merge_block_d(batch, hq, d, expect):
    from sglang_inkling_backend.triton.plan import choose_merge_block_d
    assert choose_merge_block_d(batch, hq, d, 132) == expect


def test_plan_rejects_bad_merge_block_d():
    indptr = torch.tensor([0, 100], dtype=torch.int32)
    for bad in (16, 96, 256, 64.0):
        with pytest.raises(ValueError, match=f"merge_block_d must be a power of two in \\[32, head_dim=128\\] "
                                             f"dividing head_dim, got {bad!r}"):
            plan_decode(indptr, num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=128,
                        config=DecodeConfig(merge_block_d=bad))


@pytest.mark.parametrize("batch,hkv,d,keys,dtype,expect", [
    (128, 2, 128, 32768, torch.float8_e4m3fn, dict(kernel="blocks", block_n=32, num_warps=1, num_stages=3,
                                                    resident=12)),
    (128, 1, 256, 16384, torch.float8_e4m3fn, dict(kernel="blocks", block_n=32, num_warps=1, num_stages=3,
                                                    resident=8)),
    (8, 1, 256, 16384, torch.float8_e4m3fn, dict(kernel="blocks")),  # 8 x 64 = 512 programs of 256 keys
    (8, 2, 128, 4096, torch.float8_e4m3fn, dict(kernel="blocks", waves=4, min_split=64)),
    (8, 1, 256, 4096, torch.float8_e4m3fn, dict(kernel="blocks", waves=4, min_split=64)),
    (8, 8, 128, 1024, torch.float8_e4m3fn, dict(kernel="blocks", waves=4)),  # 8192 keys, but 64 (request, head) pairs
    (1, 2, 128, 32768, torch.float8_e4m3fn, dict(kernel="blocks", resident=12, min_split=64)),  # one request
    (1, 2, 128, 4096, torch.float8_e4m3fn, dict(kernel="tiles", block_n=64, num_warps=4, min_split=64)),
    (1, 1, 256, 32768, torch.float8_e4m3fn, dict(kernel="tiles", block_n=64, num_warps=4, min_split=64)),
    (1, 8, 128, 4096, torch.float8_e4m3fn, dict(kernel="blocks", waves=4, min_split=64)),  # 32768 pair-keys
    (1, 8, 128, 1024, torch.float8_e4m3fn, dict(kernel="tiles", waves=2)),
    (8, 2, 128, 1024, torch.float8_e4m3fn, dict(kernel="tiles", block_n=64, num_warps=4, waves=2)),
    (128, 2, 128, 32768, torch.bfloat16, dict(kernel="tiles", block_n=64, num_warps=2)),
])
def test_choose_config(batch, hkv, d, keys, dtype, expect):
    """Configurations from the H200 sweeps (bench/results/current/README.md, section "Decode grid")."""
    got = choose_config(batch, hkv, d, keys, 128, dtype)
    assert {k: got[k] for k in expect} == expect
    assert choose_config(batch, hkv, d, keys, None, dtype)["kernel"] == "tiles"  # per-token indices: tiles only
    assert choose_config(batch, hkv, d, keys, 32, dtype)["block_n"] == 32  # small pages: tiles inside a page


@pytest.mark.parametrize("kernel", ["tiles", "blocks"])
def test_plan_decode_takes_a_callers_kernel(kernel):
    """A caller's kernel is kept (a large batch, where choose_config picks the block kernel)."""
    indptr = torch.arange(0, 129 * 4096, 4096, dtype=torch.int32)
    plan = plan_decode(indptr, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=4096, page_size=128,
                       config=DecodeConfig(kernel=kernel, block_n=32))
    assert plan.kernel == kernel and plan.block_n == 32


def page_sizes_planned(monkeypatch, kernels) -> list:
    """The ``page_size`` of every ``plan_decode`` call the route makes from now on."""
    seen = []
    real_plan = kernels.plan_decode
    monkeypatch.setattr(kernels, "plan_decode",
                        lambda *a, **kw: seen.append(kw.get("page_size")) or real_plan(*a, **kw))
    return seen


def test_triton_route_reads_page_tables_paged_and_rails_per_token(monkeypatch):
    """The core's Triton route plans by whole pages for a page table (``KVPages``: what the SGLang adapter gives for
    an MXFP8 pool, whose requests own whole pages) and per token for rails (``KVRails``), and both match the
    reference, for MXFP8 and bf16 pools."""
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.rails import KVPages, KVRails
    from sglang_inkling_backend.step_plans import DecodePlanCache
    from sglang_inkling_backend.gpu.route import GpuRoute

    seen = page_sizes_planned(monkeypatch, kernels)
    gen = torch.Generator().manual_seed(13)
    lens, page = [150, 20], 128
    indptr, indices, slots = whole_pages_batch(lens, page, gen)
    rails = KVRails(indptr.long(), indices.long())
    first_slots = [indices[int(indptr[b]):int(indptr[b + 1])][::page] for b in range(2)]
    table = torch.zeros(2, 2, dtype=torch.int32)
    for b, firsts in enumerate(first_slots):
        table[b, :len(firsts)] = (firsts // page).to(torch.int32)
    pages = KVPages(table.to(DEV), torch.tensor(lens, device=DEV), page)
    params = MODES["inkling"](2, 8, 64, gen)
    route = GpuRoute(kernels)
    for fmt in ("mxfp8", "bfloat16"):
        pool = make_pool(fmt, slots, 2, 64, page, gen)
        q = torch.randn(2, 8, 64, generator=gen).bfloat16().to(DEV)
        want = reference_decode(q, pool, indptr, indices, params)
        for keys, expect in ((pages, page), (rails, None)):
            out = route.decode(q, pool, keys, params, max_seq_len=150, plans=DecodePlanCache(), workspace=None)
            assert seen[-1] == expect, (fmt, type(keys).__name__)
            assert rel_err(out, want) < 4e-3  # bf16 output


def test_triton_route_plans_window_rails_per_token(monkeypatch):
    """A window rail starts at the window, mid-page (rails.window_start), so it cannot be read by whole pages: the
    route plans it per token. With page_size the kernel would read the tile from the rail's first slot rounded to a
    tile, the wrong keys (rel err ~1 against the reference)."""
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.rails import KVRails, window_start
    from sglang_inkling_backend.step_plans import DecodePlanCache
    from sglang_inkling_backend.gpu.route import GpuRoute

    seen = page_sizes_planned(monkeypatch, kernels)
    gen = torch.Generator().manual_seed(17)
    lens, window = [150, 70], 48
    indptr, indices, slots = whole_pages_batch(lens, 128, gen)
    starts = window_start(torch.tensor(lens), torch.ones(2, dtype=torch.long), window)  # [103, 22]: mid-page
    rail_indices = torch.cat([indices[int(indptr[b]) + int(starts[b]):int(indptr[b + 1])] for b in range(2)])
    rail_indptr = torch.tensor([0, lens[0] - int(starts[0]), sum(lens) - int(starts.sum())])
    rails = KVRails(rail_indptr, rail_indices.long())
    params = AttentionParams(1.0 / 64, window=window, rel_bias=torch.randn(2, 8, window, generator=gen).to(DEV))
    pool = make_pool("mxfp8", slots, 2, 64, 128, gen)
    q = torch.randn(2, 8, 64, generator=gen).bfloat16().to(DEV)
    out = GpuRoute(kernels).decode(q, pool, rails, params, max_seq_len=window, plans=DecodePlanCache(),
                                      workspace=None)
    assert seen[-1] is None
    ref = reference_decode(q, pool, indptr.long(), indices.long(), params)  # the whole rails, the window masks
    assert rel_err(out, ref) < 4e-3
