"""Paged decode attention on one GPU, ours next to the peers, in one run.

Measures, on the grid Hq/Hkv/D in {16/2/128, 64/8/128, 4/1/256} x batch {1, 8, 32, 128} x context {1k, 4k, 16k,
32k}, page size 128, softmax scale 1/D, random data:
  - ``copy``: the device copy ceiling (bytes read + written per second of a 2 GiB device-to-device copy),
  - ``ours_mxfp8``: this package's Triton decode over an MXFP8 pool (interleaved scales),
  - ``ours_bf16``: the same kernel over a bf16 pool,
  - ``flashinfer_bf16`` / ``flashinfer_fp8``: FlashInfer's BatchDecodeWithPagedKVCacheWrapper (FA2 tensor-core
    decode) over bf16 KV and over fp8 e4m3 KV with a per-tensor scale,
  - ``flashinfer_xqa_bf16`` / ``flashinfer_xqa_fp8`` (FlashInfer >= 0.7 only): TensorRT-LLM's XQA decode through
    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache(..., backend="xqa")``, NHD pages of 128, per-tensor fp8
    (what vLLM runs by default on Hopper),
  - ``hpcops_fp8`` (when ``BENCH_HPCOPS_SO`` names a build of bench/peers/hpc_ops/): Tencent HPC-Ops' SM90
    ``attention_decode_fp8`` (dynamic task map), the same per-tensor fp8 copy read as 64-token pages (a view of our
    128-slot pages), Q quantized beforehand per (token, head) as that op requires (not timed); head_dim 128 and
    Hq/Hkv 4 or 8 only,
  - ``sdpa_bf16``: torch SDPA over contiguous (unpaged) bf16 KV.
Every peer row names its library and version (``library``) and backend. Every kernel's output is checked against a
float64 reference on the values that kernel reads (bf16, the fp8 copy, or the MXFP8 pool dequantized) for the
first ``CHECK_REQUESTS`` requests: ``rel_err`` (relative Frobenius) and ``correct`` (``rel_err <=
tolerance(kernel)``) on each row, so a fast wrong peer is seen as wrong and never sets the bar
(``print_table`` ignores it).
GB/s = bytes of KV (+ MXFP8 scale bytes) that must be read / median time of one call replayed from a CUDA graph
(as SGLang runs decode; ``triton.testing.do_bench`` around the replay, which clears the L2 between runs), so no
kernel is charged for Python launch overhead; a kernel that cannot be captured is timed eagerly and its row says
``"timing": "eager"``. ``ours_mxfp8_eager`` is ours without a graph, for reference. The same page table (a random
permutation of pages) feeds every paged kernel.

Writes ``<out>/<date>-<gpu>.json`` (a list of rows {"kernel","shape","Hq","Hkv","D","B","ctx","ms","GBps"}),
``<out>/<date>-<gpu>.png`` (GB/s against context per kernel) and prints a table with our ratios to FlashInfer.
Ours reads the page table (``run_decode(..., page_table=, seq_lens=)``) with ``plan_decode(page_size=128,
kv_dtype=...)``'s own configuration (``choose_config``) and split buffers in a ``DecodeWorkspace``; kernel variants
are compared in ``bench/sweep_decode_variants.py``.

Run on the GPU machine (FlashInfer carried, see bench/results/current/README.md; 0.5.3 has FA2 only, 0.7.2.post1
adds the XQA rows and travels as the trimmed bundle of bench/pack_flashinfer072.sh; its kernels JIT-build on first
use):
    python bench/bench_decode.py --out $OUT
    python bench/bench_decode.py --table $OUT/<date>-<gpu>.json    # the table again, here, checks re-applied
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import DecodeConfig, DecodeWorkspace, plan_decode, run_decode  # noqa: E402
from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8  # noqa: E402

try:
    from sglang_inkling_backend.triton import decode_hopper  # Gluon: imports where Triton has it
except ImportError:
    decode_hopper = None

PAGE = 128
CHECK_REQUESTS = 2
# The GPU checks' decode bound (gpu_tests/check_triton_gpu.py DECODE_TOL): 2**-8, bf16 output rounding.
CHECK_TOL = 4e-3
# XQA's Hopper kernel computes in the cache's element type (mha_sm90.cu: MathElem = CacheElem): Q and the
# probabilities P are rounded to it before its two GEMMs, to e4m3 over an fp8 cache (3 mantissa bits, unit roundoff
# 2**-4), to bf16 over a bf16 one (2**-8). Such a kernel is held to the output's rounding (CHECK_TOL) plus P's unit
# roundoff: rounding Q and P to e4m3 in a float64 reference gives 2.1-2.7% relative error on random data like
# this grid's (bench/e4m3_math_error.py), so 2**-4 + 2**-8 passes that precision and fails a wrong page, scale or window,
# which is off by far more. Each row records its tol, and its rel_err says what the precision costs.
# HPC-Ops' fp8 decode rounds Q and P to e4m3 the same way (bench/peers/hpc_ops/README.md).
P_ROUNDOFF = {"flashinfer_xqa_fp8": 2 ** -4, "flashinfer_xqa_bf16": 2 ** -8, "hpcops_fp8": 2 ** -4}


def tolerance(kernel=None):
    """The check's bound on a kernel's relative error against float64 on the values it reads."""
    return CHECK_TOL + P_ROUNDOFF.get(kernel, 0.0)
SHAPES = [("inkling-tp4", 16, 2, 128), ("gqa8-tp1", 64, 8, 128), ("gemma3-270m", 4, 1, 256)]
BATCHES = [1, 8, 32, 128]
CTXS = [1024, 4096, 16384, 32768]
# Shapes users serve off the grid (Hq/Hkv/D per rank), for --points: issue #34's table, one point each
# (--points issue34).
MORE_SHAPES = [("qwen2.5-7b", 28, 4, 128), ("qwen2.5-32b", 40, 8, 128), ("llama3-70b-tp8", 8, 1, 128),
               ("llama3-8b", 32, 8, 128), ("gemma2-9b", 16, 8, 256), ("qwen3-235b-gqa16", 64, 4, 128),
               # head_dim 64 (no grid shape has it; the Hopper kernels compile for it, plan.hopper_decode_fits
               # leaves it to the Triton kernels until timed)
               ("llama3.2-1b", 32, 8, 64), ("gpt-oss-20b", 64, 8, 64)]
POINT_SETS = {"issue34": "qwen2.5-7b:64:8192,qwen2.5-32b:16:65536,llama3-70b-tp8:96:16384,llama3-8b:48:24576,"
                         "gqa8-tp1:256:4096,inkling-tp4:1:131072,gemma2-9b:32:16384,qwen3-235b-gqa16:32:32768",
              "headdim64": "llama3.2-1b:64:8192,llama3.2-1b:8:32768,gpt-oss-20b:32:32768,gpt-oss-20b:128:4096"}


def grid_points(spec: str) -> list:
    """``--points``: comma-separated items, each ``shape:B:ctx`` with a name of SHAPES or MORE_SHAPES, a name of
    POINT_SETS, or ``grid`` (every SHAPES x BATCHES x CTXS point), e.g. ``grid,issue34``: one run, one JSON."""
    by_name = {s[0]: s for s in SHAPES + MORE_SHAPES}
    grid = []
    for item in spec.split(","):
        if item == "grid":
            grid += [(s, b, c) for s in SHAPES for b in BATCHES for c in CTXS]
            continue
        for point in POINT_SETS.get(item, item).split(","):
            parts = point.split(":")
            if len(parts) != 3 or parts[0] not in by_name:
                raise ValueError(f"--points: {point!r} is not shape:B:ctx with a shape of {sorted(by_name)} (or "
                                 f"'grid' or one of {sorted(POINT_SETS)})")
            grid.append((by_name[parts[0]], int(parts[1]), int(parts[2])))
    return grid


def bench(fn, warm=5, rep=30):
    return triton.testing.do_bench(fn, warmup=warm, rep=rep, return_mode="median")


def bench_graph(fn, label=""):
    """Median time of one replay of ``fn`` captured in a CUDA graph (as SGLang runs decode), with do_bench's L2
    clearing between replays: kernel time without Python launch overhead. Falls back to plain do_bench (and says
    so) when ``fn`` cannot be captured. Returns (ms, method)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return bench(graph.replay), "cuda_graph"
    except Exception as e:  # noqa: BLE001
        print(f"{label}: CUDA graph capture failed ({repr(e)[:200]}); timing without a graph", flush=True)
        torch.cuda.synchronize()
        return bench(fn), "eager"


def copy_ceiling(dev):
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_(0, 255)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a), rep=50)
    del a, b
    return 2 * n / (ms * 1e-3) / 1e9


def mxfp8_copy(k, v, store=store_kv_mxfp8):
    """An MXFP8 pool (pages of PAGE slots, interleaved scales) holding bf16 ``k``, ``v`` [slots, Hkv, D], written by
    ``store`` (the package's store kernel)."""
    slots, hkv, d = k.shape
    layout = ScaleLayout.for_pool(slots, hkv, d, PAGE)
    mx = PagedKV(torch.empty(slots, hkv, d, device=k.device, dtype=torch.float8_e4m3fn),
                 torch.empty(slots, hkv, d, device=k.device, dtype=torch.float8_e4m3fn),
                 layout.empty(k.device), layout.empty(k.device), layout)
    chunk = 1 << 20  # quantize in chunks: the store kernel's grid has one program per token
    for s0 in range(0, slots, chunk):
        loc = torch.arange(s0, min(slots, s0 + chunk), device=k.device, dtype=torch.int32)
        store(mx, loc, k[s0:s0 + chunk], v[s0:s0 + chunk], validate=False)
    return mx


class Case:
    """One grid point's data: a bf16 page pool, its MXFP8 and fp8 copies, one page table."""

    def __init__(self, Hq, Hkv, D, B, ctx, dev, with_fp8=True, store_mxfp8=store_kv_mxfp8):
        self.Hq, self.Hkv, self.D, self.B, self.ctx = Hq, Hkv, D, B, ctx
        pages_per = math.ceil(ctx / PAGE)
        npages = B * pages_per + 1  # page 0 holds slot 0, SGLang's padding sink: never used
        slots = npages * PAGE
        self.q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
        self.k = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        page_ids = torch.randperm(npages - 1, device=dev, dtype=torch.int32) + 1
        self.page_table = page_ids.view(B, pages_per)
        # per-token slots, position order: page_table[b, i // 128] * 128 + i % 128
        pos = torch.arange(ctx, device=dev, dtype=torch.int32)
        self.kv_indices = (self.page_table[:, pos // PAGE] * PAGE + pos % PAGE).reshape(-1).contiguous()
        self.kv_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * ctx
        self.seq_lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        self.page_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * pages_per
        self.last_page_len = torch.full((B,), ctx - (pages_per - 1) * PAGE, device=dev, dtype=torch.int32)
        self.page_indices = self.page_table.reshape(-1).contiguous()
        self.mx = mxfp8_copy(self.k, self.v, store_mxfp8)
        self.bf = PagedKV(self.k, self.v)
        self.k8 = self.k.to(torch.float8_e4m3fn) if with_fp8 else None
        self.v8 = self.v.to(torch.float8_e4m3fn) if with_fp8 else None
        self.params = AttentionParams(softmax_scale=1.0 / D)
        tokens = B * ctx * Hkv
        self.bytes_bf16 = tokens * D * 2 * 2
        self.bytes_fp8 = tokens * D * 2
        self.bytes_mxfp8 = tokens * (D + D // 32) * 2


def reference_f64(case, read):
    """float64 attention of the first CHECK_REQUESTS requests; ``read(b)`` gives request b's K and V
    ([ctx, Hkv, D], position order)."""
    from sglang_inkling_backend.reference.attention import attend

    refs = []
    for b in range(min(case.B, CHECK_REQUESTS)):
        k, v = read(b)
        refs.append(attend(case.q[b:b + 1].double(), torch.tensor([case.ctx - 1], device=case.q.device),
                           k.double(), v.double(), AttentionParams(softmax_scale=1.0 / case.D)))
    return torch.cat(refs)


def paged_reader(case, read_slots):
    """``reference_f64``'s reader for a paged pool: request b's slots through the page table."""
    return lambda b: read_slots(case.kv_indices[b * case.ctx:(b + 1) * case.ctx].long())


def check(out, ref, kernel=None):
    """(rel_err, correct) of a kernel's output (its first requests) against ``ref`` [requests, Hq, D]: correct
    within ``tolerance(kernel)``."""
    got = out[:ref.shape[0]].reshape(ref.shape).double()
    if torch.isnan(got).any():
        return float("nan"), False
    err = ((got - ref).norm() / ref.norm()).item()
    return err, err <= tolerance(kernel)


def time_ours(case, kv, nbytes, eager=False, config=None):
    workspace = DecodeWorkspace.for_max_context(case.B, case.Hq, case.Hkv, case.D, case.ctx, case.q.device)
    plan = plan_decode(case.B, num_q_heads=case.Hq, num_kv_heads=case.Hkv, head_dim=case.D, max_seq_len=case.ctx,
                       page_size=PAGE, kv_dtype=kv.k_buffer.dtype, workspace=workspace, config=config)
    out = torch.empty_like(case.q)
    fn = lambda: run_decode(plan, case.q, kv, params=case.params, page_table=case.page_table,
                            seq_lens=case.seq_lens, out=out, check=False)
    fn()
    if eager:
        ms = bench(fn)
    else:
        ms, _ = bench_graph(fn, "ours")
    return ms, nbytes / (ms * 1e-3) / 1e9, plan, out


OURS = "sglang_inkling_backend (Triton)"


def load_hpcops():
    """HPC-Ops' fp8 decode when ``BENCH_HPCOPS_SO`` names its built library (bench/peers/hpc_ops/build_and_call.py
    builds it): the module holding its adapters, else None."""
    so = os.environ.get("BENCH_HPCOPS_SO")
    if not so:
        return None
    import importlib.util

    torch.ops.load_library(so)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "hpc_ops", "build_and_call.py")
    spec = importlib.util.spec_from_file_location("hpcops_build_and_call", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def hpcops_call(hpc, case):
    """A call of HPC-Ops' dynamic fp8 decode on ``case``'s fp8 copy, its task map assigned once for the batch's
    lengths (as its own benchmark does; the lengths do not change between replays)."""
    Hkv, D = case.Hkv, case.D
    q8, qscale = hpc.quant_q_per_token_head(case.q)
    kc64, bt64 = hpc.split_pages_nhd(case.k8.view(-1, PAGE, Hkv, D), case.page_table, PAGE, 64)
    vc64, _ = hpc.split_pages_nhd(case.v8.view(-1, PAGE, Hkv, D), case.page_table, PAGE, 64)
    # its softmax scale is fixed at 1/sqrt(D) (one_over_dk_log2e in its launcher) and multiplied by q's and k's
    # scales: a k scale of 1/sqrt(D) makes it the grid's 1/D
    kscale = torch.full((1,), D ** -0.5, device=case.q.device)
    vscale = torch.ones(1, device=case.q.device)
    task_map = hpc.get_attention_decode_task_workspace(case.B, case.ctx, Hkv, min_process_len=64)
    hpc.assign_attention_decode_task(case.seq_lens, task_map, Hkv, 1, True, 64)
    out = torch.empty_like(case.q)
    return lambda: hpc.hpc_decode_fp8(q8, qscale, kc64, vc64, bt64, case.seq_lens, kscale, vscale, task_map, out)


HOPPER = False  # main() sets it: an sm_90 GPU also times the Gluon Hopper kernel (ours_mxfp8_hopper)


def row(kernel, name, case, ms, gbps, **extra):
    r = {"kernel": kernel, "shape": name, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "B": case.B,
         "ctx": case.ctx, "ms": ms, "GBps": gbps}
    r.update(extra)
    return r


def wanted(peer: str) -> bool:
    """Whether this run times ``peer`` (a row name): ``BENCH_PEERS='flashinfer_xqa_fp8,sdpa_bf16'`` keeps those
    peers only (a variant study that needs one peer in the same run and not every peer's JIT builds); all by
    default. Ours are always timed."""
    chosen = os.environ.get("BENCH_PEERS")
    return not chosen or peer in chosen.split(",")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results/current"))
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a few grid points only")
    ap.add_argument("--points", help="these points only: 'shape:B:ctx,...' with a name of SHAPES or MORE_SHAPES, "
                    "e.g. 'inkling-tp4:128:32768,gqa8-tp1:32:16384', a name of POINT_SETS ('issue34'), or 'grid' (the "
                    "whole grid): 'grid,issue34' runs both in one run")
    ap.add_argument("--table", metavar="JSON", help="print the table of a run's JSON (no GPU): each row's check is "
                    "re-applied with tolerance(kernel) to its recorded rel_err")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            rows = json.load(f)
        meta_path = args.table[:-len(".json")] + "-meta.json"
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
        for r in rows:
            if r.get("rel_err") is not None:
                r["correct"] = r["rel_err"] <= tolerance(r["kernel"])
        copy = next(r["GBps"] for r in rows if r["kernel"] == "copy")
        print_table(rows, copy, meta)
        return
    dev = "cuda"
    global HOPPER
    HOPPER = torch.cuda.get_device_capability() == (9, 0) and not os.environ.get("BENCH_NO_HOPPER")
    torch.manual_seed(int(time.time()))
    gpu = torch.cuda.get_device_name().replace("NVIDIA ", "").replace(" ", "-").lower()
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    copy = copy_ceiling(dev)
    rows.append({"kernel": "copy", "shape": "-", "Hq": 0, "Hkv": 0, "D": 0, "B": 0, "ctx": 0, "ms": 0.0,
                 "GBps": copy})
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    try:
        import flashinfer
        meta["flashinfer"] = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        flashinfer = None
        meta["flashinfer_error"] = repr(e)[:300]
        print("flashinfer import failed:", repr(e)[:300], flush=True)
    meta["config"] = ("plan_decode(page_size=128, kv_dtype=pool dtype) defaults (choose_config), page table, "
                      "DecodeWorkspace")
    grid = grid_points("grid")
    if args.quick:
        grid = [(SHAPES[0], 1, 1024), (SHAPES[0], 128, 32768), (SHAPES[1], 32, 16384), (SHAPES[2], 8, 32768)]
    if args.points:
        grid = grid_points(args.points)
    if args.no_grid:
        grid = []
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev) if flashinfer else None
    hpc = load_hpcops()
    if hpc is not None:
        meta["hpcops"] = "Tencent/hpc-ops 6e2eced (bench/peers/hpc_ops)"
    # XQA keeps semaphores in its workspace's first 8 MiB: they must start at zero
    xqa_ws = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device=dev) if flashinfer else None
    for (name, Hq, Hkv, D), B, ctx in grid:
        try:
            case = Case(Hq, Hkv, D, B, ctx, dev)
        except torch.OutOfMemoryError:
            print(f"skip {name} B={B} ctx={ctx}: out of memory", flush=True)
            torch.cuda.empty_cache()
            continue
        got = {}
        refs = {"mxfp8": reference_f64(case, paged_reader(case, case.mx.read)),
                "bf16": reference_f64(case, paged_reader(case, case.bf.read)),
                "fp8": reference_f64(case, paged_reader(case, lambda sl: (case.k8[sl].float(), case.v8[sl].float())))}
        # (row, pool, bytes, eager, DecodeConfig, the Hopper kernel's variant constexprs)
        ours = [("ours_mxfp8", case.mx, case.bytes_mxfp8, False, None, {}),
                ("ours_bf16", case.bf, case.bytes_bf16, False, None, {}),
                ("ours_mxfp8_eager", case.mx, case.bytes_mxfp8, True, None, {})]
        if os.environ.get("BENCH_PDL_MERGE") == "1":  # the Triton kernels with the merge launched early (sm_90+)
            ours.insert(1, ("ours_mxfp8_pdl", case.mx, case.bytes_mxfp8, False, DecodeConfig(pdl_merge=True), {}))
        if HOPPER:  # the Gluon kernel, forced (the Triton block kernel is ours_mxfp8 unless the route picks it)
            ours.insert(1, ("ours_mxfp8_hopper", case.mx, case.bytes_mxfp8, False, DecodeConfig(kernel="hopper"),
                            {}))
            # BENCH_HOPPER_WS=1: its warp-specialized form too (not routed: 1.00-1.02x the one-warpgroup kernel's time
            # on an H100, bench/results/current/h100-2026-12-05/ws-first-run/)
            if os.environ.get("BENCH_HOPPER_WS") == "1":
                ours.insert(2, ("ours_mxfp8_hopper_ws", case.mx, case.bytes_mxfp8, False,
                                DecodeConfig(kernel="hopper_ws"), {}))
            # BENCH_HOPPER_VARIANTS='{"s2": {"num_stages": 2}}': more configurations of it, rows ours_mxfp8_hopper_<name>
            # (a "constexprs" entry: the kernel's variant constexprs, decode_hopper.EXTRA_CONSTEXPRS while it is
            # captured)
            for vname, fields in json.loads(os.environ.get("BENCH_HOPPER_VARIANTS", "{}")).items():
                fields = dict(fields)
                consts = fields.pop("constexprs", {})
                ours.insert(3, (f"ours_mxfp8_hopper_{vname}", case.mx, case.bytes_mxfp8, False,
                                DecodeConfig(**{"kernel": "hopper", **fields}), consts))
        for kernel, kv, nbytes, eager, config, consts in ours:
            try:
                if consts:
                    decode_hopper.EXTRA_CONSTEXPRS.update(consts)
                try:
                    ms, gbps, plan, out = time_ours(case, kv, nbytes, eager=eager, config=config)
                finally:
                    if consts:
                        decode_hopper.EXTRA_CONSTEXPRS.clear()
                err, ok = check(out, refs["bf16" if kernel == "ours_bf16" else "mxfp8"], kernel)
                rows.append(row(kernel, name, case, ms, gbps, num_splits=plan.num_splits, variant=plan.kernel,
                                block_n=plan.block_n, num_warps=plan.num_warps, num_stages=plan.num_stages,
                                load_v_transposed=plan.kernel == "blocks",  # the block kernel loads V^T
                                timing="eager" if eager else "cuda_graph", library=OURS, rel_err=err, correct=ok,
                                constexprs=consts or None))
                got[kernel] = ms
            except Exception as e:  # noqa: BLE001
                print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        if flashinfer is not None:
            fi = f"flashinfer {flashinfer.__version__}"
            kv_bf = (case.k.view(-1, PAGE, Hkv, D), case.v.view(-1, PAGE, Hkv, D))
            kv_f8 = (case.k8.view(-1, PAGE, Hkv, D), case.v8.view(-1, PAGE, Hkv, D))
            for kernel, dtype, kvs, nbytes, kw, ref in (
                    ("flashinfer_bf16", torch.bfloat16, kv_bf, case.bytes_bf16, {}, refs["bf16"]),
                    ("flashinfer_fp8", torch.float8_e4m3fn, kv_f8, case.bytes_fp8, dict(k_scale=1.0, v_scale=1.0),
                     refs["fp8"])):
                if not wanted(kernel):
                    continue
                try:
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
                    w.plan(case.page_indptr, case.page_indices, case.last_page_len, Hq, Hkv, D, PAGE,
                           q_data_type=torch.bfloat16, kv_data_type=dtype, sm_scale=1.0 / D)
                    fn = lambda: w.run(case.q, kvs, **kw)  # noqa: E731
                    err, ok = check(fn(), ref, kernel)
                    ms, method = bench_graph(fn, kernel)
                    rows.append(row(kernel, name, case, ms, nbytes / (ms * 1e-3) / 1e9, timing=method, library=fi,
                                    backend="fa2", rel_err=err, correct=ok, tol=tolerance(kernel)))
                    got[kernel] = ms
                except Exception as e:  # noqa: BLE001
                    print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
            xqa = getattr(getattr(flashinfer, "decode", None), "trtllm_batch_decode_with_kv_cache", None)
            if xqa is not None:
                seq_lens_u32 = case.seq_lens.to(torch.uint32)
                for kernel, kvs, nbytes, ref in (("flashinfer_xqa_bf16", kv_bf, case.bytes_bf16, refs["bf16"]),
                                                 ("flashinfer_xqa_fp8", kv_f8, case.bytes_fp8, refs["fp8"])):
                    if not wanted(kernel):
                        continue
                    try:
                        # bmm1_scale = softmax scale x k_scale, bmm2_scale = v_scale (per-tensor scales of 1 here)
                        fn = lambda: xqa(case.q, kvs, xqa_ws, case.page_table, seq_lens_u32, ctx,  # noqa: E731
                                         bmm1_scale=1.0 / D, bmm2_scale=1.0, kv_layout="NHD", backend="xqa")
                        err, ok = check(fn(), ref, kernel)
                        ms, method = bench_graph(fn, kernel)
                        rows.append(row(kernel, name, case, ms, nbytes / (ms * 1e-3) / 1e9, timing=method,
                                        library=fi, backend="xqa", rel_err=err, correct=ok, tol=tolerance(kernel)))
                        got[kernel] = ms
                    except Exception as e:  # noqa: BLE001
                        print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        if hpc is not None and D == 128 and Hq // Hkv in (4, 8) and wanted("hpcops_fp8"):
            kernel = "hpcops_fp8"
            try:
                fn = hpcops_call(hpc, case)
                err, ok = check(fn(), refs["fp8"], kernel)
                ms, method = bench_graph(fn, kernel)
                rows.append(row(kernel, name, case, ms, case.bytes_fp8 / (ms * 1e-3) / 1e9, timing=method,
                                library="hpc-ops 6e2eced", backend="sm90 fp8 dynamic", rel_err=err, correct=ok,
                                tol=tolerance(kernel)))
                got[kernel] = ms
            except Exception as e:  # noqa: BLE001
                print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        if wanted("sdpa_bf16"):
            try:
                kc = case.k[PAGE:PAGE + B * ctx].view(B, ctx, Hkv, D).transpose(1, 2).contiguous()
                vc = case.v[PAGE:PAGE + B * ctx].view(B, ctx, Hkv, D).transpose(1, 2).contiguous()
                q4 = case.q[:, :, None, :]
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                    q4, kc, vc, scale=1.0 / D, enable_gqa=True)
                # SDPA reads contiguous rows, not the page table's pages: its own float64 reference
                err, ok = check(fn(), reference_f64(case, lambda b: (kc[b].transpose(0, 1), vc[b].transpose(0, 1))))
                ms, method = bench_graph(fn, "sdpa")
                rows.append(row("sdpa_bf16", name, case, ms, case.bytes_bf16 / (ms * 1e-3) / 1e9, timing=method,
                                library=f"torch {torch.__version__}", backend="sdpa", rel_err=err, correct=ok))
                got["sdpa_bf16"] = ms
                del kc, vc
            except Exception as e:  # noqa: BLE001
                print(f"sdpa {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        line = " ".join(f"{k}={v:.4f}" for k, v in got.items())
        print(f"{name} B={B} ctx={ctx}: {line}", flush=True)
        with open(os.path.join(args.out, f"{stamp}-{gpu}.json"), "w") as f:  # kept current if the run is cut
            json.dump(rows, f, indent=1)
        del case
        torch.cuda.empty_cache()

    path = os.path.join(args.out, f"{stamp}-{gpu}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, f"{stamp}-{gpu}-meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {path}", flush=True)
    try:
        plot(rows, os.path.join(args.out, f"{stamp}-{gpu}.png"), copy)
    except Exception as e:  # noqa: BLE001
        print("plot failed:", repr(e)[:300], flush=True)
    print_table(rows, copy, meta)


def plot(rows, path, copy):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = ["ours_mxfp8", "ours_bf16", "flashinfer_bf16", "flashinfer_fp8", "flashinfer_xqa_bf16",
               "flashinfer_xqa_fp8", "hpcops_fp8", "sdpa_bf16"]
    fig, axes = plt.subplots(len(SHAPES), len(BATCHES), figsize=(4 * len(BATCHES), 3.2 * len(SHAPES)),
                             sharex=True, sharey=True, squeeze=False)
    for i, (name, Hq, Hkv, D) in enumerate(SHAPES):
        for j, B in enumerate(BATCHES):
            ax = axes[i][j]
            for kern in kernels:
                pts = sorted((r["ctx"], r["GBps"]) for r in rows
                             if r["kernel"] == kern and r["shape"] == name and r["B"] == B)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kern)
            ax.axhline(copy, color="gray", ls="--", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{Hq}/{Hkv}/{D} B={B}", fontsize=9)
            if i == len(SHAPES) - 1:
                ax.set_xlabel("context")
            if j == 0:
                ax.set_ylabel("GB/s (bytes that must be read)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Paged decode attention, page 128 (dashed: device copy ceiling)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


BF16_PEERS = ("flashinfer_bf16", "flashinfer_xqa_bf16", "sdpa_bf16")
FP8_PEERS = ("flashinfer_fp8", "flashinfer_xqa_fp8", "hpcops_fp8")


def fastest(by, kernels, key):
    """The fastest correct row among ``kernels`` at grid point ``key`` (None if none ran correctly)."""
    cands = [by.get((k, *key)) for k in kernels]
    cands = [r for r in cands if r is not None and r.get("correct", True)]
    return min(cands, key=lambda r: r["ms"]) if cands else None


def print_table(rows, copy, meta):
    """Ours (MXFP8) against the fastest correct bf16 peer and the fastest correct fp8 peer at every grid point, with
    the targets of the Hopper kernel issue: at B x ctx >= 512k at least 1.8x the bf16 peer and 0.97x the fp8 peer;
    everywhere at least 1x the bf16 peer and 0.9x the fp8 peer. Rows whose output failed the check are listed."""
    by = {}
    for r in rows:
        by[(r["kernel"], r["shape"], r["B"], r["ctx"])] = r
    print(f"\n{meta}\ncopy ceiling {copy:.0f} GB/s")
    wrong = [r for r in rows if r.get("correct") is False]
    for r in wrong:
        print(f"WRONG OUTPUT (excluded): {r['kernel']} {r['shape']} B={r['B']} ctx={r['ctx']} rel_err={r['rel_err']}")
    hdr = (f"{'shape':12} {'B':>4} {'ctx':>6} | {'mx ms':>7} {'mx GB/s':>7} | {'ourbf ms':>8} | {'bf16 peer':>20} "
           f"{'ms':>7} | {'fp8 peer':>19} {'ms':>7} | {'x bf16':>6} {'x fp8':>6} | target")
    print(hdr)
    for (name, Hq, Hkv, D) in SHAPES:
        for B in BATCHES:
            for ctx in CTXS:
                mx = by.get(("ours_mxfp8", name, B, ctx))
                if mx is None:
                    continue
                ob = by.get(("ours_bf16", name, B, ctx))
                bf, f8 = fastest(by, BF16_PEERS, (name, B, ctx)), fastest(by, FP8_PEERS, (name, B, ctx))
                m = mx["ms"]
                xb = bf["ms"] / m if bf else float("nan")
                x8 = f8["ms"] / m if f8 else float("nan")
                big = B * ctx >= 512 * 1024
                verdict = "ok"
                if not mx.get("correct", True):
                    verdict = "OURS WRONG"
                elif xb < 1.0 or x8 < 0.9:
                    verdict = "miss (everywhere: 1x bf16, 0.9x fp8)"
                elif big and (xb < 1.8 or x8 < 0.97):
                    verdict = "miss (>=512k: 1.8x bf16, 0.97x fp8)"
                print(f"{name:12} {B:>4} {ctx:>6} | {m:7.4f} {mx['GBps']:7.0f} | "
                      f"{ob['ms'] if ob else float('nan'):8.4f} | {bf['kernel'] if bf else '-':>20} "
                      f"{bf['ms'] if bf else float('nan'):7.4f} | {f8['kernel'] if f8 else '-':>19} "
                      f"{f8['ms'] if f8 else float('nan'):7.4f} | {xb:6.2f} {x8:6.2f} | {verdict}")
    print_peer_ratios(by)


def print_peer_ratios(by):
    """Per peer: its time / ours (MXFP8) at the points with B x ctx >= 512k and at all points (min-max, where its
    output passed the check), its worst relative error, and ours' MXFP8 bytes read there."""
    kernels = sorted({k for (k, *_rest) in by if k not in ("copy", "ours_mxfp8", "ours_mxfp8_eager")})
    print(f"\n{'peer':20} | {'peer / ours, >=512k':>20} | {'peer / ours, all':>16} | {'worst rel_err':>13} | checked")
    for kernel in kernels:
        big, every, errs, n, ok = [], [], [], 0, 0
        for (k, name, B, ctx), r in by.items():
            mx = by.get(("ours_mxfp8", name, B, ctx))
            if k != kernel or mx is None:
                continue
            n += 1
            errs.append(r.get("rel_err") or 0.0)
            if not r.get("correct", True):
                continue
            ok += 1
            x = r["ms"] / mx["ms"]
            every.append(x)
            if B * ctx >= 512 * 1024:
                big.append(x)
        span = lambda v: f"{min(v):.2f}-{max(v):.2f}" if v else "-"  # noqa: E731
        print(f"{kernel:20} | {span(big):>20} | {span(every):>16} | {max(errs):13.2e} | {ok}/{n}")
    mx_big = [r["GBps"] for (k, name, B, ctx), r in by.items() if k == "ours_mxfp8" and B * ctx >= 512 * 1024]
    if mx_big:
        print(f"ours_mxfp8 MXFP8 bytes read at >=512k: {min(mx_big):.0f}-{max(mx_big):.0f} GB/s")


if __name__ == "__main__":
    main()
