"""What run_decode's Hopper launchers pass to their kernels, recorded by fake kernels (no GPU): for
test_hopper_plan.py, in a process of its own without TRITON_INTERPRET (Gluon does not import under it).

    python tests/triton_tests/hopper_launch_probe.py HQ HKV D [CONSTEXPRS_JSON]   # prints a JSON list of launches

CONSTEXPRS_JSON: a benchmark variant's constexprs (decode_hopper.EXTRA_CONSTEXPRS) for every launch; a launcher's
ValueError is printed as {"error": message} in place of the list.
"""
import json
import sys

import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.scale_layout import ScaleLayout
from sglang_inkling_backend.triton import DecodeConfig, decode_hopper, decode_hopper_ws, plan_decode, run_decode

calls = []


class FakeKernel:
    def __init__(self, name):
        self.name = name

    def __getitem__(self, grid):
        def launch(*args, **kw):
            calls.append({"kernel": self.name, "grid": list(grid), "nargs": len(args),
                          "kw": {k: v for k, v in kw.items() if isinstance(v, (bool, int, float))}})
        return launch


decode_hopper.decode_hopper_kernel = FakeKernel("hopper")
decode_hopper_ws.decode_hopper_ws_kernel = FakeKernel("hopper_ws")
hq, hkv, d, pages = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), 4
decode_hopper.EXTRA_CONSTEXPRS.update(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
slots = pages * 128
layout = ScaleLayout.for_pool(slots, hkv, d, 128)
fp8 = lambda: torch.zeros(slots, hkv, d, dtype=torch.float8_e4m3fn)  # noqa: E731
mx = PagedKV(fp8(), fp8(), layout.empty("cpu"), layout.empty("cpu"), layout)
q = torch.zeros(2, hq, d, dtype=torch.bfloat16)
table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
lens = torch.tensor([200, 100], dtype=torch.int32)
try:
    for kernel, stages in (("hopper", None), ("hopper_ws", None), ("hopper", 2), ("hopper_ws", 2)):
        plan = plan_decode(2, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=256, page_size=128,
                           config=DecodeConfig(kernel=kernel, num_splits=1, num_stages=stages), device="cpu")
        run_decode(plan, q, mx, params=AttentionParams(1.0 / d), page_table=table, seq_lens=lens,
                   out=torch.empty_like(q))
except ValueError as err:
    print(json.dumps({"error": str(err), "launches": len(calls)}))
else:
    print(json.dumps(calls))
