"""The decode family's plumbing (``flashinfer.FlashInferDecode`` inside ``gpu.route.GpuRoute``) on the CPU,
with a stand-in for FlashInfer's paged decode that does what FlashInfer documents and does (page_size pages over
``indptr``/``indices``, the last page ``last_page_len`` long, ``sm_scale``, ``cap * tanh(x / cap)``, float32 inside,
the query's dtype out; under CUDA graphs a fixed batch size and the indptr/indices/last-page buffers given at
construction, which ``plan`` fills and ``run`` reads): which layers it serves, the result against the reference,
one plan per key per step, the graph step's wrappers and buffers, the one-time fallback. FlashInfer itself on a GPU:
``gpu_tests/sglang`` (parity against SGLang's flashinfer backend, and the speed table)."""

import logging
import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.flashinfer import decode as fi_decode  # noqa: E402
from sglang_inkling_backend.flashinfer import extend as fi_extend  # noqa: E402
from sglang_inkling_backend.layer_plan import LayerSpec  # noqa: E402
from sglang_inkling_backend.rails import KVPages, gather_rails, window_start  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention as reference_decode  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS, HQ, HKV, D = 256, 8, 2, 64
TOL = 4e-3  # the stand-in's output is bf16: half a bf16 ulp per element, 2**-9 relative


class PagedDecode:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper as documented, in torch."""
    plans = 0
    made = 0
    fail_runs = 0

    def __init__(self, workspace, layout, use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None):
        assert layout == "NHD" and workspace.dtype == torch.uint8
        type(self).made += 1
        self.graph, self.tensor_cores = use_cuda_graph, use_tensor_cores
        if use_cuda_graph:
            self.indptr, self.indices = paged_kv_indptr_buffer, paged_kv_indices_buffer
            self.last_page_len = paged_kv_last_page_len_buffer
            self.fixed_bs = self.last_page_len.numel()

    def plan(self, indptr, indices, last_page_len, hq, hkv, d, page_size, *, logits_soft_cap=None,
             q_data_type=None, kv_data_type=None, sm_scale=None):
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        assert indptr.device.type == "cpu"  # a device indptr would be read back: a sync (and no capture)
        type(self).plans += 1
        bs = last_page_len.numel()
        if self.graph:
            assert bs == self.fixed_bs, "the batch size is fixed in cudagraph mode"
            self.indptr.copy_(indptr)
            self.last_page_len.copy_(last_page_len)
            self.indices[:indices.numel()].copy_(indices)
        else:
            self.indptr, self.indices, self.last_page_len = indptr.to(DEV), indices.to(DEV), last_page_len.to(DEV)
        self.page_size, self.cap, self.scale, self.dtype = page_size, logits_soft_cap, sm_scale, q_data_type
        self.heads = (hq, hkv, d)

    def run(self, q, paged_kv_cache):
        if type(self).fail_runs:
            type(self).fail_runs -= 1
            raise RuntimeError("JIT build failed: ninja: build stopped")
        k_cache, v_cache = paged_kv_cache
        assert q.dtype == k_cache.dtype == self.dtype and tuple(q.shape[1:]) == (self.heads[0], self.heads[2])
        assert k_cache.shape[1:] == (self.page_size, self.heads[1], self.heads[2])
        indptr, indices, last = self.indptr.tolist(), self.indices.tolist(), self.last_page_len.tolist()
        out = torch.empty_like(q)
        group = q.shape[1] // k_cache.shape[2]
        for b in range(q.shape[0]):
            pages = indices[indptr[b]:indptr[b + 1]]
            k = torch.cat([k_cache[p, :(last[b] if i == len(pages) - 1 else self.page_size)]
                           for i, p in enumerate(pages)]).float().repeat_interleave(group, 1)
            v = torch.cat([v_cache[p, :(last[b] if i == len(pages) - 1 else self.page_size)]
                           for i, p in enumerate(pages)]).float().repeat_interleave(group, 1)
            logits = torch.einsum("hd,khd->hk", q[b].float(), k) * self.scale
            if self.cap:
                logits = self.cap * torch.tanh(logits / self.cap)
            out[b] = torch.einsum("hk,khd->hd", torch.softmax(logits, -1), v).to(q.dtype)
        return out


def fast_decode_plan(wrapper, indptr, indices, last_page_len, hq, hkv, d, page_size, *, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, sm_scale=None, non_blocking=True,
                     global_override_indptr_cpu=None):
    """FlashInfer's fast_decode_plan as it treats a CUDA-graph wrapper: it plans from the host indptr and copies
    nothing into the wrapper's buffers (the caller has written them)."""
    assert wrapper.graph and global_override_indptr_cpu.device.type == "cpu"
    assert last_page_len.numel() == wrapper.fixed_bs and indices.numel() <= wrapper.indices.numel()
    assert indptr.data_ptr() == wrapper.indptr.data_ptr() and indices.data_ptr() == wrapper.indices.data_ptr()
    PagedDecode.fast_plans += 1
    wrapper.page_size, wrapper.cap, wrapper.scale, wrapper.dtype = page_size, logits_soft_cap, sm_scale, q_data_type
    wrapper.heads = (hq, hkv, d)


def fake_flashinfer(fast=True):
    PagedDecode.plans = PagedDecode.made = PagedDecode.fail_runs = PagedDecode.fast_plans = 0
    return types.SimpleNamespace(__version__="0.7.2.post1", BatchDecodeWithPagedKVCacheWrapper=PagedDecode,
                                 **({"fast_decode_plan": fast_decode_plan} if fast else {}))


def family(fast=True):
    return fi_decode.FlashInferDecode(fake_flashinfer(fast), torch.device(DEV), torch.empty(16, dtype=torch.uint8))


def bf16_pool(gen):
    return PagedKV(torch.randn(SLOTS, HKV, D, generator=gen).bfloat16().to(DEV),
                   torch.randn(SLOTS, HKV, D, generator=gen).bfloat16().to(DEV))


def decode_batch(gen, seq_lens=(7, 40, 1, 23), window=None):
    """Rails over a random token table, cut to ``window`` as the hosts cut them, and a bf16 query."""
    bs = len(seq_lens)
    table = torch.randperm(SLOTS, generator=gen)[: bs * 64].reshape(bs, 64).to(DEV)
    lens = torch.tensor(seq_lens, device=DEV)
    start = None if window is None else window_start(lens, torch.ones_like(lens), window)
    rails = gather_rails(table, torch.arange(bs, device=DEV), lens, start)
    q = torch.randn(bs, HQ, D, generator=gen).bfloat16().to(DEV)
    return q, rails, lens


def rel_err(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


def step(route, q, kv, keys, params, plans):
    return route.decode(q, kv, keys, params, max_seq_len=64, plans=plans, workspace=None)


@pytest.mark.parametrize("window, cap", [(None, 0.0), (11, 5.0)])
def test_family_matches_the_reference(window, cap):
    gen = torch.Generator().manual_seed(3)
    kv = bf16_pool(gen)
    q, rails, _ = decode_batch(gen, window=window)
    params = AttentionParams(D ** -0.5, window=window, logit_cap=cap)
    route = GpuRoute(kernels, decode_family=family())
    got = step(route, q, kv, rails, params, DecodePlanCache())
    assert PagedDecode.plans == 1 and got.dtype == torch.bfloat16
    want = reference_decode(q.float(), kv, rails.indptr, rails.indices, params)
    assert rel_err(got, want) < TOL
    # The tolerance tells a cap or a scale apart: the reference with another one differs by more.
    other = AttentionParams(D ** -0.5 * 1.1, window=window, logit_cap=cap or 3.0)
    assert rel_err(got, reference_decode(q.float(), kv, rails.indptr, rails.indices, other)) > 3 * TOL


def test_one_plan_per_key_per_step_and_tensor_cores_from_group_four():
    gen = torch.Generator().manual_seed(4)
    kv = bf16_pool(gen)
    q, full, _ = decode_batch(gen)
    _, local, _ = decode_batch(torch.Generator().manual_seed(4), window=11)
    route = GpuRoute(kernels, decode_family=family())
    plans = DecodePlanCache()
    a, b = AttentionParams(D ** -0.5), AttentionParams(D ** -0.5, window=11)
    for params, rails in ((a, full), (b, local), (a, full), (b, local)):  # four layers, two keys
        step(route, q, kv, rails, params, plans)
    assert PagedDecode.plans == 2 and PagedDecode.made == 2
    step(route, q, kv, full, a, DecodePlanCache())  # the next step plans again, on the same wrapper
    assert PagedDecode.plans == 3 and PagedDecode.made == 2
    assert fi_decode.use_tensor_cores(8, 2) and not fi_decode.use_tensor_cores(6, 2)


def test_layers_it_does_not_serve_run_the_triton_kernels_logged_once(caplog):
    from sglang_inkling_backend import mxfp8
    from sglang_inkling_backend.scale_layout import ScaleLayout
    gen = torch.Generator().manual_seed(5)
    kv = bf16_pool(gen)
    q, rails, lens = decode_batch(gen)
    route = GpuRoute(kernels, decode_family=family())
    bias = AttentionParams(1.0 / D, rel_bias=torch.randn(q.shape[0], HQ, 8, generator=gen).to(DEV))
    with caplog.at_level(logging.INFO, logger="sglang_inkling_backend.gpu.route"):
        for _ in range(2):
            got = step(route, q, kv, rails, bias, DecodePlanCache())
    assert PagedDecode.plans == 0
    note = "inkling: decode: the Triton kernels for layers with a relative bias (FlashInfer's decode adds none)"
    assert [r.getMessage() for r in caplog.records].count(note) == 1
    assert rel_err(got, reference_decode(q.float(), kv, rails.indptr, rails.indices, bias)) < TOL
    fam, plans = route.decode_family, DecodePlanCache()
    assert fam.why_not(q, kv, rails, AttentionParams(D ** -0.5, sinks=torch.zeros(HQ, device=DEV)), plans) == \
        "attention sinks"
    table = KVPages(torch.zeros(4, 1, dtype=torch.int32, device=DEV), lens, 64)
    assert fam.why_not(q, kv, table, AttentionParams(D ** -0.5), plans) == \
        "a page table (FlashInfer's decode here reads per-token rails)"
    assert fam.why_not(q.half(), kv, rails, AttentionParams(D ** -0.5), plans) == \
        "a torch.float16 query over a torch.bfloat16 pool"
    layout = ScaleLayout.for_pool(SLOTS, HKV, D, 128)
    (kd, _), (vd, _) = mxfp8.quantize(kv.k_buffer), mxfp8.quantize(kv.v_buffer)
    mx = PagedKV(kd, vd, layout.empty(DEV), layout.empty(DEV), layout)
    assert fam.why_not(q, mx, rails, AttentionParams(D ** -0.5), plans) == \
        "a mxfp8 pool (this package's kernels read 8-bit pools)"


def test_a_capture_without_a_plan_runs_the_triton_kernels(monkeypatch):
    """FlashInfer cannot plan inside a CUDA-graph capture: a key the host did not plan before it is served by this
    package's kernels (which plan on host ints), not planned there."""
    gen = torch.Generator().manual_seed(6)
    kv = bf16_pool(gen)
    q, rails, _ = decode_batch(gen)
    route = GpuRoute(kernels, decode_family=family())
    monkeypatch.setattr(fi_decode, "stream_capturing", lambda device: True)
    params = AttentionParams(D ** -0.5)
    assert "no FlashInfer plan made before it" in route.decode_family.why_not(q, kv, rails, params, DecodePlanCache())


class Step:
    """A graph step's keys (layer_step.StepKeys) over one rails per window."""
    num_decode_rows, max_seq_len = 4, 64

    def __init__(self, rails_by_window):
        self.rails_by_window, self.plans = rails_by_window, DecodePlanCache()

    def decode_keys(self, window, reads_page_tables):
        return self.rails_by_window[window]


@pytest.mark.parametrize("fast", [True, False])
def test_graph_step_plans_per_batch_size_over_stable_buffers(fast):
    """plan_graph_step plans each key the layers need once per step (a biased layer none), one wrapper per (key,
    batch size) made once and re-planned every step (FlashInfer's plan at the first, its fast_decode_plan after, where
    FlashInfer has it), its indptr/indices in the window's buffers (the same storage every step); the layers then run
    on those plans and match the reference (every step's lengths differ, so a buffer left from the step before
    fails it)."""
    gen = torch.Generator().manual_seed(7)
    kv = bf16_pool(gen)
    fam = family(fast)
    route = GpuRoute(kernels, decode_family=fam)
    layers = [LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D),
              LayerSpec(window=11, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D),
              LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D),
              LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, rel_extent=8)]
    addresses = None
    for seq_lens in ((7, 40, 1, 23), (9, 2, 60, 33), (1, 1, 1, 1)):
        gen = torch.Generator().manual_seed(sum(seq_lens))
        q, full, lens = decode_batch(gen, seq_lens)
        _, local, _ = decode_batch(torch.Generator().manual_seed(sum(seq_lens)), seq_lens, window=11)
        keys = Step({None: full, 11: local})
        route.plan_graph_step(keys, layers, lens.cpu(), kv_format="bf16", max_bs=8, max_seq_len=64)
        assert len(keys.plans) == 2  # the full and the windowed key; the biased layer plans nothing
        for spec, rails in ((layers[0], full), (layers[1], local)):
            params = AttentionParams(D ** -0.5, window=spec.window)
            assert not fam.why_not(q, kv, rails, params, keys.plans)
            got = fam.decode(q, kv, rails, params, keys.plans)
            assert rel_err(got, reference_decode(q.float(), kv, rails.indptr, rails.indices, params)) < TOL
        now = {w: (g.indptr.data_ptr(), g.indices.data_ptr()) for w, g in fam._graph_rails.items()}
        assert addresses is None or now == addresses
        addresses = now
    # batch size 4: one wrapper per key, planned every step (with fast_decode_plan after the first)
    assert PagedDecode.made == 2 and (PagedDecode.plans, PagedDecode.fast_plans) == ((2, 4) if fast else (6, 0))
    assert fam._graph_rails[None].indices.numel() == 8 * 64 and fam._graph_rails[11].indices.numel() == 8 * 11
    with pytest.raises(ValueError, match=r"seq_lens_host must lie in \[1, 64\]"):
        route.plan_graph_step(Step({}), layers, torch.tensor([65]), kv_format="bf16", max_bs=8,
                              max_seq_len=64)
    with pytest.raises(ValueError, match=r"seq_lens_host must hold 1 to 8 requests \(max_bs\), got 9"):
        route.plan_graph_step(Step({}), layers, torch.ones(9, dtype=torch.int64), kv_format="bf16", max_bs=8,
                              max_seq_len=64)
    with pytest.raises(TypeError, match="seq_lens_host must be a 1-D int32/int64 CPU tensor"):
        route.plan_graph_step(Step({}), layers, torch.tensor([1.0]), kv_format="bf16", max_bs=8,
                              max_seq_len=64)
    with pytest.raises(ValueError, match="graph buffers of window None hold 8 requests of 64 keys; asked for 9"):
        fam.graph_rails(None, 9, 64)
    mx = Step({})
    route.plan_graph_step(mx, layers, torch.tensor([3]), kv_format="mxfp8", max_bs=8, max_seq_len=64)
    assert len(mx.plans) == 0  # an 8-bit pool: this package's kernels


def test_graph_step_works_out_the_layers_keys_once(monkeypatch):
    """plan_graph_step runs before every replay: the layers' keys are worked out at its first call for a layers
    object and pool format, then reused (the same plans); another layers object or format works them out again."""
    fam = family()
    route = GpuRoute(kernels, decode_family=fam)
    calls = []
    real = fam.layer_why_not
    monkeypatch.setattr(fam, "layer_why_not", lambda *a: calls.append(a) or real(*a))
    layers = [LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D) for _ in range(6)]
    layers.append(LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, rel_extent=8))
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        q, full, lens = decode_batch(gen)
        keys = Step({None: full})
        route.plan_graph_step(keys, layers, lens.cpu(), kv_format="bf16", max_bs=8, max_seq_len=64)
        assert len(keys.plans) == 1  # six layers of one key; the biased one plans nothing
        assert len(calls) == 6  # the six unbiased layers, looked at on the first step only
    keys = Step({None: full})
    route.plan_graph_step(keys, list(layers), lens.cpu(), kv_format="bf16", max_bs=8, max_seq_len=64)
    assert len(calls) == 12 and len(keys.plans) == 1
    keys = Step({None: full})
    route.plan_graph_step(keys, list(layers), lens.cpu(), kv_format="mxfp8", max_bs=8, max_seq_len=64)
    assert len(calls) == 18 and len(keys.plans) == 0  # an 8-bit pool: this package's kernels


def test_a_first_call_failure_falls_back_once_and_later_failures_raise(caplog):
    gen = torch.Generator().manual_seed(8)
    kv = bf16_pool(gen)
    q, rails, _ = decode_batch(gen)
    params = AttentionParams(D ** -0.5)
    route = GpuRoute(kernels, decode_family=family())
    PagedDecode.fail_runs = 1
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend.gpu.route"):
        got = step(route, q, kv, rails, params, DecodePlanCache())
    assert route.decode_family is None and "ninja: build stopped" in caplog.text
    assert rel_err(got, reference_decode(q.float(), kv, rails.indptr, rails.indices, params)) < TOL

    route = GpuRoute(kernels, decode_family=family())
    step(route, q, kv, rails, params, DecodePlanCache())  # serves once
    PagedDecode.fail_runs = 1
    with pytest.raises(RuntimeError, match="ninja: build stopped"):
        step(route, q, kv, rails, params, DecodePlanCache())


@pytest.mark.parametrize("family_of, env", [(fi_decode.decode_family, fi_decode.DECODE_KERNEL_ENV),
                                             (fi_extend.extend_family, fi_extend.EXTEND_KERNEL_ENV)])
def test_family_settings(monkeypatch, family_of, env):
    """INKLING_DECODE_KERNEL and INKLING_EXTEND_KERNEL (install.find_flashinfer): triton turns the family off, an
    unknown value and flashinfer without FlashInfer raise naming the variable, auto says why not."""
    cpu = torch.device("cpu")
    monkeypatch.setenv(env, "xqa")
    with pytest.raises(ValueError, match=f"{env} must be one of"):
        family_of(cpu)
    monkeypatch.setenv(env, "triton")
    assert family_of(cpu) == (None, f"{env}=triton")
    monkeypatch.delenv(env)
    fam, why = family_of(cpu)
    assert fam is None and "NVIDIA GPUs only" in why
    monkeypatch.setenv(env, "flashinfer")
    with pytest.raises(ValueError, match=f"{env}=flashinfer, but FlashInfer runs on NVIDIA GPUs only"):
        family_of(cpu)
