"""The bad-input probe (``tools/probe_bad_input.py``, issue #33) itself: its case table is well formed and covers
the issue's examples, and its classifier files each kind of outcome where it belongs. The probe's run (about four
minutes, Triton cases in subprocesses) is not part of the unit tests; its results live in
bench/results/current/bad-input-probe/."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parent.parent / "tools" / "probe_bad_input.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("probe_bad_input", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _all_cases(probe):
    """The probe's case table; its verify-graph cases import the Triton kernels while the table is built."""
    pytest.importorskip("triton", reason="Triton is not installed (the probe's case table builds Triton cases)")
    return probe.all_cases()


def test_case_table_is_well_formed(probe):
    cases = _all_cases(probe)
    assert len(cases) >= 250
    assert len({c.id for c in cases}) == len(cases)
    assert {c.kind for c in cases} <= {"bad", "control", "construct", "activation"}
    assert {c.group for c in cases} <= {"core", "sglang", "triton", "sglang-triton"}
    unnamed = [c.id for c in cases if c.kind != "control" and not c.names]
    assert not unnamed, f"bad-input cases must say which argument a clean message names: {unnamed}"


ISSUE_EXAMPLES = [
    "vllm.forward.triton.decode_block_past_cache", "vllm.forward.triton.decode_seq_past_table",
    "vllm.forward.triton.decode_block_negative", "vllm.forward.triton.max_seq_len_below",
    "vllm.store.below_-1", "vllm.store.float_mapping", "vllm.store.slot_twice", "vllm.store.bool_mapping",
    "vllm.store.key_short", "vllm.forward.prefill_seq_below_query", "vllm.forward.qsl_decode_inconsistent",
    "vllm.forward.num_actual_-1", "sglang.pool.mxfp8.load.duplicate_index", "sglang.pool.mxfp8.load.scales_of_one_slot",
    "sglang.pool.mxfp8.load.index_past", "sglang.pool.mxfp8.load.one_layer_of_two", "sglang.pool.mxfp8.get.past",
    "sglang.pool.fp8_e4m3.set.k_scale_string", "sglang.pool.fp8_e4m3.set.k_scale_bool", "core.record_window.float",
    "core.record_window.minus_5", "core.LayerSpec.softmax_string", "core.checks.require_real.past_float32",
    "core.mxfp8.quantize.finite_float64_past_float32", "core.mxfp8.quantize.float32_near_max",
    "core.from_hf_config.sliding_without_window", "core.from_hf_config.layer_types_long",
    "core.from_hf_config.layer_types_unknown", "core.from_hf_config.heads_zero",
    "core.BatchedDecodeContext.full_out_of_range", "core.BatchedDecodeContext.full_dup",
    "core.BatchedDecodeContext.full_negative", "core.BatchedDecodeContext.full_windowed_index",
    "core.reference.extend.qo_not_from_0", "core.PagedKV.k_scale_nan", "core.AttentionParams.sinks_nan",
    "core.AttentionParams.rel_bias_nan",
]


def test_the_issues_examples_are_cases(probe):
    ids = {c.id for c in _all_cases(probe)}
    assert not [i for i in ISSUE_EXAMPLES if i not in ids]


def synthetic(probe, run, buffers=None, expect=None, kind="bad", names=("slots",), use=None):
    case = probe.Case("synthetic", "test", "test", "test",
                      lambda: probe.Setup(run, buffers or {}, expect, use=use), names, kind)
    return probe.run_one(case)["outcome"]


def test_the_classifier(probe):
    buf = torch.zeros(4)

    def raise_(exc):
        raise exc

    def write_then_raise():
        buf[0] = 1.0
        raise ValueError("slots must be in range")

    assert synthetic(probe, lambda: raise_(ValueError("slots must be in [0, 4)"))) == "clean"
    assert synthetic(probe, lambda: raise_(ValueError("kv_indices must be in [0, 4)"))) == "internal_name"
    assert synthetic(probe, lambda: raise_(IndexError("index 9 is out of bounds"))) == "wrong_type"
    assert synthetic(probe, write_then_raise, {"buf": buf}) == "partial_write"
    assert synthetic(probe, lambda: torch.tensor([float("nan")])) == "silent_nan"
    assert synthetic(probe, lambda: torch.ones(2), expect=torch.zeros(2)) == "silent_wrong"
    assert synthetic(probe, lambda: torch.zeros(2), expect=torch.zeros(2)) == "accepted"
    assert synthetic(probe, lambda: torch.zeros(2), expect=torch.zeros(2), kind="control") == "valid"
    # a NaN activation (rel_bias) must come out as NaN: documented; a finite result from it is wrong
    assert synthetic(probe, lambda: torch.tensor([float("nan")]), expect=torch.zeros(1), kind="activation") == "valid"
    assert synthetic(probe, lambda: torch.zeros(1), expect=torch.zeros(1), kind="activation") == "silent_wrong"
    assert synthetic(probe, lambda: object(), use=lambda o: raise_(TypeError("slots must be a tensor")),
                     kind="construct") == "deferred"


# The tensor-kind classes' examples, each a case of the probe next to the other members of its class
TENSOR_KIND_EXAMPLES = [
    "core.InklingKVPool.set.meta_cache_k", "core.InklingKVPool.set.meta_loc", "vllm.store.meta_slot_mapping",
    "vllm.store.meta_key", "vllm.store.meta_value", "core.InklingKVPool.init.device_unreachable",
    "core.InklingKVPool.host.backup_list_device_pages", "core.PagedKV.layout_direct_interleaved",
    "core.AttentionParams.rel_bias_extent_0", "core.reference.decode.rel_bias_extent_0",
    "core.PagedKV.kv_head_dims_differ", "vllm.batch.seq_lens_short_set_later",
]


def test_the_tensor_kind_examples_are_cases(probe):
    ids = {c.id for c in _all_cases(probe)}
    assert not [i for i in TENSOR_KIND_EXAMPLES if i not in ids]


def test_the_classifier_takes_meta_buffers_and_results(probe):
    """A case whose defect is a tensor on the meta device: its buffer is not snapshotted (no bytes), and a call that
    returns meta tensors computed nothing (silent wrong), where it used to kill the worker."""
    assert synthetic(probe, lambda: torch.zeros(2, device="meta"), {"buf": torch.zeros(2, device="meta")}) \
        == "silent_wrong"
    assert synthetic(probe, lambda: torch.zeros(2), expect=lambda r: (_ for _ in ()).throw(RuntimeError("no data"))) \
        == "accepted"
