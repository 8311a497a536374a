"""bench/bench_decode.py's output check, on the CPU under the Triton interpreter (tiny shapes): the float64
reference on the values each kernel reads passes our decode, fails a peer whose softmax scale is off, and a
peer row that failed its check never becomes the bar the table compares against."""
import math
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit
triton = pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_decode as bd  # noqa: E402

from sglang_inkling_backend.kv_views import store_kv_unchecked  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams  # noqa: E402
from sglang_inkling_backend.reference.attention import attend  # noqa: E402
from sglang_inkling_backend.triton import DecodeWorkspace, plan_decode, run_decode  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def ours(case, kv):
    workspace = DecodeWorkspace.for_max_context(case.B, case.Hq, case.Hkv, case.D, case.ctx, DEV)
    plan = plan_decode(case.B, num_q_heads=case.Hq, num_kv_heads=case.Hkv, head_dim=case.D, max_seq_len=case.ctx,
                       page_size=bd.PAGE, kv_dtype=kv.k_buffer.dtype, workspace=workspace)
    return run_decode(plan, case.q, kv, params=case.params, page_table=case.page_table, seq_lens=case.seq_lens)


def test_check_passes_our_decode_and_fails_a_peer_with_the_wrong_softmax_scale():
    torch.manual_seed(0)
    # the torch quantizer fills the MXFP8 pool (the interpreted store kernel would take a minute for 640 slots)
    case = bd.Case(4, 1, 128, 2, 130, DEV,
                   store_mxfp8=lambda kv, loc, k, v, validate: store_kv_unchecked(kv, loc, k, v))
    ref_mx = bd.reference_f64(case, bd.paged_reader(case, case.mx.read))
    ref_bf = bd.reference_f64(case, bd.paged_reader(case, case.bf.read))
    out_mx = ours(case, case.mx)
    err, ok = bd.check(out_mx, ref_mx)
    assert ok and err <= bd.CHECK_TOL
    err_bf, ok_bf = bd.check(ours(case, case.bf), ref_bf)
    assert ok_bf and err_bf <= bd.CHECK_TOL
    # A peer that applies 1/sqrt(D) where the model asks for 1/D (XQA folds 1/sqrt(D) in itself: a misread
    # bmm1_scale gives exactly this).
    wrong = torch.cat([attend(case.q[b:b + 1].float(), torch.tensor([case.ctx - 1]),
                              *(t.float() for t in bd.paged_reader(case, case.bf.read)(b)),
                              AttentionParams(softmax_scale=1.0 / math.sqrt(case.D))) for b in range(case.B)])
    err_wrong, ok_wrong = bd.check(wrong, ref_bf)
    assert not ok_wrong and err_wrong > 10 * bd.CHECK_TOL
    # the MXFP8 pool's own values are not the bf16 ones: its output differs from the bf16 reference by more than
    # the check's bound, so each kernel must be checked on what it reads
    assert not bd.check(out_mx, ref_bf)[1]


def test_a_wrong_peer_row_never_sets_the_bar():
    key = ("s", 8, 1024)
    by = {("flashinfer_xqa_fp8", *key): {"kernel": "flashinfer_xqa_fp8", "ms": 0.1, "correct": False},
          ("flashinfer_fp8", *key): {"kernel": "flashinfer_fp8", "ms": 0.3, "correct": True}}
    assert bd.fastest(by, bd.FP8_PEERS, key)["kernel"] == "flashinfer_fp8"
    by[("flashinfer_fp8", *key)]["correct"] = False
    assert bd.fastest(by, bd.FP8_PEERS, key) is None
