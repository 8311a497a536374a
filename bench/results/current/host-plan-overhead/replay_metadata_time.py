# Host time of InklingAttnBackend.init_forward_metadata_out_graph (a bf16 pool, 16 full layers, batch 8), the
# FlashInfer decode family a stand-in (its plan is Python here, C++ in FlashInfer), the rail-gather kernel a no-op.
# Run from the repository root: python bench/results/current/host-plan-overhead/replay_metadata_time.py
import os, sys, time
os.environ["TRITON_INTERPRET"] = "1"  # no kernel runs: the rail gather is stubbed below
sys.path.insert(0, "tests/hosts/sglang"); sys.path.insert(0, "tests/triton_tests"); sys.path.insert(0, "tests")
from types import SimpleNamespace
import test_sglang_backend as T
import test_flashinfer_decode_family as F
from sglang_inkling_backend import triton as kernels
from sglang_inkling_backend.triton.route import TritonRoute
from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend

L = 16
layers = T.make_layers(windows=(-1,) * L)
h = T.Harness(layers, T.bf16_pool(layers=L), context=600)
b = InklingAttnBackend(h.runner)
route = TritonRoute(kernels, decode_family=F.family())
b.use_route(route)
fb0 = h.batch([0, 1, 2, 3, 4, 5, 6, 7], [9] * 8, decode=False)
b.init_forward_metadata(fb0)
b.init_cuda_graph_state(8, 8)
fb = h.batch([0, 1, 2, 3, 4, 5, 6, 7], [1] * 8, decode=True)
view = SimpleNamespace(**{**vars(fb), "seq_lens_cpu": fb.seq_lens.clone(), "num_padding": 0})
route.gather_rail_slots = lambda *a, **k: None  # the GPU kernel's launch is not this measurement
b.init_forward_metadata_out_graph(view, in_capture=True)
parts = {}
def timed(obj, name):
    fn = getattr(obj, name)
    def wrapper(*a, **k):
        t0 = time.perf_counter(); r = fn(*a, **k); parts[name] = parts.get(name, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, wrapper)
timed(b._graph_buffers, "refill"); timed(route, "plan_graph_step")
n = 300
for _ in range(20):
    b.init_forward_metadata_out_graph(view)
parts.clear()
t0 = time.perf_counter()
for _ in range(n):
    b.init_forward_metadata_out_graph(view)
total = (time.perf_counter() - t0) / n * 1e6
print(f"init_forward_metadata_out_graph: {total:.0f} us per step; " +
      ", ".join(f"{k} {v / n * 1e6:.0f} us" for k, v in parts.items()))
