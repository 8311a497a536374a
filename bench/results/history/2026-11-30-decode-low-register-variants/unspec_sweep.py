"""Device-side experiment: the block kernel and its V_WORDS / PERMUTE_V_ROWS variants (commit 31e060a's kernel)
with stride_qh and stride_oh not specialized (do_not_specialize), next to the planned kernel and FlashInfer."""
import json, os, sys
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch
import sglang_inkling_backend.triton.decode_attention as da
import sglang_inkling_backend.triton._exp_vwords as ex
from bench_decode import Case, bench_graph
from sweep_decode_variants import flashinfer_times
planned_kernel = da._decode_paged_split_kernel
out_dir = os.environ.get("OUT", "/tmp")
ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
rows = []
SM = torch.cuda.get_device_properties(0).multi_processor_count
for Hq, Hkv, D, B, ctx in ((16, 2, 128, 128, 32768), (64, 8, 128, 32, 16384), (4, 1, 256, 128, 16384),
                           (16, 2, 128, 8, 32768)):
    case = Case(Hq, Hkv, D, B, ctx, "cuda", with_fp8=True)
    peers = flashinfer_times(case, ws)
    base = da.plan_decode(case.kv_indptr, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=ctx, page_size=128)
    planned_splits = base.num_splits
    wide = D > 128
    variants = {"planned": (planned_kernel, {}, planned_splits),
                "u-vt (planned splits)": (ex._decode_paged_split_kernel, {}, planned_splits),
                "u-words (planned splits)": (ex._decode_paged_split_kernel, {"V_WORDS": True}, planned_splits),
                "u-words (r1 %d/SM)" % (9 if wide else 16): (ex._decode_paged_split_kernel, {"V_WORDS": True},
                                                             (9 if wide else 16) * SM // (B * Hkv)),
                "u-perm (planned splits)": (ex._decode_paged_split_kernel, {"PERMUTE_V_ROWS": True}, planned_splits),
                "u-perm (r1 %d/SM)" % (10 if wide else 17): (ex._decode_paged_split_kernel, {"PERMUTE_V_ROWS": True},
                                                             (10 if wide else 17) * SM // (B * Hkv))}
    ref = None
    for name, (kern, launch, splits) in variants.items():
        da._decode_paged_split_kernel = kern
        plan = da.plan_decode(case.kv_indptr, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=ctx,
                              page_size=128, kernel="blocks", block_n=32, num_warps=1, num_stages=3,
                              num_splits=max(1, min(splits, ctx // 256)))
        plan.launch_options = launch
        o = torch.empty_like(case.q)
        fn = lambda: da.run_decode(plan, case.q, case.mx, case.kv_indptr, case.kv_indices, case.params, out=o, check=False)
        fn(); torch.cuda.synchronize()
        ms, _ = bench_graph(fn)
        o.fill_(float("nan")); fn(); torch.cuda.synchronize()
        if ref is None:
            ref = o.float().clone()
        diff = float((o.float() - ref).norm() / ref.norm())
        ck = plan.compiled
        r = dict(variant=name, Hq=Hq, Hkv=Hkv, D=D, B=B, ctx=ctx, ms=ms, splits=plan.num_splits, regs=ck.n_regs,
                 shared=ck.metadata.shared, diff=diff, **{k + "_ms": v for k, v in peers.items()})
        rows.append(r)
        print(f"{Hq}/{Hkv}/{D} B={B} {ctx}: {name:28s} {ms:.4f} ms x bf16 {peers['flashinfer_bf16'] / ms:.2f} "
              f"x fp8 {peers['flashinfer_fp8'] / ms:.2f} regs {ck.n_regs} smem {ck.metadata.shared} splits "
              f"{plan.num_splits} diff {diff:.1e}", flush=True)
    da._decode_paged_split_kernel = planned_kernel
    del case; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(out_dir, "unspec.json"), "w"), indent=1)
