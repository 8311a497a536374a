"""The Triton route checks the keys its kernels read unchecked, once per step and key, before any kernel runs:
a page past the pool (an illegal address on a GPU, a killed process under the interpreter), a request longer than
``max_seq_len`` (keys silently dropped), an extend slot past the pool or a request with fewer keys than queries
each raise a ValueError naming what is wrong; valid keys pass and are checked once per step, not per layer."""

import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.rails import KVPages, KVRails  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache, check_extend_keys  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGE, PAGES, HQ, HKV, D = 16, 4, 4, 2, 32


def pool():
    gen = torch.Generator().manual_seed(1)
    return PagedKV(torch.randn(PAGE * PAGES, HKV, D, generator=gen).bfloat16().to(DEV),
                   torch.randn(PAGE * PAGES, HKV, D, generator=gen).bfloat16().to(DEV))


def counting_kernels():
    """The kernels module with its two key validators counted."""
    calls = {"validate_page_table": 0, "validate_slots": 0}

    def counted(name):
        def run(*args, **kwargs):
            calls[name] += 1
            return getattr(kernels, name)(*args, **kwargs)
        return run
    names = {n: getattr(kernels, n) for n in dir(kernels) if not n.startswith("_")}
    names.update({n: counted(n) for n in calls})
    return types.SimpleNamespace(**names), calls


def decode(route, keys, max_seq_len, plans=None):
    q = torch.randn(2, HQ, D).bfloat16().to(DEV)
    return route.decode(q, pool(), keys, AttentionParams(D ** -0.5), max_seq_len=max_seq_len,
                        plans=DecodePlanCache() if plans is None else plans, workspace=None)


def test_valid_decode_keys_checked_once_per_step():
    ks, calls = counting_kernels()
    route = GpuRoute(ks)
    pages = KVPages(torch.tensor([[1, 2], [3, 0]], dtype=torch.int32, device=DEV), torch.tensor([20, 5], device=DEV),
                    PAGE)
    step = DecodePlanCache()
    for _ in range(3):  # three layers of one step
        decode(route, pages, 32, step)
    assert calls["validate_page_table"] == 1
    decode(route, pages, 32)  # the next step
    assert calls["validate_page_table"] == 2
    rails = KVRails(torch.tensor([0, 3, 5], device=DEV), torch.tensor([7, 8, 9, 40, 41], device=DEV))
    decode(route, rails, 8, step)
    decode(route, rails, 8, step)
    assert calls["validate_slots"] == 1


@pytest.mark.parametrize("table, lens, max_seq_len, match", [
    ([[1, PAGES]], [20], 32, r"page"),  # the second page read is past the pool's 4 pages
    ([[1, -1]], [20], 32, r"page"),  # a negative block id
    ([[1, 2]], [40], 32, r"seq_lens|max_seq_len|page"),  # longer than the table covers
    ([[1, 2]], [30], 16, r"max_seq_len"),  # longer than the plan covers: its last keys would be dropped
    ([[2, 2]], [20], 32, r"page_table\[0\] names page 2 twice \(entries 0 and 1\)"),  # keys counted twice
    ([[1, 3, 1]], [40], 48, r"page_table\[0\] names page 1 twice \(entries 0 and 2\)"),
])
def test_bad_decode_page_tables_raise(table, lens, max_seq_len, match):
    pages = KVPages(torch.tensor(table, dtype=torch.int32, device=DEV), torch.tensor(lens, device=DEV), PAGE)
    q = torch.randn(1, HQ, D).bfloat16().to(DEV)
    with pytest.raises(ValueError, match=match):
        GpuRoute(kernels).decode(q, pool(), pages, AttentionParams(D ** -0.5), max_seq_len=max_seq_len,
                                    plans=DecodePlanCache(), workspace=None)


def test_bad_decode_rails_raise():
    rails = KVRails(torch.tensor([0, 2], device=DEV), torch.tensor([3, PAGE * PAGES], device=DEV))
    with pytest.raises(ValueError, match=r"kv_indices|slots"):
        GpuRoute(kernels).decode(torch.randn(1, HQ, D).bfloat16().to(DEV), pool(), rails,
                                    AttentionParams(D ** -0.5), max_seq_len=8, plans=DecodePlanCache(),
                                    workspace=None)


def extend_args(indices, kv_lens, q_lens):
    rails = KVRails(torch.tensor([0, *kv_lens], device=DEV).cumsum(0), torch.tensor(indices, device=DEV))
    return rails, torch.tensor([0, *q_lens], device=DEV).cumsum(0)


@pytest.mark.parametrize("indices, kv_lens, q_lens, match", [
    ([1, 2, PAGE * PAGES], [3], [2], r"the extend rails' slots must be slots in \[0, 64\)"),
    ([1, -2, 3], [3], [2], r"the extend rails' slots must be slots in \[0, 64\)"),
    ([1, 2, 3], [3], [4], r"extend request 0 has 4 queries \(qo_indptr\) but 3 keys"),
    ([1, 2], [3], [2], r"past its 2 indices"),
])
def test_bad_extend_keys_raise_before_any_kernel(indices, kv_lens, q_lens, match):
    rails, qo = extend_args(indices, kv_lens, q_lens)
    q = torch.randn(int(qo[-1]), HQ, D).bfloat16().to(DEV)
    with pytest.raises(ValueError, match=match):
        GpuRoute(kernels).extend(q, pool(), rails, qo, AttentionParams(D ** -0.5), plans=DecodePlanCache())


def test_extend_keys_checks():
    kv = pool()
    rails, qo = extend_args([1, 2, 3, 9, 10], [3, 2], [2, 2])
    assert check_extend_keys(kv, rails, qo, 4)
    with pytest.raises(ValueError, match="end at the query's 5 rows"):
        check_extend_keys(kv, rails, qo, 5)
    with pytest.raises(TypeError, match="qo_indptr must be a 1-D int32/int64 tensor"):
        check_extend_keys(kv, rails, qo.float(), 4)
    with pytest.raises(ValueError, match="batch \\+ 1 >= 2 entries"):
        check_extend_keys(kv, rails, qo[:2], 2)


def test_keys_of_the_wrong_kind_are_refused():
    with pytest.raises(TypeError, match=r"keys must be KVPages \(a page table\) or KVRails"):
        decode(GpuRoute(kernels), None, 8)  # was: AttributeError


def test_a_page_repeated_where_it_is_not_read_passes():
    """Entries past a request's keys (or before its window) are never read: a host's filler there is allowed."""
    pages = KVPages(torch.tensor([[1, 1, 1], [3, 3, 0]], dtype=torch.int32, device=DEV),
                    torch.tensor([10, 5], device=DEV), PAGE)
    q = torch.randn(2, HQ, D).bfloat16().to(DEV)
    out = GpuRoute(kernels).decode(q, pool(), pages, AttentionParams(D ** -0.5), max_seq_len=16,
                                   plans=DecodePlanCache(), workspace=None)
    assert out.shape == (2, HQ, D) and bool(torch.isfinite(out).all())
