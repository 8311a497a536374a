# The Python of TritonRoute.plan_graph_step per decode step (16 layers, batch 128), the FlashInfer plan itself stubbed.
# python plan_graph_step_time.py ROOT   (ROOT: a checkout; run from outside it)
import os, sys, time
os.environ["TRITON_INTERPRET"] = "1"
root = sys.argv[1]
sys.path.insert(0, root); sys.path.insert(0, os.path.join(root, "tests", "triton_tests"))
import torch
import test_flashinfer_decode_family as t  # its stand-in FlashInfer and Step
from sglang_inkling_backend import triton as kernels
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.triton.route import TritonRoute
assert kernels.__file__.startswith(root), kernels.__file__
fam = t.family()
fam.plan_graph = lambda plans, key, rails, lens, max_bs, max_keys: plans.get(key, lambda: object())  # the plan itself: FlashInfer's, not ours
route = TritonRoute(kernels, decode_family=fam)
layers = [LayerSpec(window=None, num_q_heads=8, num_kv_heads=2, head_dim=128) for _ in range(16)]
rails = t.KVRails if hasattr(t, "KVRails") else None
from sglang_inkling_backend.rails import KVRails
full = KVRails(torch.zeros(129, dtype=torch.int64), torch.zeros(128 * 16, dtype=torch.int64))
lens = torch.full((128,), 16, dtype=torch.int64)
for _ in range(50):
    route.plan_graph_step(t.Step({None: full}), layers, lens, kv_format="bf16", max_bs=128, max_seq_len=4096)
n = 2000
t0 = time.perf_counter()
for _ in range(n):
    route.plan_graph_step(t.Step({None: full}), layers, lens, kv_format="bf16", max_bs=128, max_seq_len=4096)
print(f"{root}: plan_graph_step, 16 layers, bs 128, the plan stubbed: {(time.perf_counter() - t0) / n * 1e6:.1f} us per step")
