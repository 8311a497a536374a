"""The extend family's plumbing (``flashinfer.FlashInferExtend`` inside ``gpu.route.GpuRoute``) on the CPU, with a
stand-in for FlashInfer's ragged prefill that computes what FlashInfer documents (bottom-right causal,
``window_left`` keys left of the query, ``cap * tanh(x / cap)``, float32 inside, output in the query's dtype):
the gather, the scale folding of per-tensor fp8, the window and cap mapping, one plan per key per step, which
layers it serves, the one-time fallback. FlashInfer itself against float64: ``bench/bench_extend.py`` on a GPU."""

import logging
import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.flashinfer import extend as fi_extend  # noqa: E402
from sglang_inkling_backend.rails import KVRails  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_extend_attention as reference_extend  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS, HQ, HKV, D = 256, 4, 2, 64
# The stand-in's output is bf16 (FlashInfer returns the query's dtype): half a bf16 ulp per element, 2**-9 relative.
TOL = 4e-3


class RaggedPrefill:
    """FlashInfer's BatchPrefillWithRaggedKVCacheWrapper as documented, in torch (float32 inside)."""
    plans = 0
    fail_runs = 0

    def __init__(self, workspace, layout):
        assert layout == "NHD" and workspace.dtype == torch.uint8

    def plan(self, qo_indptr, kv_indptr, hq, hkv, d, *, causal, window_left, logits_soft_cap, sm_scale,
             q_data_type, kv_data_type):
        assert causal and qo_indptr.dtype == kv_indptr.dtype == torch.int32 and q_data_type == kv_data_type
        type(self).plans += 1
        self.qo, self.kv = qo_indptr.tolist(), kv_indptr.tolist()
        self.window_left, self.cap, self.scale = window_left, logits_soft_cap, sm_scale

    def run(self, q, k, v):
        if type(self).fail_runs:
            type(self).fail_runs -= 1
            raise RuntimeError("JIT build failed: cutlass/util/command_line.h: No such file or directory")
        assert q.dtype == k.dtype == v.dtype
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        for b in range(len(self.qo) - 1):
            qb = q[self.qo[b]:self.qo[b + 1]].float()
            kb = k[self.kv[b]:self.kv[b + 1]].float().repeat_interleave(group, 1)
            vb = v[self.kv[b]:self.kv[b + 1]].float().repeat_interleave(group, 1)
            n, m = kb.shape[0], qb.shape[0]
            pos = torch.arange(n - m, n)[:, None]
            keys = torch.arange(n)[None, :]
            keep = keys <= pos
            if self.window_left >= 0:
                keep &= keys >= pos - self.window_left
            logits = torch.einsum("qhd,khd->hqk", qb, kb) * self.scale
            if self.cap:
                logits = self.cap * torch.tanh(logits / self.cap)
            p = torch.softmax(logits.masked_fill(~keep.to(logits.device), float("-inf")), -1)
            out[self.qo[b]:self.qo[b + 1]] = torch.einsum("hqk,khd->qhd", p, vb).to(q.dtype)
        return out


def fake_flashinfer():
    RaggedPrefill.plans = RaggedPrefill.fail_runs = 0
    return types.SimpleNamespace(__version__="0.7.2.post1", BatchPrefillWithRaggedKVCacheWrapper=RaggedPrefill)


def make_pool(fmt, gen):
    k = torch.randn(SLOTS, HKV, D, generator=gen).to(DEV)
    v = torch.randn(SLOTS, HKV, D, generator=gen).to(DEV)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(SLOTS, HKV, D, 128)
        (kd, ks), (vd, vs) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())
        k_scales, v_scales = layout.empty(DEV), layout.empty(DEV)
        layout.scatter(k_scales, torch.arange(SLOTS, device=DEV), ks)
        layout.scatter(v_scales, torch.arange(SLOTS, device=DEV), vs)
        return PagedKV(kd, vd, k_scales, v_scales, layout)
    if fmt == "fp8":
        return PagedKV((k / 0.5).to(torch.float8_e4m3fn), (v / 0.25).to(torch.float8_e4m3fn), k_scale=0.5,
                       v_scale=0.25)
    return PagedKV(k.bfloat16(), v.bfloat16())


def make_batch(gen, qlens=(5, 17, 1), prefixes=(0, 30, 9)):
    kvlens = [q + p for q, p in zip(qlens, prefixes)]
    qo = torch.tensor([0, *qlens]).cumsum(0).to(DEV)
    rails = KVRails(torch.tensor([0, *kvlens]).cumsum(0).to(DEV),
                    torch.randperm(SLOTS, generator=gen)[: sum(kvlens) + 3].to(DEV))  # 3 past indptr[-1]
    q = torch.randn(sum(qlens), HQ, D, generator=gen).bfloat16().to(DEV)  # bf16-exact: the family casts to bf16
    return q, rails, qo


class ExtendKeys:
    """A step of extend rows only over ``rails``/``qo`` (``layer_step.StepKeys``), with its own plan cache."""
    num_decode_rows, max_seq_len = 0, None

    def __init__(self, rails, qo):
        self.rails, self.qo, self.plans = rails, qo, DecodePlanCache()

    def extend_keys(self, window):
        return self.rails, self.qo


def rel_err(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8", "bf16"])
@pytest.mark.parametrize("window, cap", [(None, 0.0), (11, 5.0)])
def test_family_matches_the_reference(fmt, window, cap):
    gen = torch.Generator().manual_seed(7)
    kv = make_pool(fmt, gen)
    q, rails, qo = make_batch(gen)
    params = AttentionParams(D ** -0.5, window=window, logit_cap=cap)
    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fake_flashinfer(), torch.device(DEV)))
    got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache())
    assert RaggedPrefill.plans == 1 and got.dtype == torch.bfloat16
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params)
    assert rel_err(got, want) < TOL
    # The tolerance tells one key apart: the same batch with the window one key wider (or no cap) differs.
    other = AttentionParams(D ** -0.5, window=window + 1, logit_cap=cap) if window else \
        AttentionParams(D ** -0.5, logit_cap=3.0)
    assert rel_err(got, reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, other)) > 3 * TOL


def test_one_plan_per_key_per_step():
    gen = torch.Generator().manual_seed(8)
    kv = make_pool("mxfp8", gen)
    q, rails, qo = make_batch(gen)
    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fake_flashinfer(), torch.device(DEV)))
    step = DecodePlanCache()
    full, local = AttentionParams(D ** -0.5), AttentionParams(D ** -0.5, window=11)
    for params in (full, local, full, local):  # four layers, two keys
        route.extend(q, kv, rails, qo, params, plans=step)
    assert RaggedPrefill.plans == 2
    route.extend(q, kv, rails, qo, full, plans=DecodePlanCache())  # the next step plans again
    assert RaggedPrefill.plans == 3



def test_first_plan_of_a_shape_is_logged_with_its_time(caplog, monkeypatch):
    """A shape's first plan is where FlashInfer loads or JIT-builds its module (minutes on a machine without its
    cache): two INFO lines around that plan, none for the next plans of the shape; a new shape logs again."""
    from sglang_inkling_backend.flashinfer import install
    monkeypatch.setattr(install, "_PLANNED_SHAPES", set())
    gen = torch.Generator().manual_seed(8)
    kv = make_pool("bf16", gen)
    q, rails, qo = make_batch(gen)
    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fake_flashinfer(), torch.device(DEV)))

    def lines():
        return [r.getMessage() for r in caplog.records if "FlashInfer ragged prefill" in r.getMessage()]
    with caplog.at_level(logging.INFO):
        route.extend(q, kv, rails, qo, AttentionParams(D ** -0.5), plans=DecodePlanCache())
        first = lines()
        assert len(first) == 2 and "first plan of" in first[0] and "ready in" in first[1]
        assert f"({HQ}, {HKV}, {D}, torch.bfloat16, None, 0.0)" in first[0]
        route.extend(q, kv, rails, qo, AttentionParams(D ** -0.5), plans=DecodePlanCache())
        assert lines() == first and RaggedPrefill.plans == 2  # planned again, logged once
        route.extend(q, kv, rails, qo, AttentionParams(D ** -0.5, window=11), plans=DecodePlanCache())
        assert len(lines()) == 4 and ", 11, 0.0)" in lines()[2]

def test_layers_it_does_not_serve_run_the_triton_kernel_logged_once(caplog):
    gen = torch.Generator().manual_seed(9)
    kv = make_pool("bf16", gen)
    q, rails, qo = make_batch(gen, qlens=(3, 2), prefixes=(4, 0))
    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fake_flashinfer(), torch.device(DEV)))
    params = AttentionParams(1.0 / D, rel_bias=torch.randn(q.shape[0], HQ, 8, generator=gen).to(DEV))
    with caplog.at_level(logging.INFO, logger="sglang_inkling_backend.gpu.route"):
        for _ in range(2):
            got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache())
    assert RaggedPrefill.plans == 0
    note = "inkling: extend: the Triton kernel for layers with a relative bias (FlashInfer's ragged prefill adds none)"
    assert [r.getMessage() for r in caplog.records].count(note) == 1
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params)
    assert rel_err(got, want) < TOL
    sinks = AttentionParams(D ** -0.5, sinks=torch.zeros(HQ, device=DEV))
    assert route.extend_family.why_not(q, kv, sinks) == "attention sinks"
    narrow = PagedKV(kv.k_buffer[..., :48], kv.v_buffer[..., :48])
    assert route.extend_family.why_not(q[..., :48], narrow, AttentionParams(48 ** -0.5)) == \
        "head_dim 48 (FlashInfer's prefill serves (64, 128, 256))"
    assert route.extend_family.why_not(q.float(), kv, AttentionParams(D ** -0.5)) == \
        "a torch.bfloat16 pool with a torch.float32 query (FlashInfer's prefill is 16-bit)"


def test_a_first_call_failure_falls_back_once_and_later_failures_raise(caplog):
    gen = torch.Generator().manual_seed(10)
    kv = make_pool("bf16", gen)
    q, rails, qo = make_batch(gen, qlens=(3,), prefixes=(5,))
    params = AttentionParams(D ** -0.5)
    fi = fake_flashinfer()
    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fi, torch.device(DEV)))
    RaggedPrefill.fail_runs = 1
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend.gpu.route"):
        got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache())
    assert route.extend_family is None and "JIT build failed" in caplog.text and "Triton extend kernel" in caplog.text
    assert rel_err(got, reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params)) < TOL

    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fi, torch.device(DEV)))
    route.extend(q, kv, rails, qo, params, plans=DecodePlanCache())  # serves once
    RaggedPrefill.fail_runs = 1
    with pytest.raises(RuntimeError, match="JIT build failed"):
        route.extend(q, kv, rails, qo, params, plans=DecodePlanCache())


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8"])
@pytest.mark.parametrize("family", [False, True])
@pytest.mark.parametrize("prefixes", [(0, 30, 9), (0, 0, 0)])
def test_extend_rows_from_the_forward_match_the_torch_route(fmt, family, prefixes):
    """layer_step.attend with forward_kv on the Triton route (its kernel, or the family over the gathered or the
    forward's own K/V) against the torch route: the new rows' keys in bf16 from the forward, the prefix from the
    quantized pool. The same call reading the new keys from the pool differs by more than the tolerance."""
    from sglang_inkling_backend import layer_step
    from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
    from sglang_inkling_backend.routes import TorchRoute
    gen = torch.Generator().manual_seed(9)
    kv = make_pool(fmt, gen)
    q, rails, qo = make_batch(gen, prefixes=prefixes)
    rows = q.shape[0]
    new_k = (torch.randn(rows, HKV, D, generator=gen) * 2).bfloat16().to(DEV)
    new_v = (torch.randn(rows, HKV, D, generator=gen) * 2).bfloat16().to(DEV)
    spec = LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D ** -0.5)

    route = GpuRoute(kernels, fi_extend.FlashInferExtend(fake_flashinfer(), torch.device(DEV)) if family else None)
    params_of = lambda first, last: attention_params(spec, rows=last - first)  # noqa: E731
    got = layer_step.attend(route, spec, q, kv, ExtendKeys(rails, qo), params_of, None, forward_kv=(new_k, new_v))
    want = layer_step.attend(TorchRoute(), spec, q.float(), kv, ExtendKeys(rails, qo), params_of, None, forward_kv=(new_k, new_v))
    assert rel_err(got, want) < TOL
    from_pool = layer_step.attend(TorchRoute(), spec, q.float(), kv, ExtendKeys(rails, qo), params_of, None)
    assert rel_err(from_pool, want) > 3 * TOL
    if family:
        assert RaggedPrefill.plans == 1


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8", "bf16"])
@pytest.mark.parametrize("family", [False, True])
@pytest.mark.parametrize("forward, prefixes", [(False, (0, 30, 9)), (True, (0, 30, 9)), (True, (0, 0, 0))])
def test_a_group_plan_gives_each_layer_the_bytes_of_its_own_extend(fmt, family, forward, prefixes):
    """``plan_extend_group`` once, ``run_extend_group`` per layer (what SGLang's eager extend step does) against
    each layer's own ``layer_step.attend`` without a group plan: the same bytes, for layers like the planning one
    and for one with another softmax scale (and, per-tensor fp8, another K scale), which FlashInfer's plan holds.
    The group plans FlashInfer once (the stand-in counts); the other layer plans for itself."""
    from sglang_inkling_backend import layer_step
    from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
    gen = torch.Generator().manual_seed(11)
    kv = make_pool(fmt, gen)
    q, rails, qo = make_batch(gen, prefixes=prefixes)
    rows = q.shape[0]
    new_kv = tuple((torch.randn(rows, HKV, D, generator=gen) * 2).bfloat16().to(DEV) for _ in range(2))
    forward_kv = new_kv if forward else None
    spec = LayerSpec(window=11, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D ** -0.5)
    other_spec = LayerSpec(window=11, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=0.75 * D ** -0.5)
    other_kv = PagedKV(kv.k_buffer, kv.v_buffer, kv.k_scales, kv.v_scales, kv.layout,
                       k_scale=2 * kv.k_scale if fmt == "fp8" else kv.k_scale, v_scale=kv.v_scale)

    fi = fake_flashinfer()

    def route():
        return GpuRoute(kernels, fi_extend.FlashInferExtend(fi, torch.device(DEV)) if family else None)

    grouped, keys = route(), ExtendKeys(rails, qo)
    group = grouped.plan_extend_group(kv, rails, qo, attention_params(spec, rows=rows), num_q_heads=HQ, rows=rows,
                                      q_dtype=q.dtype, forward_rows=forward, plans=keys.plans)
    assert RaggedPrefill.plans == (1 if family else 0)
    for layer_spec, layer_kv in ((spec, kv), (spec, kv), (other_spec, other_kv)):
        params_of = lambda first, last, s=layer_spec: attention_params(s, rows=last - first)  # noqa: E731
        before = RaggedPrefill.plans
        got = layer_step.attend(grouped, layer_spec, q, layer_kv, keys, params_of, None, forward_kv=forward_kv,
                                extend_group=group)
        if layer_spec is spec:
            assert RaggedPrefill.plans == before  # the group's plan, not a new one
        want = layer_step.attend(route(), layer_spec, q, layer_kv, ExtendKeys(rails, qo), params_of, None, forward_kv=forward_kv)
        assert torch.equal(got, want), (layer_spec.softmax_scale, float((got.float() - want.float()).abs().max()))
    # the other layer's output is not the planning layer's: a plan misused across scales would be caught above
    assert not torch.equal(
        layer_step.attend(route(), spec, q, kv, ExtendKeys(rails, qo), lambda f, l: attention_params(spec, rows=l - f), None,
                          forward_kv=forward_kv),
        layer_step.attend(route(), other_spec, q, other_kv, ExtendKeys(rails, qo),
                          lambda f, l: attention_params(other_spec, rows=l - f), None, forward_kv=forward_kv))


def test_a_group_plan_refuses_a_layer_unlike_it_naming_both():
    gen = torch.Generator().manual_seed(12)
    kv = make_pool("mxfp8", gen)
    q, rails, qo = make_batch(gen)
    route, step = GpuRoute(kernels, None), DecodePlanCache()
    params = AttentionParams(D ** -0.5)
    group = route.plan_extend_group(kv, rails, qo, params, num_q_heads=HQ, rows=q.shape[0], q_dtype=q.dtype,
                                    forward_rows=False, plans=step)
    with pytest.raises(ValueError, match=r"made for q \(23, 4, 64\).*got q \(22, 4, 64\)"):
        route.run_extend_group(group, q[1:], kv, params, forward_kv=None, plans=step)
    with pytest.raises(ValueError, match="window None; got .* window 11"):
        route.run_extend_group(group, q, kv, AttentionParams(D ** -0.5, window=11), forward_kv=None, plans=step)
    with pytest.raises(ValueError, match="forward_kv is given but the step's extend plan reads every key"):
        route.run_extend_group(group, q, kv, params, forward_kv=(q[:, :HKV], q[:, :HKV]), plans=step)
