"""CPU checks of the benchmark's bookkeeping (bench/bench_decode.py): which peer rows count as correct, and the
ratios its tables print. Needs Triton (the module imports the kernels' package)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="bench/bench_decode.py imports Triton")
ROOT = Path(__file__).resolve().parents[1]


def _bench_decode():
    spec = importlib.util.spec_from_file_location("bench_decode", ROOT / "bench" / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_xqa_is_held_to_the_rounding_of_its_probabilities_and_everyone_else_to_bf16_output_rounding():
    bd = _bench_decode()
    assert bd.tolerance("ours_mxfp8") == bd.tolerance("flashinfer_fp8") == bd.CHECK_TOL == 4e-3
    assert bd.tolerance("flashinfer_xqa_fp8") == pytest.approx(2 ** -4 + 4e-3)
    assert bd.tolerance("flashinfer_xqa_bf16") == pytest.approx(2 ** -8 + 4e-3)
    # XQA fp8's measured 2.3-3.0% passes; a 10% error (a wrong scale or page) does not; a 3% error from a kernel
    # that keeps Q and P in 16 bits does not either
    assert 0.0295 <= bd.tolerance("flashinfer_xqa_fp8") < 0.10
    assert 0.0295 > bd.tolerance("flashinfer_fp8")


def test_the_table_re_applies_the_tolerance_and_gives_each_peer_its_ratio_range(tmp_path):
    def row(kernel, B, ctx, ms, err):
        return {"kernel": kernel, "shape": "gqa8-tp1", "Hq": 64, "Hkv": 8, "D": 128, "B": B, "ctx": ctx, "ms": ms,
                "GBps": 1000.0, "rel_err": err, "correct": err <= 4e-3}

    rows = [{"kernel": "copy", "shape": "-", "B": 0, "ctx": 0, "ms": 0.0, "GBps": 4000.0}]
    for (B, ctx), ours, xqa, fa2 in (((128, 32768), 1.0, 0.7, 1.3), ((1, 1024), 0.01, 0.012, 0.013)):
        rows += [row("ours_mxfp8", B, ctx, ours, 1e-3), row("flashinfer_xqa_fp8", B, ctx, xqa, 0.03),
                 row("flashinfer_bf16", B, ctx, fa2, 3e-3)]
    rows.append(row("flashinfer_fp8", 128, 32768, 0.5, 0.2))  # fast and wrong: never the bar
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(rows))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_decode.py"), "--table", str(path)],
                         capture_output=True, text=True, check=True).stdout
    peers = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]] for line in out.splitlines()
             if line.startswith("flashinfer_")}
    assert peers["flashinfer_xqa_fp8"] == ["0.70-0.70", "0.70-1.20", "3.00e-02", "2/2"]
    assert peers["flashinfer_bf16"] == ["1.30-1.30", "1.30-1.30", "3.00e-03", "2/2"]
    assert peers["flashinfer_fp8"] == ["-", "-", "2.00e-01", "0/1"]
    point = next(line for line in out.splitlines() if line.startswith("gqa8-tp1      128  32768"))
    assert "flashinfer_xqa_fp8" in point and "0.70" in point  # the wrong fp8 row (0.5 ms) did not set the bar


def test_points_name_the_off_grid_shapes_and_the_issue_table_and_refuse_unknown_names():
    bd = _bench_decode()
    grid = bd.grid_points("issue34")
    assert [(s[1:], b, c) for s, b, c in grid] == [
        ((28, 4, 128), 64, 8192), ((40, 8, 128), 16, 65536), ((8, 1, 128), 96, 16384), ((32, 8, 128), 48, 24576),
        ((64, 8, 128), 256, 4096), ((16, 2, 128), 1, 131072), ((16, 8, 256), 32, 16384), ((64, 4, 128), 32, 32768)]
    assert bd.grid_points("gemma3-270m:8:1024") == [(("gemma3-270m", 4, 1, 256), 8, 1024)]
    with pytest.raises(ValueError, match="'nope:1:1' is not shape:B:ctx"):
        bd.grid_points("gqa8-tp1:1:1024,nope:1:1")
    both = bd.grid_points("grid,issue34")
    assert len(both) == 48 + 8 and both[48:] == grid
    assert both[0] == (("inkling-tp4", 16, 2, 128), 1, 1024) and both[47] == (("gemma3-270m", 4, 1, 256), 128, 32768)
