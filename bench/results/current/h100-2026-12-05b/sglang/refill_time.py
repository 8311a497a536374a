"""Host time of one CUDA-graph metadata refill, verify (8 drafts) against decode, bs 1 over 1000 keys, on a CPU:
    .venv/bin/python bench/results/current/h100-2026-12-05b/sglang/refill_time.py
(printed 431.7-493.8 and 168.8-229.4 us in two runs on the machine the README was written on)."""
import time, torch
from sglang_inkling_backend.hosts.sglang.metadata import VerifyGraphBuffers, DecodeGraphBuffers
torch.manual_seed(0)
max_bs, d, ctx = 16, 8, 4096
r2t = torch.arange(64 * ctx, dtype=torch.int32).view(64, ctx)
rows = torch.tensor([3], dtype=torch.int64)
seq = torch.tensor([1000], dtype=torch.int64)
vb = VerifyGraphBuffers(max_bs, d, ctx, [], "cpu", swa=False)
db = DecodeGraphBuffers(max_bs, ctx, [], "cpu", swa=False, page_size=None)
pos = (seq.view(-1, 1) + torch.arange(d)).reshape(-1)
full_mask = torch.ones(d * (1000 + d), dtype=torch.bool)
def t(fn, n=200):
    fn(); s = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - s) / n * 1e6
print("verify refill us", t(lambda: vb.refill(r2t, rows, seq, pos, full_mask, num_real=1, seq_lens_host=seq)))
print("decode refill us", t(lambda: db.refill(r2t, rows, seq + 1, seq_lens_host=seq + 1)))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    vb.refill(r2t, rows, seq, pos, full_mask, num_real=1, seq_lens_host=seq)
print("verify ops", sum(e.count for e in p.key_averages() if not e.key.startswith("aten::") or True))
