"""integration/long_context_accuracy.py's analysis: the bins, the paired verdict and the summary rows, on synthetic
runs whose drifts are known (the servers themselves run in that script, not here)."""
import gzip
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import long_context_accuracy as lca  # noqa: E402


def _save(out: Path, model: str, rescaling: str, kv: str, ids: list[int], logprobs: list[float]) -> None:
    (out / "runs").mkdir(parents=True, exist_ok=True)
    run = {"model": model, "rescaling": rescaling, "kv": kv, "tokens": len(ids), "chunk": 256, "ids": ids,
           "input_logprobs": logprobs, "score_s": 1.0, "startup_s": 1.0}
    (out / "runs" / f"{model}_{rescaling}_{kv}.json.gz").write_bytes(gzip.compress(json.dumps(run).encode()))


def _runs(out: Path, n: int, mxfp8_drift: float, fp8_drift: float, seed: int = 0) -> None:
    rng = random.Random(seed)
    ids = list(range(n + 1))
    ref = [-rng.uniform(0.5, 5.0) for _ in range(n)]
    # each format's |delta| is its drift times a positive noise factor shared by nothing else
    _save(out, "m", "none", "auto", ids, ref)
    _save(out, "m", "none", "mxfp8", ids, [r + mxfp8_drift * rng.uniform(0.5, 1.5) for r in ref])
    _save(out, "m", "none", "fp8_e4m3", ids, [r - fp8_drift * rng.uniform(0.5, 1.5) for r in ref])


def test_bins_and_means(tmp_path):
    _runs(tmp_path, 24000, 0.05, 0.05)  # every bin >= MIN_BLOCKS blocks
    s = lca.summarize(tmp_path)
    rows = {(r["kv"], r["context"]): r for r in s["rows"]}
    # input_logprobs[i] has a context of i + 1 tokens: up to 8k holds 8191 positions, 8k-16k 8192, the rest 7617
    assert [rows[("mxfp8", hi)]["positions"] for hi in (8192, 16384, 32768)] == [8191, 8192, 24000 - 16383]
    for r in s["rows"]:
        assert abs(r["value"] - 0.05) < 0.002, r
    assert {c["verdict"] for c in s["comparisons"]} == {"not worse"} and s["inkling_verdict"] == "not worse"
    assert json.loads((tmp_path / "summary.json").read_text())["inkling_verdict"] == "not worse"


@pytest.mark.parametrize("mxfp8, fp8, verdict", [(0.05, 0.10, "better"), (0.10, 0.05, "worse")])
def test_a_real_difference_is_beyond_noise(tmp_path, mxfp8, fp8, verdict):
    _runs(tmp_path, 8191 + 8192, mxfp8, fp8)  # two full bins
    s = lca.summarize(tmp_path)
    assert {c["verdict"] for c in s["comparisons"]} == {verdict}, s["comparisons"]
    assert s["inkling_verdict"] == verdict


def test_runs_on_other_tokens_are_refused(tmp_path):
    _runs(tmp_path, 600, 0.05, 0.05)
    path = tmp_path / "runs" / "m_none_mxfp8.json.gz"
    run = json.loads(gzip.decompress(path.read_bytes()))
    run["ids"][5] += 1
    path.write_bytes(gzip.compress(json.dumps(run).encode()))
    with pytest.raises(ValueError, match="not scored on the bf16 run's tokens"):
        lca.summarize(tmp_path)


def test_rescaling_names():
    assert lca.parse_rescaling("none") == {}
    assert lca.parse_rescaling("v+3") == {"v_log2": 3} and lca.parse_rescaling("v-6") == {"v_log2": -6}
    assert lca.parse_rescaling("k+8") == {"k_outlier_log2": 8}
    for bad in ("v3", "q+1", "k+", "v+x"):
        with pytest.raises(ValueError, match="rescaling must be"):
            lca.parse_rescaling(bad)


def test_a_bin_of_few_blocks_gets_no_verdict(tmp_path):
    # 600 positions: 2 blocks of 256, whose standard error could be anything; the difference is real (0.05 vs 0.10)
    _runs(tmp_path, 600, 0.05, 0.10)
    s = lca.summarize(tmp_path)
    assert [c["verdict"] for c in s["comparisons"]] == ["too few blocks"] and s["inkling_verdict"] is None
