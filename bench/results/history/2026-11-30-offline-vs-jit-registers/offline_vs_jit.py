"""Device-side diagnostic: the offline compile (tools/compile_sm90.py's signature) against the JIT launch, for the
planned block kernel and the V_WORDS variant (commit 31e060a's kernel, copied to _exp_vwords.py)."""
import json, os, subprocess, sys
sys.path.insert(0, "tools"); sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import torch
import compile_sm90 as c
import sglang_inkling_backend.triton.decode_attention as da
import sglang_inkling_backend.triton._exp_vwords as ex
from bench_decode import Case
out = os.environ.get("OUT", "/tmp")
c.dp = ex
res = {}
def sass(kernel, name):
    cub = os.path.join(out, name + ".cubin"); open(cub, "wb").write(kernel.asm["cubin"])
    s = subprocess.run([os.path.join(c.BIN, "cuobjdump"), "--dump-sass", cub], capture_output=True, text=True).stdout
    open(os.path.join(out, name + ".sass"), "w").write(s); os.remove(cub)
    return subprocess.run([sys.executable, "tools/sass_loop.py", os.path.join(out, name + ".sass")], capture_output=True, text=True).stdout.splitlines()[0]
for D, G, Hkv, Hq in ((128, 8, 2, 16), (256, 4, 1, 4)):
    for vw in (0, 1):
        k = c.compile_decode(D, G, 2, "mxfp8", 32, 1, 3, "blocks", extra={"V_WORDS": vw} if vw else None)
        r = c.resources(k); r["loop"] = sass(k, f"offline_D{D}_vw{vw}"); res[f"offline D{D} vw{vw}"] = r
        da._decode_paged_split_kernel = ex._decode_paged_split_kernel
        case = Case(Hq, Hkv, D, 8, 4096, "cuda", with_fp8=False)
        plan = da.plan_decode(case.kv_indptr, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=4096,
                              page_size=128, kernel="blocks", block_n=32, num_warps=1, num_stages=3, num_splits=4)
        plan.launch_options = {"V_WORDS": True} if vw else {}
        da.run_decode(plan, case.q, case.mx, case.kv_indptr, case.kv_indices, case.params)
        torch.cuda.synchronize()
        ck = plan.compiled
        r = {"regs": ck.n_regs, "spills": ck.n_spills, "shared": ck.metadata.shared, "loop": sass(ck, f"jit_D{D}_vw{vw}")}
        try:
            r["attrs"] = str(ck.src.attrs)[:600]
        except Exception as e:
            r["attrs"] = repr(e)[:100]
        res[f"jit D{D} vw{vw}"] = r
        print(json.dumps({k: v for k, v in res.items()}, indent=0)[-1500:], flush=True)
json.dump(res, open(os.path.join(out, "offline_vs_jit.json"), "w"), indent=1)
print(json.dumps(res, indent=1))
