"""One decode launch of the Gluon Hopper kernel at a grid point, for ncu. ``HOPPER_CONSTEXPRS='{"HEADS_ONCE": true}'``:
the kernel's variant constexprs (decode_hopper.EXTRA_CONSTEXPRS); ``KERNEL``: the plan's kernel (default "hopper");
``DECODE_CONFIG='{"num_stages": 2}'``: more DecodeConfig fields."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from bench.bench_decode import Case
from sglang_inkling_backend.triton import DecodeConfig, DecodeWorkspace, plan_decode, run_decode
from sglang_inkling_backend.triton import decode_hopper
decode_hopper.EXTRA_CONSTEXPRS.update(json.loads(os.environ.get("HOPPER_CONSTEXPRS", "{}") or "{}"))
Hq, Hkv, D, B, ctx = (int(x) for x in os.environ.get("POINT", "16,2,128,128,32768").split(","))
case = Case(Hq, Hkv, D, B, ctx, "cuda", with_fp8=False)
ws = DecodeWorkspace.for_max_context(B, Hq, Hkv, D, ctx, "cuda")
fields = json.loads(os.environ.get("DECODE_CONFIG", "{}") or "{}")
cfg = DecodeConfig(**{"kernel": os.environ.get("KERNEL", "hopper"), **fields})
plan = plan_decode(B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=ctx, page_size=128,
                   kv_dtype=case.mx.k_buffer.dtype, workspace=ws, config=cfg)
out = torch.empty_like(case.q)
for _ in range(3):
    run_decode(plan, case.q, case.mx, params=case.params, page_table=case.page_table, seq_lens=case.seq_lens, out=out, check=False)
torch.cuda.synchronize()
print("splits", plan.num_splits, "kernel", plan.kernel)
