"""A step's decode planned once per group of layers where the host hands over the batch
(``GpuRoute.plan_decode_group``) and run per layer (``run_decode_group``): the same bytes as a layer's own
``decode``, the group's keys checked once at planning (a page past the pool is refused there, before any layer
runs), and a layer whose own tensors do not match the plan refused with a ValueError naming both."""

import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402
from sglang_inkling_backend.rails import KVPages  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGE, PAGES, HQ, HKV, D = 16, 4, 4, 2, 32


def pool(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return PagedKV(torch.randn(PAGE * PAGES, HKV, D, generator=gen).bfloat16().to(DEV),
                   torch.randn(PAGE * PAGES, HKV, D, generator=gen).bfloat16().to(DEV))


def pages(table=((1, 2), (3, 0))):
    return KVPages(torch.tensor(table, dtype=torch.int32, device=DEV), torch.tensor([20, 5], device=DEV), PAGE)


def counted_plans():
    calls = []

    def plan_decode(*args, **kwargs):
        calls.append(kwargs.get("window"))
        return kernels.plan_decode(*args, **kwargs)
    names = {n: getattr(kernels, n) for n in dir(kernels) if not n.startswith("_")}
    names["plan_decode"] = plan_decode
    return types.SimpleNamespace(**names), calls


def test_a_group_plan_gives_each_layer_the_bytes_of_its_own_decode():
    ks, calls = counted_plans()
    route, params = GpuRoute(ks), AttentionParams(D ** -0.5)
    step = DecodePlanCache()
    group = route.plan_decode_group(pool(), pages(), params, num_q_heads=HQ, batch=2, max_seq_len=32, plans=step,
                                    workspace=None)
    assert calls == [None] and group.kernel_plan is step.plans()[0]
    gen = torch.Generator().manual_seed(2)
    for layer in range(3):  # three layers of the group, each with its own pool and query
        q = torch.randn(2, HQ, D, generator=gen).bfloat16().to(DEV)
        got = route.run_decode_group(group, q, pool(seed=10 + layer), params)
        want = GpuRoute(kernels).decode(q, pool(seed=10 + layer), pages(), params, max_seq_len=32,
                                        plans=DecodePlanCache(), workspace=None)
        assert torch.equal(got, want)
    assert calls == [None]  # the layers planned nothing


def test_a_page_past_the_pool_is_refused_when_the_group_is_planned():
    route = GpuRoute(kernels)
    with pytest.raises(ValueError, match=r"page_table\[0, 1\]=9 is not a page of the pool"):
        route.plan_decode_group(pool(), pages(((1, 9), (3, 0))), AttentionParams(D ** -0.5), num_q_heads=HQ,
                                batch=2, max_seq_len=32, plans=DecodePlanCache(), workspace=None)


@pytest.mark.parametrize("bad, match", [
    ("batch", r"page_table and seq_lens must have batch = 3 rows"),  # the step's keys are for 2 requests
    ("window", r"window None; got .* window 8"),
    ("pool", r"made for q \(2, 4, 32\), a pool of 64 slots .*got q \(2, 4, 32\), 48 slots"),
    ("dtype", r"q must be a \[rows, Hq, D\] bf16/fp16/fp32 tensor"),
])
def test_a_layer_unlike_its_group_plan_is_refused(bad, match):
    route, params = GpuRoute(kernels), AttentionParams(D ** -0.5)
    group = route.plan_decode_group(pool(), pages(), params, num_q_heads=HQ, batch=2, max_seq_len=32,
                                    plans=DecodePlanCache(), workspace=None)
    q, kv = torch.randn(2, HQ, D).bfloat16().to(DEV), pool()
    if bad == "batch":
        q = torch.randn(3, HQ, D).bfloat16().to(DEV)
    elif bad == "window":
        params = AttentionParams(D ** -0.5, window=8)
    elif bad == "pool":
        kv = PagedKV(kv.k_buffer[:48], kv.v_buffer[:48])
    elif bad == "dtype":
        q = q.to(torch.int8)
    with pytest.raises((ValueError, TypeError), match=match):
        route.run_decode_group(group, q, kv, params)


def test_the_torch_route_makes_no_group_plans():
    from sglang_inkling_backend.routes import TorchRoute

    assert TorchRoute().plan_decode_group(pool(), pages(), AttentionParams(D ** -0.5), num_q_heads=HQ, batch=2,
                                          max_seq_len=32, plans=DecodePlanCache(), workspace=None) is None


def test_a_layer_writes_its_decode_into_the_callers_rows():
    """``out`` given: the kernel writes the caller's rows (the same storage comes back, no copy), byte for byte the
    decode it returns without one; rows around them untouched; an ``out`` of another shape is refused."""
    route, params = GpuRoute(kernels), AttentionParams(D ** -0.5)
    group = route.plan_decode_group(pool(), pages(), params, num_q_heads=HQ, batch=2, max_seq_len=32,
                                    plans=DecodePlanCache(), workspace=None)
    q = torch.randn(2, HQ, D, generator=torch.Generator().manual_seed(3)).bfloat16().to(DEV)
    rows = torch.full((5, HQ, D), 7.0, dtype=torch.bfloat16, device=DEV)  # a host's output: 2 of its 5 rows
    got = route.run_decode_group(group, q, pool(), params, out=rows[1:3])
    assert got.data_ptr() == rows[1].data_ptr()
    assert torch.equal(rows[1:3], route.run_decode_group(group, q, pool(), params))
    assert torch.all(rows[0] == 7.0) and torch.all(rows[3:] == 7.0)
    with pytest.raises(ValueError, match=r"out must be a bf16/fp16/fp32 tensor of q's shape \(2, 4, 32\)"):
        route.run_decode_group(group, q, pool(), params, out=rows[:3])
