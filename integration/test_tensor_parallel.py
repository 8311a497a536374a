"""Tensor parallel on the CPU host: Gemma-3-270M (4 q heads, 1 KV head, replicated on both ranks) at --tp-size 2,
one core per rank (SGLANG_CPU_OMP_THREADS_BIND="0|1", set by SGLangServer for tp > 1)."""
from harness import REPORT
from workloads import TIE_GAP_NATS, compare_greedy

MODEL = "gemma-3-270m"


def _compare_and_record(key, a, b) -> dict:
    comparison = compare_greedy(a, b)
    REPORT.setdefault("tensor_parallel", {})[key] = comparison | {
        "startup_s": [round(a.startup_s, 1), round(b.startup_s, 1)],
        "per_token_ms": [round(a.per_token_ms, 1), round(b.per_token_ms, 1)]}
    return comparison


def _assert_same_greedy(comparison):
    assert not comparison["mismatches"], (
        f"greedy mismatches (not near-ties <= {TIE_GAP_NATS} nats): {comparison['mismatches']}")


def test_inkling_bf16_tp2_identical_to_tp1(workload):
    tp1, tp2 = workload(MODEL, "inkling", "auto", 1), workload(MODEL, "inkling", "auto", 2)
    _assert_same_greedy(_compare_and_record("inkling_bf16_tp1_vs_tp2", tp1, tp2))


def test_inkling_bf16_tp2_identical_to_torch_native_tp2(workload):
    native, ours = workload(MODEL, "torch_native", "auto", 2), workload(MODEL, "inkling", "auto", 2)
    _assert_same_greedy(_compare_and_record("torch_native_vs_inkling_bf16_tp2", native, ours))


def test_inkling_mxfp8_tp2_identical_to_tp1(workload):
    tp1, tp2 = workload(MODEL, "inkling", "mxfp8", 1), workload(MODEL, "inkling", "mxfp8", 2)
    _assert_same_greedy(_compare_and_record("inkling_mxfp8_tp1_vs_tp2", tp1, tp2))
