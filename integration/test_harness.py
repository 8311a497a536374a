"""The harness's own arithmetic (no server): greedy comparison with near-ties, drift bookkeeping, KV bytes."""
import json

import pytest

from sglang_inkling_backend.demo.kv_memory import KVGeometry
from workloads import Answer, common_prefix, divergence_is_near_tie, logprob_deltas


def answer(ids, logprobs, top2):
    return Answer(output_ids=ids, logprobs=logprobs, top2=top2, cached_tokens=0, prompt_tokens=5)


def test_divergence_at_a_one_step_tie_is_a_tie_and_a_wide_gap_is_not():
    a = answer([1, 2, 3], [-0.1, -0.5, -0.2], [[(1, -0.1), (9, -3.0)], [(2, -0.5), (7, -0.5625)], [(3, -0.2), (4, -2)]])
    b = answer([1, 7, 8], [-0.1, -0.5, -0.3], [[(1, -0.1), (9, -3.0)], [(7, -0.5), (2, -0.5625)], [(8, -0.3), (4, -2)]])
    assert common_prefix(a, b) == 1
    is_tie, details = divergence_is_near_tie(a, b)
    assert is_tie and details["position"] == 1 and details["top2_gaps"] == [0.0625, 0.0625]
    wide = answer([1, 7, 8], [-0.1, -0.2, -0.3], [[(1, -0.1), (9, -3.0)], [(7, -0.2), (2, -1.5)], [(8, -0.3), (4, -2)]])
    assert not divergence_is_near_tie(a, wide)[0]


def test_logprob_deltas_cover_only_the_shared_positions():
    a = answer([1, 2, 3], [-0.1, -0.5, -0.2], [])
    b = answer([1, 2, 4], [-0.3, -0.4, -9.0], [])
    assert logprob_deltas(a, b, common_prefix(a, b)) == pytest.approx([0.2, 0.1])


def test_kv_bytes_per_token_for_gemma3_270m_geometry(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
         "hidden_size": 640}))
    geometry = KVGeometry.from_model_dir(tmp_path)
    # K and V, 18 layers, 1 KV head of 256 channels: bf16 2 bytes each; MXFP8 1 byte + 1 scale byte per 32.
    assert geometry.bytes_per_token("bf16") == 18 * 2 * 256 * 2 == 18432
    assert geometry.bytes_per_token("mxfp8") == 18 * 2 * (256 + 8) == 9504
    assert geometry.bytes_per_token("mxfp8", tp_size=2) == 9504  # the single KV head is replicated on both ranks


def test_kv_heads_per_rank_follows_sglang_split():
    geometry = KVGeometry(num_layers=30, num_kv_heads=3, head_dim=64)
    assert geometry.kv_heads_per_rank(1) == 3 and geometry.kv_heads_per_rank(3) == 1
    with pytest.raises(ValueError, match="tp_size 2 does not split this model's 3 KV heads"):
        geometry.kv_heads_per_rank(2)
