"""The page-table API of the Triton decode and extend kernels (``page_table [B, max_pages]`` int32 page ids plus
``seq_lens [B]``), against the torch reference on the CPU under the Triton interpreter (tiny shapes), and the
caller-owned decode workspace.

Positions are absolute: key ``t`` of request ``b`` sits in slot ``page_table[b, t // P] * P + t % P``, so the
reference runs on the per-token CSR built from the same table. A windowed layer starts at the page holding
``max(0, seq_len - W)``: the table's entries for pages entirely before the window hold -1 here (as a host's null
block would hold anything), which validation accepts and the kernels never read; the reference gets slot 0 there,
behind its window mask. Error bounds as in test_triton_decode_pages.py: the tile kernel rounds probabilities to fp16
for 8-bit pools (5e-4, fp16's unit roundoff is 2**-11), the block kernel's dots run in float32 under the interpreter
(1e-5); extend as test_triton_extend.py (1e-5).
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
from sglang_inkling_backend.reference.attention import paged_extend_attention as reference_extend  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import (DecodeConfig, DecodeWorkspace, decode_workspace_shape,  # noqa: E402
                                           decode_workspace_splits, paged_decode_attention, paged_extend_attention,
                                           plan_decode, run_decode)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NULL = -1  # the table's entry for a page the kernels must not read


def page_table_batch(lens, page, gen, window=None, query_lens=None, extra_columns=1):
    """Random distinct pages (page 0 left out) for requests of ``lens`` keys: (page_table, seq_lens, kv_indptr,
    kv_indices for the reference, slots in the pool). Columns past a request's last page, and with ``window`` the
    pages entirely before its first query's window, hold NULL."""
    query_lens = query_lens or [1] * len(lens)
    counts = [math.ceil(n / page) for n in lens]
    max_pages = max(counts) + extra_columns
    order = (torch.randperm(sum(counts), generator=gen) + 1).tolist()
    table = torch.full((len(lens), max_pages), NULL, dtype=torch.int32)
    parts, used = [], 0
    for b, (n, c, ql) in enumerate(zip(lens, counts, query_lens)):
        first_page = max(0, n - ql - window + 1) // page if window is not None else 0
        table[b, :c] = torch.tensor(order[used:used + c], dtype=torch.int32)
        table[b, :first_page] = NULL
        used += c
        t = torch.arange(n)
        page_ids = table[b, t // page].long()
        parts.append(torch.where(page_ids >= 0, page_ids * page + t % page, 0))  # slot 0: behind the window mask
    indptr = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return (table.to(DEV), seq_lens.to(DEV), indptr.to(DEV), torch.cat(parts).to(torch.int32).to(DEV),
            (sum(counts) + 1) * page)


def make_pool(fmt, slots, hkv, d, page, gen):
    """Blocks scaled by 2**-2 .. 2**2 (a wrong block scale moves the output; the softmax stays spread)."""
    spread = torch.exp2(torch.randint(-2, 3, (slots, hkv, d // 32, 1), generator=gen).float())
    k = (torch.randn(slots, hkv, d // 32, 32, generator=gen) * spread).reshape(slots, hkv, d)
    v = (torch.randn(slots, hkv, d // 32, 32, generator=gen) * spread.flip(2)).reshape(slots, hkv, d)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(slots, hkv, d, page)
        ks, vs = layout.empty("cpu"), layout.empty("cpu")
        (kq, kf), (vq, vf) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())
        layout.scatter(ks, torch.arange(slots), kf.view(slots, hkv, d // 32))
        layout.scatter(vs, torch.arange(slots), vf.view(slots, hkv, d // 32))
        return PagedKV(kq.view(slots, hkv, d).to(DEV), vq.view(slots, hkv, d).to(DEV), ks.to(DEV), vs.to(DEV),
                       layout)
    if fmt == "fp8":
        return PagedKV((k / 8).to(torch.float8_e4m3fn).to(DEV), (v / 4).to(torch.float8_e4m3fn).to(DEV),
                       k_scale=8.0, v_scale=4.0)
    return PagedKV(k.bfloat16().to(DEV), v.bfloat16().to(DEV))


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


MODES = {  # (window, params)
    "inkling": (None, lambda b, hq, d, g: AttentionParams(1.0 / d, rel_bias=torch.randn(b, hq, 96, generator=g))),
    # window 100: the first tile starts before the window (its leading keys masked), earlier pages are NULL
    "inkling-local": (100, lambda b, hq, d, g: AttentionParams(1.0 / d, window=100,
                                                               rel_bias=torch.randn(b, hq, 64, generator=g))),
    "generic": (150, lambda b, hq, d, g: AttentionParams(d ** -0.5, window=150, logit_cap=2.0,
                                                         sinks=torch.randn(hq, generator=g))),
}
CASES = ([("mxfp8", 128, mode, kernel) for mode in sorted(MODES) for kernel in ("tiles", "blocks")]
         + [("mxfp8", 32, "inkling-local", "blocks"),  # the flat scale layout, pages of 32
            ("bfloat16", 64, "generic", "blocks"), ("fp8", 64, "inkling-local", "tiles")])


def on_device(params):
    return AttentionParams(params.softmax_scale, window=params.window, logit_cap=params.logit_cap,
                           rel_bias=None if params.rel_bias is None else params.rel_bias.to(DEV),
                           sinks=None if params.sinks is None else params.sinks.to(DEV))


@pytest.mark.parametrize("fmt,page,mode,kernel", CASES)
def test_page_table_decode_matches_reference(fmt, page, mode, kernel):
    gen = torch.Generator().manual_seed(hash((fmt, page, mode, kernel)) % 2**31)
    hq, hkv, d = 8, 2, 64  # GQA: 4 query heads per KV head
    lens = [1, 70, 300]  # one key; a partial page; pages + a partial tile (with a window: pages before it)
    window, make_params = MODES[mode]
    table, seq_lens, indptr, indices, slots = page_table_batch(lens, page, gen, window=window)
    if window is not None:
        assert int((table[2] == NULL).sum()) > 1  # pages before the window and the spare column
    pool = make_pool(fmt, slots, hkv, d, page, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)
    params = on_device(make_params(len(lens), hq, d, gen))
    ref = reference_decode(q, pool, indptr, indices, params)
    for num_splits in (1, 3):  # the direct path and the split + merge path
        out = torch.full(q.shape, float("nan"), device=DEV)
        paged_decode_attention(q, pool, params=params, page_table=table, seq_lens=seq_lens, page_size=page,
                               num_splits=num_splits, out=out,
                               plan_options=dict(config=DecodeConfig(kernel=kernel, block_n=32)))
        assert not torch.isnan(out).any()
        bound = 5e-4 if fmt in ("mxfp8", "fp8") and kernel == "tiles" else 1e-5
        assert rel_err(out, ref) < bound, (num_splits, rel_err(out, ref))


def test_page_table_plan_with_workspace_and_max_seq_len_runs_every_layer():
    """The graph path: an int batch and max_seq_len (no device read), split buffers that are views of the
    caller's workspace, run_decode without checks; two layers (pools) share the plan, and a larger workspace made
    for a maximum batch and context holds it."""
    gen = torch.Generator().manual_seed(21)
    hq, hkv, d, page = 4, 1, 64, 128
    lens = [300, 129]
    table, seq_lens, indptr, indices, slots = page_table_batch(lens, page, gen, window=150)
    params = AttentionParams(d ** -0.5, window=150, sinks=torch.randn(hq, generator=gen).to(DEV))
    ws = DecodeWorkspace.for_max_context(8, hq, hkv, d, 4096, DEV)
    plan = plan_decode(2, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=300, window=150,
                       page_size=page, kv_dtype=torch.float8_e4m3fn, workspace=ws,
                       config=DecodeConfig(num_splits=4, block_n=32))
    assert plan.num_splits > 1
    assert plan.part_o.untyped_storage().data_ptr() == ws.part_o.untyped_storage().data_ptr()
    assert plan.part_lse.untyped_storage().data_ptr() == ws.part_lse.untyped_storage().data_ptr()
    for layer in range(2):
        pool = make_pool("mxfp8", slots, hkv, d, page, gen)
        q = torch.randn(2, hq, d, generator=gen).bfloat16().to(DEV)
        out = run_decode(plan, q, pool, params=params, page_table=table, seq_lens=seq_lens, check=False,
                         out=torch.full(q.shape, float("nan"), device=DEV))
        assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 5e-4, layer


@pytest.mark.parametrize("kernel", ["tiles", "blocks"])
@pytest.mark.parametrize("window", [None, 100])
def test_a_plan_for_a_long_context_spreads_short_requests_over_its_splits(kernel, window):
    """Under CUDA graphs a plan is made once for the context limit and serves every shorter batch. Each request's
    keys are spread over all the plan's splits (``device.request_split_len``): stage 1 and the merge must agree
    on that length, or the merge drops or double-counts splits (a merge that sized splits by the plan's
    ``split_len`` reads only split 0 of these requests, which fails this comparison)."""
    gen = torch.Generator().manual_seed(22)
    hq, hkv, d, page = 4, 1, 64, 128
    lens = [300, 37, 129, 1]  # every one far below the planned 4096 keys
    table, seq_lens, indptr, indices, slots = page_table_batch(lens, page, gen, window=window)
    params = AttentionParams(d ** -0.5, window=window, sinks=torch.randn(hq, generator=gen).to(DEV))
    plan = plan_decode(len(lens), num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=4096, window=window,
                       page_size=page, kv_dtype=torch.float8_e4m3fn,
                       config=DecodeConfig(kernel=kernel, num_splits=8, block_n=32))
    if window is None:
        assert plan.num_splits == 8 and plan.split_len == 512  # by the plan's split_len, request 0 fits in split 0
    pool = make_pool("mxfp8", slots, hkv, d, page, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).bfloat16().to(DEV)
    out = run_decode(plan, q, pool, params=params, page_table=table, seq_lens=seq_lens, check=False,
                     out=torch.full(q.shape, float("nan"), device=DEV))
    assert rel_err(out, reference_decode(q, pool, indptr, indices, params)) < 5e-4


def test_plan_with_a_workspace_allocates_nothing(monkeypatch):
    ws = DecodeWorkspace(8, 16, 128, 128, "cpu")  # the plan below takes 94 splits

    def no_allocation(*args, **kwargs):
        raise AssertionError("plan_decode allocated")

    for name in ("empty", "zeros", "full", "empty_like"):
        monkeypatch.setattr(torch, name, no_allocation)
    plan = plan_decode(8, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=32768, page_size=128,
                       kv_dtype=torch.float8_e4m3fn, workspace=ws)
    assert plan.num_splits > 1 and plan.part_o.data_ptr() == ws.part_o.data_ptr()


def test_workspace_sizes():
    assert DecodeWorkspace.nbytes_for(4, 16, 128, 3) == 4 * 16 * 3 * 129 * 4
    ws = DecodeWorkspace(4, 16, 128, 3, "cpu")
    assert ws.nbytes == DecodeWorkspace.nbytes_for(4, 16, 128, 3)
    part_o, part_lse = ws.split_buffers(2, 16, 6, 128)  # a smaller batch may split more
    assert tuple(part_o.shape) == (2, 16, 6, 128) and tuple(part_lse.shape) == (2, 16, 6)
    with pytest.raises(ValueError, match=r"workspace too small: .*batch=4 x Hq=16 x num_splits=4 x head_dim=128"):
        ws.split_buffers(4, 16, 4, 128)
    with pytest.raises(ValueError, match="workspace too small"):
        plan_decode(4, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=4096, workspace=ws,
                    config=DecodeConfig(num_splits=8))
    # for_max_context holds every plan plan_decode makes by itself up to that batch and context
    for max_batch, hkv, ctx in ((8, 2, 32768), (32, 1, 4096), (3, 8, 1000), (600, 8, 4096)):
        splits = decode_workspace_splits(max_batch, hkv, ctx)
        ws = DecodeWorkspace.for_max_context(max_batch, hkv * 2, hkv, 64, ctx, "cpu")
        for batch in sorted({1, 2, 3, 5, 8, 17, 32, 100, 255, 256, 257, 600} & set(range(1, max_batch + 1))):
            for seq in (1, 64, 1000, ctx):
                for page_size, window, dtype in ((128, None, torch.float8_e4m3fn), (None, None, torch.bfloat16),
                                                 (128, 100, torch.float8_e4m3fn), (32, None, torch.uint8)):
                    kw = dict(num_q_heads=hkv * 2, num_kv_heads=hkv, head_dim=64, max_seq_len=seq, window=window,
                              page_size=page_size, kv_dtype=dtype)
                    plan = plan_decode(batch, **kw)
                    assert batch * plan.num_splits <= max_batch * splits, (batch, seq, page_size, window)
                    assert plan_decode(batch, workspace=ws, **kw).num_splits == plan.num_splits  # it fits
    # only batches that split need room: the shape stops growing once batches split once
    assert decode_workspace_shape(600, 8, 4096) == decode_workspace_shape(4096, 8, 4096)
    big = DecodeWorkspace.for_max_context(4096, 64, 8, 128, 4096, "cpu")
    assert big.nbytes < DecodeWorkspace.nbytes_for(4096, 64, 128, 1)  # smaller than one row per request


def test_page_table_bad_input_raises_before_any_write():
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, page = 8, 2, 64, 128
    table, seq_lens, indptr, indices, slots = page_table_batch([70, 200], page, gen)
    pool = make_pool("mxfp8", slots, hkv, d, page, gen)
    q = torch.randn(2, hq, d).bfloat16().to(DEV)
    p = AttentionParams(0.1)
    out = torch.full(q.shape, float("nan"), device=DEV)

    def run(**kw):
        args = dict(params=p, page_table=table, seq_lens=seq_lens, page_size=page, out=out)
        args.update(kw)
        return paged_decode_attention(q, pool, **args)

    bad = table.clone()
    bad[1, 1] = slots // page  # one past the pool's last page
    assert slots // page == 4  # pages 1..3 used, page 0 left out
    with pytest.raises(ValueError, match=r"page_table\[1, 1\]=4 is not a page of the pool: page ids must be in "
                                         r"\[0, 4\)"):
        run(page_table=bad)
    bad[1, 1] = -2
    with pytest.raises(ValueError, match=r"page_table\[1, 1\]=-2 is not a page"):
        run(page_table=bad)
    with pytest.raises(TypeError, match="page_table must be a 2-D int32 tensor"):
        run(page_table=table.long())
    with pytest.raises(TypeError, match="page_table must be a 2-D int32 tensor"):
        run(page_table=table[0])
    with pytest.raises(TypeError, match="seq_lens must be a 1-D int32/int64 tensor"):
        run(seq_lens=seq_lens.float())
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=300 exceeds page_table's max_pages=2 x page_size=128"):
        run(seq_lens=torch.tensor([70, 300], dtype=torch.int32, device=DEV), page_table=table[:, :2])
    with pytest.raises(ValueError, match=r"seq_lens\[0\]=0: every request needs at least one key"):
        run(seq_lens=torch.tensor([0, 200], dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="page_table and seq_lens must have batch = 2 rows"):
        run(page_table=table[:1])
    with pytest.raises(ValueError, match="page_size must be a positive multiple of 16 with a page_table"):
        run(page_size=None)
    with pytest.raises(ValueError, match="page_size must be a positive multiple of 16 with a page_table"):
        run(page_size=8)
    with pytest.raises(ValueError, match="max_seq_len=100 is below the longest request's 200 keys"):
        run(max_seq_len=100)
    with pytest.raises(ValueError, match="either kv_indptr and kv_indices .* or page_table and seq_lens, not both"):
        paged_decode_attention(q, pool, indptr, indices, p, page_table=table, seq_lens=seq_lens, page_size=page)
    with pytest.raises(ValueError, match="not neither"):
        paged_decode_attention(q, pool, params=p)
    plan = plan_decode(2, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=200)
    with pytest.raises(ValueError, match="page_table needs a plan made with page_size"):
        run_decode(plan, q, pool, params=p, page_table=table, seq_lens=seq_lens)
    assert torch.isnan(out).all()  # nothing was written


EXTEND_MODES = {
    "inkling": lambda t, hq, d, g: AttentionParams(1.0 / d, rel_bias=torch.randn(t, hq, 48, generator=g)),
    "generic-local": lambda t, hq, d, g: AttentionParams(d ** -0.5, window=40, logit_cap=3.0,
                                                         sinks=torch.randn(hq, generator=g)),
}


@pytest.mark.parametrize("mode", sorted(EXTEND_MODES))
def test_page_table_extend_matches_reference(mode):
    gen = torch.Generator().manual_seed(31 + len(mode))
    hq, hkv, d, page = 4, 2, 64, 16
    qlens, prefixes = [5, 3, 1], [70, 0, 33]
    lens = [q + p for q, p in zip(qlens, prefixes)]
    params = EXTEND_MODES[mode](sum(qlens), hq, d, gen)
    table, seq_lens, indptr, indices, slots = page_table_batch(lens, page, gen, window=params.window,
                                                               query_lens=qlens)
    if params.window is not None:
        assert int(table[0, 0]) == NULL  # request 0's first query sees keys from 70 - 40 + 1 = 31 on
    pool = make_pool("mxfp8", slots, hkv, d, page, gen)
    qo = torch.tensor([0] + qlens).cumsum(0).to(torch.int32).to(DEV)
    q = torch.randn(sum(qlens), hq, d, generator=gen).bfloat16().to(DEV)
    params = on_device(params)
    ref = reference_extend(q, pool, indptr, indices, qo, params)
    out = paged_extend_attention(q, pool, qo_indptr=qo, params=params, page_table=table, seq_lens=seq_lens,
                                 page_size=page, block_n=16, out=torch.full(q.shape, float("nan"), device=DEV))
    assert rel_err(out, ref) < 1e-5
    bad = table.clone()
    bad[2, 2] = 10**6
    with pytest.raises(ValueError, match=r"page_table\[2, 2\]=1000000 is not a page of the pool"):
        paged_extend_attention(q, pool, qo_indptr=qo, params=params, page_table=bad, seq_lens=seq_lens,
                               page_size=page)
