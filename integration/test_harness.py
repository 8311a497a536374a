"""The harness's own arithmetic (no server): greedy comparison on the oracle's margins, drift bookkeeping, KV bytes."""
import json

import pytest

from demo.kv_memory import KVGeometry
from margins import _Queries, error_level, first_divergence, judge, margin_errors
from workloads import Answer, WorkloadRun, common_prefix, logprob_deltas


def answer(ids, logprobs, top2, prompt_ids=(5, 6)):
    return Answer(output_ids=ids, logprobs=logprobs, top2=top2, cached_tokens=0, prompt_tokens=len(prompt_ids),
                  prompt_ids=list(prompt_ids))


def run(**answers):
    out = WorkloadRun(config={}, startup_s=0.0)
    out.answers.update(answers)
    return out


REFERENCE = answer([1, 2, 3], [-0.1, -0.5, -0.2],
                   [[(1, -0.1), (9, -3.0)], [(2, -0.5), (7, -0.5625)], [(3, -0.2), (4, -2.0)]])
# The float32 oracle on the reference's sequence: per generated position, token -> logprob.
ORACLE = {"p": [{1: -0.1, 9: -3.05}, {2: -0.52, 7: -0.55, 8: -4.0}, {3: -0.2, 4: -2.1}]}


def test_margin_errors_are_the_top2_margins_minus_the_oracles():
    # margins: reference 2.9 / 0.0625 / 1.8, oracle 2.95 / 0.03 / 1.9
    assert margin_errors(run(p=REFERENCE), ORACLE) == pytest.approx([-0.05, 0.0325, -0.1])


def test_a_divergence_within_the_noise_bound_is_excused_and_one_beyond_it_is_a_mismatch():
    near = answer([1, 7, 8], [-0.1, -0.5, -0.3], [[(1, -0.1), (9, -3.0)], [(7, -0.5), (2, -0.56)], [(8, -0.3)]])
    far = answer([1, 8, 8], [-0.1, -0.2, -0.3], [[(1, -0.1), (9, -3.0)], [(8, -0.2), (2, -1.5)], [(8, -0.3)]])
    assert first_divergence(REFERENCE, near) == 1 and first_divergence(REFERENCE, REFERENCE) is None
    excused = judge(run(p=REFERENCE), run(p=near), ORACLE, noise_bound=0.2)
    assert excused["mismatches"] == [] and excused["excused_near_ties"][0]["oracle_margin"] == pytest.approx(0.03)
    mismatch = judge(run(p=REFERENCE), run(p=far), ORACLE, noise_bound=0.2)
    assert mismatch["mismatches"][0]["tokens"] == [2, 8] and mismatch["mismatches"][0]["oracle_margin"] == 3.48
    # The same divergence with a bound below its margin is a mismatch: the bound, not luck, decides.
    assert judge(run(p=REFERENCE), run(p=near), ORACLE, noise_bound=0.02)["mismatches"]


def test_oracle_queries_share_a_forward_pass_per_sequence_and_cover_every_needed_token():
    far = answer([1, 8, 8], [-0.1, -0.2, -0.3], [[(1, -0.1), (9, -3.0)], [(8, -0.2), (2, -1.5)], [(8, -0.3), (5, -4)]])
    queries = _Queries()
    key = queries.add(REFERENCE, {1: {2, 8}})
    assert queries.add(answer([1, 2, 3], [], [[(9, -1), (1, -2)], [(2, -1), (6, -2)], [(3, -1), (4, -2)]])) == key
    queries.add(far)
    assert len(queries.by_ids) == 2
    assert queries.by_ids[key]["tokens"] == [{1, 9}, {2, 6, 7, 8}, {3, 4}]


def test_error_level_flags_a_candidate_whose_margin_errors_exceed_the_references_beyond_noise():
    reference = [0.05, -0.04, 0.06, -0.05, 0.03, 0.07, -0.06, 0.04] * 20
    assert not error_level([e * 1.05 for e in reference], reference)["exceeds_reference"]
    broken = error_level([e * 10 for e in reference], reference)
    assert broken["exceeds_reference"] and broken["z"] > 20


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
