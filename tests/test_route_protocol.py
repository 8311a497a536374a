"""Every concrete route (``routes.TorchRoute`` and each class of a module in ``routes.ACCELERATED_ROUTES``) satisfies
``route_protocol.Route``: it subclasses it, implements its abstract methods, and every member a host may call or
read is there, of the protocol's kind (a method takes the protocol's arguments). So a host reads any member of any
route without ``getattr``."""
from __future__ import annotations

import inspect

import pytest
import torch

from sglang_inkling_backend import routes
from sglang_inkling_backend.route_protocol import Route

MEMBERS = ("name", "graph_capturable", "reads_page_tables", "query_in_model_dtype", "runs_triton", "fused_store",
           "gather_rail_slots", "serves_verify", "decode_prologue", "make_workspace", "decode", "extend",
           "gather_keys", "plan_graph_step", "plan_decode_group", "run_decode_group", "plan_extend_group",
           "run_extend_group")
METHODS = ("make_workspace", "decode", "extend", "gather_keys", "plan_graph_step", "plan_decode_group",
           "run_decode_group", "plan_extend_group", "run_extend_group")


def concrete_routes() -> list:
    found = [routes.TorchRoute]
    for path in routes.ACCELERATED_ROUTES:
        module, why = routes.load_route_module(path)
        if module is None:
            continue  # its library is not installed here (the layout test still sees the module)
        found += [c for c in vars(module).values()
                  if isinstance(c, type) and issubclass(c, Route) and c.__module__ == module.__name__]
    return found


def protocol_gaps(cls) -> list[str]:
    """What ``cls`` lacks of the protocol: missing members, abstract methods left, methods that do not take the
    protocol's arguments (its positional count and keyword names)."""
    gaps = [f"{cls.__name__} is not a Route"] if not issubclass(cls, Route) else []
    gaps += [f"abstract {m}" for m in sorted(getattr(cls, "__abstractmethods__", ()))]
    public = {m for m in vars(Route) if not m.startswith("_")}
    gaps += [f"the protocol's {m} is not declared in MEMBERS" for m in sorted(public - set(MEMBERS))]
    for member in MEMBERS:
        if not hasattr(cls, member):
            gaps.append(f"no {member}")
    for method in METHODS:
        want, got = inspect.signature(getattr(Route, method)), inspect.signature(getattr(cls, method))
        if any(p.kind == p.VAR_KEYWORD for p in got.parameters.values()):
            continue
        positional = [p for p in want.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        takes = [p for p in got.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keywords = {p.name for p in want.parameters.values() if p.kind == p.KEYWORD_ONLY}
        if len(takes) < len(positional) or not keywords <= set(got.parameters):
            gaps.append(f"{method}{got} does not take {method}{want}")
    return gaps


def test_the_scan_finds_every_route():
    names = {c.__name__ for c in concrete_routes()}
    assert "TorchRoute" in names
    if routes.load_route_module("sglang_inkling_backend.gpu.route")[0] is not None:
        assert "GpuRoute" in names


@pytest.mark.parametrize("cls", concrete_routes(), ids=lambda c: c.__name__)
def test_each_route_satisfies_the_protocol(cls):
    assert not protocol_gaps(cls), protocol_gaps(cls)
    assert cls.name


def test_a_route_without_a_member_is_caught():
    class Partial(Route):
        name = "partial"

        def decode(self, q, kv, keys, params):  # no max_seq_len / plans / workspace
            return q

    assert protocol_gaps(Partial) == ["abstract extend", "decode(self, q, kv, keys, params) does not take "
                                      + f"decode{inspect.signature(Route.decode)}"]


def test_the_torch_route_answers_every_member_with_its_defaults():
    """What the hosts call without probing: the defaults of a route lacking a capability."""
    from sglang_inkling_backend.reference import prologue as reference_prologue

    route = routes.TorchRoute()
    assert route.make_workspace(max_batch=2, geometries={(4, 2, 64)}, max_seq_len=16, device="cpu") is None
    assert route.plan_graph_step(None, [], torch.ones(2), kv_format="bf16", max_bs=2, max_seq_len=16) is None
    assert route.decode_prologue is reference_prologue.inkling_attn_prologue_decode
    assert route.fused_store is None and route.gather_rail_slots is None
    assert (route.graph_capturable, route.reads_page_tables, route.query_in_model_dtype, route.runs_triton,
            route.serves_verify) == (False, False, False, False, True)


def test_the_gpu_route_answers_its_capabilities():
    pytest.importorskip("triton", reason="Triton is not installed (the GPU route's kernels are Triton's)")
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.gpu.route import GpuRoute
    from sglang_inkling_backend.triton import prologue

    route = GpuRoute()
    assert route.fused_store is kernels.store_kv and route.gather_rail_slots is kernels.gather_rail_slots
    assert route.decode_prologue is prologue.inkling_attn_prologue_decode
    assert (route.graph_capturable, route.reads_page_tables, route.query_in_model_dtype, route.runs_triton,
            route.serves_verify) == (True, True, True, True, True)
    assert route.plan_graph_step(None, [], torch.ones(2), kv_format="bf16", max_bs=2, max_seq_len=16) is None
