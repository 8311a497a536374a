"""GPU check of the Triton extend kernel on a speculative verify step (``HAS_TREE``), at serving shapes: bf16 and
MXFP8 pools, GQA 4 and 8 at head_dim 128, eight requests with cached prefixes of 17 to 30k keys and one request of
32k, 12 drafts per request in random
branching trees (as NGRAM sends them, BFS order), full attention, a window and Inkling's relative bias, against
the reference (``reference.attention.paged_extend_attention(..., verify=)`` in float32 on the same dequantized K/V).
Bound: relative Frobenius error <= 4e-3. Also the kernel's time on the tree against the same call on a chain of the
same drafts (a plain extend): the tree should cost about the same. The same verify laid out from its shapes
(``uniform_verify_attention``) gives the eager launch's bytes without a key split, and is within the bound with the
planned split, whose partials in a workspace (as the SGLang host passes its own) give the bytes of the launch that
allocates them, and whose graph replay over new queries and another tree gives its own launch's bytes; both timed.
One JSON line per check; exit 1 on a failure.

    python gpu_tests/check_verify_gpu.py            # on the GPU machine
    python gpu_tests/check_verify_gpu.py --smoke    # here, under TRITON_INTERPRET=1, tiny shapes (script errors)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_extend_attention as reference  # noqa: E402
from sglang_inkling_backend.reference.draft_trees import chain_tree, random_tree  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

BOUND = 4e-3
failures = []


def pool(fmt, slots, hkv, d, g, dev):
    k, v = torch.randn(slots, hkv, d, generator=g), torch.randn(slots, hkv, d, generator=g)
    if fmt == "bf16":
        return PagedKV(k.bfloat16().to(dev), v.bfloat16().to(dev))
    layout = ScaleLayout.for_pool(slots, hkv, d, 128)
    (kd, ks), (vd, vs) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())
    k_sf, v_sf = layout.empty("cpu"), layout.empty("cpu")
    layout.scatter(k_sf, torch.arange(slots), ks)
    layout.scatter(v_sf, torch.arange(slots), vs)
    return PagedKV(kd.to(dev), vd.to(dev), k_sf.to(dev), v_sf.to(dev), layout)


def timed(fn, reps):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    tic = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - tic) / reps * 1e3


def graph_ms(fn, reps=20):
    """Milliseconds per replay of ``fn`` captured in a CUDA graph (as a verify step runs: no launch overhead)."""
    fn()  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, reps)


def device_tree(verify: SpecVerify, dev) -> SpecVerify:
    return SpecVerify(verify.tree_mask.to(dev), verify.mask_indptr.to(dev, torch.int64),
                      verify.depths.to(dev, torch.int64))


def check_static_grid(name, q, kv, indptr, indices, qo, params, verify, other_tree, drafts, eager):
    """``uniform_verify_attention`` (the verify launch laid out from its shapes) without a key split gives the eager
    launch's bytes; with the planned split (``plan.choose_verify_splits``: several programs per request's keys, then
    a merge) it is within the bound of the reference, with its partials in a workspace sized by
    ``verify_workspace_shape`` (the host's) giving the bytes of the launch that allocates them. On CUDA, the planned
    launch (partials in the workspace) captured in a graph and replayed
    after new queries and another tree were copied into its buffers gives the same launch's bytes on those inputs,
    and both launches are timed as CUDA-graph replays (``split_ms`` against ``whole_ms``)."""
    dev = q.device
    tree = device_tree(verify, dev)
    out = torch.empty(q.shape, dtype=torch.float32, device=dev)
    batch = qo.numel() - 1
    splits = kernels.verify_splits(batch, drafts, q.shape[1], kv.num_kv_heads, dev)
    rows, most_splits = kernels.verify_workspace_shape(batch, drafts, q.shape[1], kv.num_kv_heads, dev)
    workspace = kernels.DecodeWorkspace(rows, q.shape[1], q.shape[2], most_splits, dev)

    def static(splits=None, q_in=None, t=None, ws=workspace):
        dest = out if q_in is None else torch.empty(q.shape, dtype=torch.float32, device=dev)
        return kernels.uniform_verify_attention(q_buf if q_in is None else q_in, kv, indptr, indices, qo, params,
                                                tree if t is None else t, drafts, out=dest, num_splits=splits,
                                                workspace=ws)

    q_buf = q.clone()
    same = bool(torch.equal(static(1), eager()))
    want = reference(q.float(), kv, indptr, indices, qo, params, verify=verify)
    own = static(ws=None).clone()  # partials allocated by the launch
    planned = static()
    err = float((planned.float() - want).norm() / want.norm())
    in_workspace = bool(torch.equal(planned, own))
    record = {"check": f"{name}: static grid = eager launch; split within the bound; workspace = own partials",
              "ok": same and err <= BOUND and in_workspace, "unsplit_equal": same, "split_rel_err": err,
              "splits": splits, "workspace_equal": in_workspace}
    if torch.cuda.is_available():
        record["whole_ms"] = graph_ms(lambda: static(1))
        record["split_ms"] = graph_ms(static)
        graph = torch.cuda.CUDAGraph()
        static()  # compiled outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            static()
        new_q = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).bfloat16().to(dev)
        other = device_tree(other_tree, dev)
        q_buf.copy_(new_q)
        tree.tree_mask.copy_(other.tree_mask)
        tree.depths.copy_(other.depths)
        graph.replay()
        torch.cuda.synchronize()
        fresh = static(q_in=new_q, t=other)
        record["graph_replay_equal"] = bool(torch.equal(out, fresh))
        record["ok"] = record["ok"] and record["graph_replay_equal"]
    print(json.dumps(record), flush=True)
    if not record["ok"]:
        failures.append(record["check"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    dev = "cpu" if SMOKE else "cuda"
    g = torch.Generator().manual_seed(args.seed)
    d_head, drafts = (64, 5) if SMOKE else (128, 12)
    batches = [(9, 40)] if SMOKE else [(1024, 8192, 30000, 3000, 17, 12000, 500, 4096), (32000,)]
    shapes = ((4, 2),) if SMOKE else ((32, 8), (64, 8))  # (Hq, Hkv): GQA 4 and 8
    for fmt, (hq, hkv), prefixes in ((f, s, p) for f in ("bf16", "mxfp8") for s in shapes for p in batches):
        lens = [p + drafts for p in prefixes]
        slots = -(-(sum(lens) + 128) // 128) * 128
        kv = pool(fmt, slots, hkv, d_head, g, dev)
        indptr = torch.tensor([0, *lens]).cumsum(0).to(dev)
        indices = torch.randperm(slots, generator=g)[:sum(lens)].to(dev)
        qo = (torch.arange(len(prefixes) + 1) * drafts).to(dev)
        q = torch.randn(len(prefixes) * drafts, hq, d_head, generator=g).bfloat16().to(dev)
        verify = SpecVerify.from_trees([random_tree(drafts, g) for _ in prefixes], dev)
        chain = SpecVerify.from_trees([chain_tree(drafts) for _ in prefixes], dev)
        variants = {"full": AttentionParams(d_head ** -0.5), "window 256": AttentionParams(d_head ** -0.5,
                                                                                            window=256),
                    "inkling bias": AttentionParams(1.0 / d_head, rel_bias=torch.randn(
                        q.shape[0], hq, 64, generator=g).to(dev))}
        for name, params in variants.items():
            def run(v=verify, p=params):
                return kernels.paged_extend_attention(q, kv, indptr, indices, qo, p, verify=v, validate=False,
                                                      out=torch.empty(q.shape, dtype=torch.float32, device=dev))
            got = run()
            want = reference(q.float(), kv, indptr, indices, qo, params, verify=verify)
            err = float((got - want).norm() / want.norm())
            ok = err <= BOUND
            record = {"check": f"{fmt} {hq}/{hkv} {name}", "ok": ok, "rel_err": err}
            if not SMOKE:
                record["tree_ms"] = timed(run, 20)
                record["chain_ms"] = timed(lambda: run(chain), 20)
            print(json.dumps(record), flush=True)
            if not ok:
                failures.append(record["check"])
            check_static_grid(f"{fmt} {hq}/{hkv} {name}", q, kv, indptr, indices, qo, params, verify,
                              SpecVerify.from_trees([random_tree(drafts, g) for _ in prefixes], dev), drafts,
                              run)
    print(json.dumps({"failed": failures}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
