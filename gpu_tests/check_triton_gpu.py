"""GPU checks of the Triton kernels at real shapes (run on the GPU machine; CI has no GPU).

Every check draws fresh random inputs (the seed is printed) and poisons outputs with NaN before each run:
  1. store_kv_mxfp8: every stored data and scale byte identical to ``mxfp8.quantize`` + ``ScaleLayout.scatter``
     (interleaved page-128 and flat layouts; wide dynamic range, zero blocks, NaN/inf blocks, e4m3 ties);
     store_kv_unquantized: the bytes of two indexed writes (bf16 and fp16 pools, 2, 3 and 8 KV heads); the rail
     gather kernel (gather_rails) against the torch gather.
  2. decode over an MXFP8 pool against float64 attention on the same quantized K/V (``reference.attention.attend``
     in float64): Inkling mode (1/D, rel_bias, local window) and generic mode (1/sqrt(D), window, sinks, cap),
     one split and many, float32 output, for every configuration in DECODE_CONFIGS (per-token indices; whole pages
     as a CSR and as a page table, with plan_decode's choice, the block kernel, the tile kernel). Bound: relative Frobenius error <= 4e-3 (2**-8,
     the unit roundoff of bf16: the kernels round only the probabilities (times a power of two) to fp16 for the
     p.V dot, e4m3 -> fp16 being exact; a bf16 output would add its own rounding, about 2.5e-3).
  3. format error against the unquantized bf16 K/V (float64 attention), MXFP8 next to per-tensor fp8
     (scale = amax / 448), on Gaussian data and on data with 1e4x outlier channels; MXFP8 must be the smaller on the
     ordinary channels of the outlier data.
  4. extend over an MXFP8 prefix against float64, and its speed next to the same kernel over a bf16 pool.
After each pool's decodes, every stored data and scale byte must be as the store left it (decode only reads).
Prints one line per check and a summary; exits 1 if any check failed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import attend  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import DecodeConfig, paged_decode_attention  # noqa: E402
from sglang_inkling_backend.triton import (paged_extend_attention, store_kv_mxfp8,  # noqa: E402
                                          store_kv_unquantized)

# GPU_CHECKS_SMOKE=1: the same checks at tiny sizes on the CPU under TRITON_INTERPRET=1, to catch script errors
# before spending device time (the interpreter dots in float32, so its errors are far under the bounds)
SMOKE = os.environ.get("GPU_CHECKS_SMOKE") == "1"
DEV = "cpu" if SMOKE else "cuda"
SHRINK = int(os.environ.get("GPU_CHECKS_SHRINK", "64")) if SMOKE else 1
DECODE_TOL = 4e-3
# DECODE_PLAN_OPTIONS='{"map": "table", "block_n": 32, ...}': check one kernel configuration (DecodeConfig fields,
# and "map": "csr" / "pages" / "table") instead of DECODE_CONFIGS
PLAN_OPTIONS = json.loads(os.environ.get("DECODE_PLAN_OPTIONS", "{}") or "{}")
# GPU_CHECKS_HOPPER_CONSTEXPRS='{"HEADS_ONCE": true}': the Gluon Hopper kernel's variant constexprs for every launch
# of it (decode_hopper.EXTRA_CONSTEXPRS, as bench_decode.py's BENCH_HOPPER_VARIANTS)
HOPPER_CONSTEXPRS = json.loads(os.environ.get("GPU_CHECKS_HOPPER_CONSTEXPRS", "{}") or "{}")
# GPU_CHECKS_DECODE_SHAPES='8/8/128,32/2/128': the decode checks' (Hq/Hkv/D) shapes instead of the four defaults
# (GQA 8, 32, 4 and 16: the Hopper kernel splits a group past 8 heads across programs, plan.hopper_head_split)
DECODE_SHAPES = [tuple(int(x) for x in s.split("/")) for s in
                 (os.environ.get("GPU_CHECKS_DECODE_SHAPES") or "16/2/128,64/8/128,4/1/256,64/4/128").split(",")]
RESULTS = []


def record(name, ok, **info):
    RESULTS.append({"check": name, "ok": bool(ok), **info})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(info)}", flush=True)


def empty_mx_pool(slots, hkv, d, page):
    layout = ScaleLayout.for_pool(slots, hkv, d, page)
    fill = lambda: torch.full((slots, hkv, d), 0x55, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    return PagedKV(fill(), fill(), layout.empty(DEV), layout.empty(DEV), layout)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------------------------------------------------------
def check_store():
    for hkv, d, page in ((8, 128, 128), (1, 256, 128), (2, 128, 64)):
        slots, n = (1 << 17) // SHRINK, 50_000 // SHRINK
        pool = empty_mx_pool(slots, hkv, d, page)
        loc = torch.randperm(slots, device=DEV)[:n]
        spread = torch.exp2(torch.randint(-30, 30, (n, hkv, d // 32, 1), device=DEV).float())
        k = (torch.randn(n, hkv, d // 32, 32, device=DEV) * spread).reshape(n, hkv, d).bfloat16()
        v = (torch.randn(n, hkv, d, device=DEV) * 3).bfloat16()
        k[:100 // SHRINK] = 0  # all-zero blocks get exponent 19
        k[100 // SHRINK:200 // SHRINK, :, :32] = torch.tensor(448.0 * 2.0 ** -7, device=DEV)  # amax exactly 448 * 2**k
        v[200, 0, 5] = float("nan")
        v[201, 0, 40] = float("inf")
        k[202, 0, 64] = float("-inf")
        # e4m3 rounding ties in the scaled domain of a block whose amax is 448 (scale 1)
        ties = torch.tensor([448.0, 1.0625, 1.1875, 13.0, 2 ** -9 * 1.5, 2 ** -10, 3 * 2 ** -10, -0.0, 0.3125,
                             -17.0, 208.0, 2 ** -6 * 1.0625], device=DEV)
        v[203, 0, : ties.numel()] = ties.bfloat16()
        v[203, 0, ties.numel():32] = 0
        store_kv_mxfp8(pool, loc, k, v)
        sync()
        ref = empty_mx_pool(slots, hkv, d, page)
        kd, ks = mxfp8.quantize(k)
        vd, vs = mxfp8.quantize(v)
        ref.k_buffer[loc], ref.v_buffer[loc] = kd, vd
        ref.layout.scatter(ref.k_scales, loc, ks)
        ref.layout.scatter(ref.v_scales, loc, vs)
        bad = {name: int((getattr(pool, name).view(torch.uint8) != getattr(ref, name).view(torch.uint8)).sum())
               for name in ("k_buffer", "v_buffer", "k_scales", "v_scales")}
        record(f"store_kv_mxfp8 Hkv={hkv} D={d} page={page} N={n}", all(b == 0 for b in bad.values()),
               mismatching_bytes=bad)
    # the 16-bit copy store (store_kv_unquantized) against two indexed writes; 3 KV heads: the head block masked
    for hkv, d, dtype in ((8, 128, torch.bfloat16), (3, 256, torch.float16), (2, 64, torch.bfloat16)):
        slots, n = (1 << 17) // SHRINK, 50_000 // SHRINK
        loc = torch.randperm(slots, device=DEV)[:n]
        k, v = (torch.randn(n, hkv, d, device=DEV) * 7).to(dtype), (torch.randn(n, hkv, d, device=DEV) * 7).to(dtype)
        fill = torch.randn(slots, hkv, d, device=DEV).to(dtype)
        pool, ref = PagedKV(fill.clone(), fill.clone()), PagedKV(fill.clone(), fill.clone())
        store_kv_unquantized(pool, loc, k, v)
        sync()
        ref.k_buffer[loc], ref.v_buffer[loc] = k, v
        bad = {name: int((getattr(pool, name).view(torch.uint8) != getattr(ref, name).view(torch.uint8)).sum())
               for name in ("k_buffer", "v_buffer")}
        record(f"store_kv_unquantized {dtype} Hkv={hkv} D={d} N={n}", all(b == 0 for b in bad.values()),
               mismatching_bytes=bad)


def check_gather_rails():
    """The rail-slot gather kernel (the route's gather_rail_slots, before every decode-graph replay) against torch, at
    serving shapes: 128 requests of up to 4096 keys, full and a 1024-key window."""
    from sglang_inkling_backend import rails
    from sglang_inkling_backend.triton.gather_rails import gather_rail_slots

    bs, width = 128, 4096 // (SHRINK if SMOKE else 1)
    req_to_token = torch.randint(1, 1 << 22, (bs + 8, width), dtype=torch.int32, device=DEV)
    rows = torch.randperm(bs + 8, device=DEV)[:bs]
    lens = torch.randint(1, width + 1, (bs,))
    for window in (None, 1024 // (SHRINK if SMOKE else 1)):
        start = None if window is None else rails.window_start(lens, torch.ones_like(lens), window)
        got = rails.gather_rails_host_lengths(req_to_token, rows, lens, start, gather_slots=gather_rail_slots)
        want = rails.gather_rails_host_lengths(req_to_token, rows, lens, start)
        sync()
        ok = torch.equal(got.indptr, want.indptr) and torch.equal(got.indices, want.indices)
        record(f"gather_rails B={bs} width={width} window={window}", ok, keys=int(want.indptr[-1]))


# ---------------------------------------------------------------------------------------------------------------
def make_batch(hkv, d, lens, page=128, whole_pages=False):
    """Random K/V and a batch's slots: any slot per token, or (``whole_pages``) whole pages in random order, as
    SGLang's paged allocator hands them out (token t in slot page_table[t // page] * page + t % page)."""
    total = sum(lens)
    pages = sum((n + page - 1) // page for n in lens) + 2
    slots = pages * page
    k = torch.randn(slots, hkv, d, device=DEV)
    v = torch.randn(slots, hkv, d, device=DEV)
    k, v = k.bfloat16(), v.bfloat16()
    indptr = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    if not whole_pages:
        indices = (torch.randperm(slots - page, device=DEV)[:total] + page).to(torch.int32)  # never slot 0's page
    else:
        order = torch.randperm(pages - 1, device=DEV) + 1
        parts, used = [], 0
        for n in lens:
            t = torch.arange(n, device=DEV)
            parts.append(order[used + t // page] * page + t % page)
            used += (n + page - 1) // page
        indices = torch.cat(parts).to(torch.int32)
    return k, v, indptr, indices, slots


def page_table_of(indptr, indices, page=128):
    """The page table of a whole-pages batch (``make_batch(..., whole_pages=True)``): ``[B, max_pages]`` int32 page
    ids (a spare column of -1, never read) and ``seq_lens [B]``."""
    lens = indptr.diff()
    max_pages = int((lens + page - 1).div(page, rounding_mode="floor").max()) + 1
    table = torch.full((lens.numel(), max_pages), -1, dtype=torch.int32, device=DEV)
    for b in range(lens.numel()):
        a, e = int(indptr[b]), int(indptr[b + 1])
        firsts = indices[a:e:page].long()
        table[b, :firsts.numel()] = (firsts // page).to(torch.int32)
    return table, lens.to(torch.int32)


def decode(q, pool, indptr, indices, params, map_kind, config, num_splits, out, table=None):
    """paged_decode_attention over the batch as a per-token CSR ("csr"), a CSR of whole pages ("pages") or its page
    table ("table"), with ``config`` (DecodeConfig fields; empty: plan_decode's choice)."""
    options = dict(config=DecodeConfig(**config))
    if map_kind == "table":
        page_table, seq_lens = table if table is not None else page_table_of(indptr, indices)
        return paged_decode_attention(q, pool, params=params, page_table=page_table, seq_lens=seq_lens,
                                      page_size=128, num_splits=num_splits, out=out, plan_options=options)
    return paged_decode_attention(q, pool, indptr, indices, params, num_splits=num_splits, out=out,
                                  page_size=128 if map_kind == "pages" else None, plan_options=options)


def mx_pool_from(k, v, page):
    slots, hkv, d = k.shape
    pool = empty_mx_pool(slots, hkv, d, page)
    store_kv_mxfp8(pool, torch.arange(slots, device=DEV), k, v)
    return pool


def reference_f64(q, kv, indptr, indices, params, float_kv=None):
    """float64 attention per request, on kv's dequantized values (or on ``float_kv=(k, v)``)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=DEV)
    for b in range(q.shape[0]):
        a, e = int(indptr[b]), int(indptr[b + 1])
        sl = indices[a:e].long()
        if float_kv is None:
            kk, vv = kv.read(sl)
        else:
            kk, vv = float_kv[0][sl], float_kv[1][sl]
        bias = params.rel_bias[b:b + 1] if params.rel_bias is not None else None
        p64 = AttentionParams(params.softmax_scale, params.window, None, params.logit_cap,
                              params.sinks.double() if params.sinks is not None else None)
        out[b:b + 1] = attend(q[b:b + 1].double(), torch.tensor([e - a - 1], device=DEV), kk.double(), vv.double(),
                              p64, bias.double() if bias is not None else None)
    return out


# Kernel configurations checked, (map, DecodeConfig fields): the per-token-index tile kernel, plan_decode's own
# choice for whole pages (as a CSR and as a page table), and each paged kernel forced (so both kernels are covered
# whatever the choice picks at these shapes)
BLOCKS = {"kernel": "blocks", "block_n": 32, "num_warps": 1, "num_stages": 3}
TILES = {"kernel": "tiles", "block_n": 64, "num_warps": 4, "num_stages": 3}
DECODE_CONFIGS = {
    "per-token": ("csr", {}),
    "pages(auto)": ("pages", {}),
    "pages(blocks)": ("pages", BLOCKS),
    "pages(tiles)": ("pages", TILES),
    "table(auto)": ("table", {}),
    "table(blocks)": ("table", BLOCKS),
    "table(tiles)": ("table", TILES),
    # the merge over 32-channel blocks (what choose_merge_block_d picks for single requests; these batches of 9
    # have enough (request, head) pairs for whole heads)
    "table(auto,merge-32)": ("table", {"merge_block_d": 32}),
}
HOPPER = {"kernel": "hopper"}  # the Gluon kernel (sm_90a): main() adds "table(hopper)" on an H100/H200
# and its half-page tiles, 2 stages (head_dim 256 fits its registers only so: plan.HOPPER_BLOCK_NS)
HOPPER_HALF_PAGE = {"kernel": "hopper", "block_n": 64, "num_stages": 2}
# the warp-specialized kernel (decode_hopper_ws), in the tiles and stages of plan.hopper_ws_config and on half pages
HOPPER_WS = {"kernel": "hopper_ws"}
HOPPER_WS_HALF_PAGE = {"kernel": "hopper_ws", "block_n": 64, "num_stages": 2}


def check_decode():
    if PLAN_OPTIONS:
        env = dict(PLAN_OPTIONS)
        configs = {"env": (env.pop("map", "table"), env)}
    else:
        configs = DECODE_CONFIGS
    for hq, hkv, d in DECODE_SHAPES:
        lens = [int(x) for x in torch.randint(1, 12000 // SHRINK, (6,))] + [1, 129, 20000 // SHRINK]
        b = len(lens)
        q = torch.randn(b, hq, d, device=DEV).bfloat16()
        modes = {
            "inkling": AttentionParams(1.0 / d, rel_bias=torch.randn(b, hq, 1024, device=DEV).bfloat16() * 2),
            "inkling-local": AttentionParams(1.0 / d, window=512, rel_bias=torch.randn(b, hq, 512, device=DEV) * 2),
            "generic": AttentionParams(d ** -0.5, window=4096, logit_cap=30.0,
                                       sinks=torch.randn(hq, device=DEV) * 3),
        }
        batches = {whole: make_batch(hkv, d, lens, whole_pages=whole) for whole in (False, True)}
        for whole, (k, v, indptr, indices, slots) in batches.items():
            pool = mx_pool_from(k, v, 128)
            stored = [t.clone() for t in (pool.k_buffer, pool.v_buffer, pool.k_scales, pool.v_scales)]
            table = page_table_of(indptr, indices) if whole else None
            for mode, params in modes.items():
                ref = reference_f64(q, pool, indptr, indices, params)
                for cname, (map_kind, config) in configs.items():
                    if (map_kind != "csr") != whole:
                        continue
                    for ns in (None, 1, 64):
                        out = torch.full(q.shape, float("nan"), device=DEV)
                        name = f"decode mxfp8 {hq}/{hkv}/{d} {mode} {cname} splits={ns}"
                        try:  # a configuration that raises fails its own checks, not the rest of the run
                            decode(q, pool, indptr, indices, params, map_kind, config, ns, out, table)
                            sync()
                        except Exception as e:  # noqa: BLE001
                            record(name, False, error=repr(e)[:400])
                            continue
                        err = rel_err(out, ref)
                        nan = int(torch.isnan(out).sum())
                        record(name, nan == 0 and err <= DECODE_TOL, rel_err=err, nan=nan,
                               max_abs=float((out.double() - ref).abs().max()))
            # decode only reads the pool: every stored data and scale byte as the store left it
            changed = sum(int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) for a, b in zip(
                stored, (pool.k_buffer, pool.v_buffer, pool.k_scales, pool.v_scales)))
            record(f"decode mxfp8 {hq}/{hkv}/{d} {'pages' if whole else 'per-token'}: pool bytes untouched",
                   changed == 0, changed_bytes=changed)
        # the bf16 pool through the same kernels
        k, v, indptr, indices, slots = batches[True]
        params = modes["inkling"]
        ref = reference_f64(q, None, indptr, indices, params, float_kv=(k.float(), v.float()))
        for cname in ("per-token", "pages(auto)", "table(auto)", "table(blocks)"):
            map_kind, config = DECODE_CONFIGS[cname]
            out = torch.full(q.shape, float("nan"), device=DEV)
            decode(q, PagedKV(k, v), indptr, indices, params, map_kind, config, None, out)
            sync()
            err = rel_err(out, ref)
            record(f"decode bf16 {hq}/{hkv}/{d} inkling {cname}", not torch.isnan(out).any() and err <= DECODE_TOL,
                   rel_err=err)


def check_format_error():
    """MXFP8 vs per-tensor fp8 (scale = amax / 448) against the unquantized bf16 K/V, through the kernel. With 4 of
    128 channels scaled by 1e4 the outliers dominate the output's norm (both formats keep e4m3's relative precision
    on them), so the comparison that matters is on the 124 ordinary channels, which a per-tensor scale pushes into
    e4m3's subnormals: MXFP8 must be the smaller there (bench/format_error.py has the sweep over outlier sizes)."""
    hq, hkv, d = 16, 2, 128
    for data, outlier in (("gaussian", None), ("outlier-channels x1e4", 1e4)):
        lens = [4096 // SHRINK] * 4
        k, v, indptr, indices, slots = make_batch(hkv, d, lens)
        normal = torch.ones(d, dtype=torch.bool, device=DEV)
        scale = d ** -0.5
        if outlier:
            ch = torch.randperm(d, device=DEV)[:4]
            normal[ch] = False
            k[:, :, ch] = (k[:, :, ch].float() * outlier).bfloat16()
            v[:, :, ch] = (v[:, :, ch].float() * outlier).bfloat16()
            scale = 1.0 / (d * outlier)  # keeps the softmax away from one-hot
        q = torch.randn(len(lens), hq, d, device=DEV).bfloat16()
        params = AttentionParams(scale)
        ref = reference_f64(q, None, indptr, indices, params, float_kv=(k.float(), v.float()))
        pool = mx_pool_from(k, v, 128)
        out_mx = torch.full(q.shape, float("nan"), device=DEV)
        paged_decode_attention(q, pool, indptr, indices, params, out=out_mx)
        ks, vs = float(k.float().abs().max()) / 448.0, float(v.float().abs().max()) / 448.0
        fp8 = PagedKV((k.float() / ks).to(torch.float8_e4m3fn), (v.float() / vs).to(torch.float8_e4m3fn),
                      k_scale=ks, v_scale=vs)
        out_f8 = torch.full(q.shape, float("nan"), device=DEV)
        paged_decode_attention(q, fp8, indptr, indices, params, out=out_f8)
        sync()
        e_mx, e_f8 = rel_err(out_mx, ref), rel_err(out_f8, ref)
        n_mx = rel_err(out_mx[..., normal], ref[..., normal])
        n_f8 = rel_err(out_f8[..., normal], ref[..., normal])
        # the format alone (float64 attention on dequantized values), to separate it from kernel rounding
        f_mx = rel_err(reference_f64(q, pool, indptr, indices, params).float(), ref)
        f_f8 = rel_err(reference_f64(q, fp8, indptr, indices, params).float(), ref)
        ok = (n_mx < n_f8) if outlier else True
        record(f"format error vs bf16 KV, {data}", ok, mxfp8_kernel=e_mx, fp8_per_tensor_kernel=e_f8,
               mxfp8_kernel_ordinary_channels=n_mx, fp8_per_tensor_kernel_ordinary_channels=n_f8,
               mxfp8_format_only=f_mx, fp8_format_only=f_f8)


def check_extend():
    for hq, hkv, d in ((16, 2, 128), (64, 8, 128)):
        qlens, prefix = [1024 // SHRINK, 300 // SHRINK, 2048 // SHRINK, 1], [4096 // SHRINK, 100, 8192 // SHRINK, 5000 // SHRINK]
        lens = [a + b for a, b in zip(qlens, prefix)]
        k, v, indptr, indices, slots = make_batch(hkv, d, lens)
        pool = mx_pool_from(k, v, 128)
        qo = torch.tensor([0] + qlens, device=DEV).cumsum(0).to(torch.int32)
        t = int(qo[-1])
        q = torch.randn(t, hq, d, device=DEV).bfloat16()
        params = AttentionParams(1.0 / d, rel_bias=torch.randn(t, hq, 1024, device=DEV) * 2)
        out = torch.full(q.shape, float("nan"), device=DEV)
        paged_extend_attention(q, pool, indptr, indices, qo, params, out=out)
        sync()
        ref = torch.empty(q.shape, dtype=torch.float64, device=DEV)
        for bi in range(len(qlens)):
            a, e = int(indptr[bi]), int(indptr[bi + 1])
            kk, vv = pool.read(indices[a:e].long())
            q0, q1 = int(qo[bi]), int(qo[bi + 1])
            pos = torch.arange(e - a - (q1 - q0), e - a, device=DEV)
            ref[q0:q1] = attend(q[q0:q1].double(), pos, kk.double(), vv.double(), params,
                                params.rel_bias[q0:q1].double())
        err = rel_err(out, ref)
        record(f"extend mxfp8 {hq}/{hkv}/{d}", not torch.isnan(out).any() and err <= DECODE_TOL, rel_err=err)
        # the same batch on whole pages, through the page table (the kernel reads the page ids)
        k2, v2, indptr2, indices2, _ = make_batch(hkv, d, lens, whole_pages=True)
        pool2 = mx_pool_from(k2, v2, 128)
        page_table, seq_lens = page_table_of(indptr2, indices2)
        out2 = torch.full(q.shape, float("nan"), device=DEV)
        paged_extend_attention(q, pool2, qo_indptr=qo, params=params, page_table=page_table, seq_lens=seq_lens,
                               page_size=128, out=out2)
        want = torch.full(q.shape, float("nan"), device=DEV)
        paged_extend_attention(q, pool2, indptr2, indices2, qo, params, out=want)  # the CSR of the same pages
        sync()
        diff = rel_err(out2, want.double())
        record(f"extend mxfp8 {hq}/{hkv}/{d} page table = CSR", not torch.isnan(out2).any() and diff <= 1e-6,
               rel_diff=diff)
        if SMOKE:
            continue
        bf = PagedKV(k, v)
        ms_mx = triton.testing.do_bench(lambda: paged_extend_attention(q, pool, indptr, indices, qo, params,
                                                                       out=out, validate=False), rep=100)
        ms_bf = triton.testing.do_bench(lambda: paged_extend_attention(q, bf, indptr, indices, qo, params,
                                                                       out=out, validate=False), rep=100)
        record(f"extend speed {hq}/{hkv}/{d} qlens={qlens} prefix={prefix}", True, ms_mxfp8=ms_mx, ms_bf16=ms_bf,
               mxfp8_over_bf16=ms_mx / ms_bf)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def main():
    seed = int(time.time() * 1000) % (2 ** 31)
    torch.manual_seed(seed)
    name = "cpu (smoke)" if SMOKE else torch.cuda.get_device_name()
    print(f"plan options {PLAN_OPTIONS or 'defaults'}", flush=True)
    if HOPPER_CONSTEXPRS:
        from sglang_inkling_backend.triton import decode_hopper
        decode_hopper.EXTRA_CONSTEXPRS.update(HOPPER_CONSTEXPRS)
        print(f"Hopper kernel constexprs {HOPPER_CONSTEXPRS}", flush=True)
    print(f"seed {seed} device {name} torch {torch.__version__} triton {triton.__version__}",
          flush=True)
    if not SMOKE and torch.cuda.get_device_capability() >= (9, 0) and torch.version.hip is None:
        DECODE_CONFIGS["table(auto,pdl)"] = ("table", {"pdl_merge": True})  # the merge launched early
    if not SMOKE and torch.cuda.get_device_capability() == (9, 0):
        DECODE_CONFIGS["table(hopper)"] = ("table", HOPPER)
        DECODE_CONFIGS["table(hopper,64)"] = ("table", HOPPER_HALF_PAGE)
        DECODE_CONFIGS["table(hopper_ws)"] = ("table", HOPPER_WS)
        DECODE_CONFIGS["table(hopper_ws,64)"] = ("table", HOPPER_WS_HALF_PAGE)
        DECODE_CONFIGS["pages(hopper_ws)"] = ("pages", HOPPER_WS)  # a CSR of whole pages
    # GPU_CHECKS_ONLY=check_decode,check_store: only those checks
    only = [n for n in os.environ.get("GPU_CHECKS_ONLY", "").split(",") if n]
    for fn in (check_store, check_gather_rails, check_decode, check_format_error, check_extend):
        if only and fn.__name__ not in only:
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            record(fn.__name__, False, error=repr(e)[:400])
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_checks.json"), "w") as f:
            json.dump({"seed": seed, "plan_options": PLAN_OPTIONS, "hopper_constexprs": HOPPER_CONSTEXPRS,
                       "results": RESULTS}, f, indent=1)
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} GPU checks passed" + (f"; FAILED: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
