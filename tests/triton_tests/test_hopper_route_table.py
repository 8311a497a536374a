"""bench/hopper_route_table.py times a point by the row the route would launch: the Hopper kernel's row only in the
configuration ``plan.hopper_config`` gives that head size (a run's other Hopper variants do not stand in for it)."""

import importlib.util
import os

import pytest

pytest.importorskip("triton", reason="Triton is not installed (the route's plan module needs it)")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _table_module():
    spec = importlib.util.spec_from_file_location("hopper_route_table", os.path.join(ROOT, "bench",
                                                                                      "hopper_route_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(kernel, ms, d=256, block_n=None, num_stages=None, constexprs=None, variant=None):
    r = dict(kernel=kernel, shape="s", Hq=16, Hkv=8, D=d, B=32, ctx=16384, ms=ms, GBps=1.0, rel_err=1e-3,
             correct=True, block_n=block_n, num_stages=num_stages, constexprs=constexprs)
    if variant:
        r["variant"] = variant
    return r


def test_the_route_row_is_the_configuration_the_plan_launches():
    table = _table_module()
    peers = [_row("flashinfer_bf16", 1.4), _row("flashinfer_xqa_fp8", 0.72)]
    rows = [_row("ours_mxfp8", 0.876), _row("ours_mxfp8_hopper", 1.677, block_n=128, num_stages=3),
            _row("ours_mxfp8_hopper_n64g4", 0.748, block_n=64, num_stages=2, constexprs={"G_PAD": 4}),
            _row("ours_mxfp8_hopper_n64", 0.753, block_n=64, num_stages=2)] + peers
    (point,) = table.route_rows(rows)
    assert (point["kernel"], point["ms"]) == ("hopper", 0.753)  # not the spilling 128-key row, not the G_PAD one
    assert point["x_xqa_fp8"] == pytest.approx(0.72 / 0.753)
    # a run timed before half-page tiles (only 128-key rows at head_dim 256): the Triton row, as the route then ran
    (old,) = table.route_rows([r for r in rows if r["kernel"] != "ours_mxfp8_hopper_n64"])
    assert (old["kernel"], old["ms"]) == ("triton", 0.876)
    # head_dim 128: whole-page tiles on 3 stages
    rows128 = [_row("ours_mxfp8", 0.25, d=128), _row("ours_mxfp8_hopper", 0.215, d=128, block_n=128, num_stages=3),
               _row("ours_mxfp8_hopper_n64", 0.222, d=128, block_n=64, num_stages=2)] + peers
    assert table.route_rows(rows128)[0]["ms"] == 0.215


def test_the_warp_specialized_rows_never_stand_in_for_the_route():
    """The route launches the one-warpgroup kernel: a faster hopper_ws row in the same tiles and stages is not its
    time (the kernel is named by its ``variant``, the plan's kernel)."""
    table = _table_module()
    rows = [_row("ours_mxfp8", 0.25, d=128), _row("flashinfer_bf16", 0.36, d=128),
            _row("ours_mxfp8_hopper_ws", 0.18, d=128, block_n=128, num_stages=3, variant="hopper_ws"),
            _row("ours_mxfp8_hopper", 0.215, d=128, block_n=128, num_stages=3, variant="hopper")]
    (point,) = table.route_rows(rows)
    assert (point["kernel"], point["ms"]) == ("hopper", 0.215)
