"""The in-tree Inkling model seam, at the level that runs on a CPU.

SGLang's Inkling model module (``srt/models/inkling_common/attn.py``) cannot be imported here (it needs the CUDA-only
``cutlass`` package), so the model's attention layer cannot be built. What is tested instead:
- the name map the model's ``serving_attention_backend`` gets (``inkling`` -> the ``fa4`` contract), installed
  through SGLang's HookRegistry on a stand-in module registered under the model module's name;
- SGLang's real ``inkling_attn_prologue_decode`` symbol, hooked: with inkling serving decode it runs our prologue;
- one Inkling decode step exactly as the model's FA4 path makes it (fused prologue storing MXFP8 K/V + scales into
  the inkling pool, then ``attn(q_fp8, k, v, save_kv_cache=False, rel_bias=..., q_descale=...)``) through
  ``InklingAttnBackend``, against a dense float32 attention with Inkling semantics (scale 1/D, relative bias,
  local window) over the K/V history after the MXFP8 round trip.
"""
import importlib.util
import sys
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("sglang") is None:  # found, not imported: the CPU shims must come first
    pytest.skip("SGLang is not installed (scripts/setup.sh installs it; the core tests run without it)",
                allow_module_level=True)
import torch

from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

prepare_sglang_cpu_import()

import sglang.kernels.ops.attention.inkling_attn_prologue as sglang_prologue  # noqa: E402
from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from sglang_inkling_backend import kv_views, mxfp8  # noqa: E402
from sglang_inkling_backend.hosts.sglang import inkling_model  # noqa: E402
from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend  # noqa: E402
from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class  # noqa: E402

HQ, HKV, D, D_REL, W = 4, 2, 128, 16, 4


@pytest.fixture
def isolated_hooks(monkeypatch):
    """HookRegistry state and the patched module attributes are restored after the test."""
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list, {k: list(v) for k, v in HookRegistry._hooks.items()}))
    monkeypatch.setattr(HookRegistry, "_patched", set(HookRegistry._patched))
    monkeypatch.setattr(sglang_prologue, "inkling_attn_prologue_decode", sglang_prologue.inkling_attn_prologue_decode)
    monkeypatch.setattr(sglang_prologue, "inkling_attn_prologue_extend", sglang_prologue.inkling_attn_prologue_extend)
    stand_in = types.ModuleType(inkling_model.ATTN_MODULE)

    def serving_attention_backend(forward_batch):  # what the runner stamped: the configured name
        return forward_batch.configured_backend

    def attention_kwargs_backend(forward_batch):  # the model's own check, read from module globals like attn.py
        backend = stand_in.serving_attention_backend(forward_batch)
        assert backend in ("fa4", "triton")
        return backend

    stand_in.serving_attention_backend = serving_attention_backend
    stand_in.attention_kwargs_backend = attention_kwargs_backend
    monkeypatch.setitem(sys.modules, inkling_model.ATTN_MODULE, stand_in)
    return stand_in


def test_name_map_only_touches_inkling():
    assert inkling_model.serving_backend_after("inkling", None) == "fa4"
    assert inkling_model.serving_backend_after("triton", None) == "triton"
    assert inkling_model.serving_backend_after("fa4", None) == "fa4"


def test_seam_installs_through_hook_registry(isolated_hooks):
    fb = SimpleNamespace(configured_backend="inkling")
    with pytest.raises(AssertionError):
        isolated_hooks.attention_kwargs_backend(fb)  # SGLang as shipped rejects the name
    assert inkling_model.install_seam_if_loaded()
    assert inkling_model.seam_installed()
    assert isolated_hooks.attention_kwargs_backend(fb) == "fa4"
    assert isolated_hooks.attention_kwargs_backend(SimpleNamespace(configured_backend="triton")) == "triton"
    assert inkling_model.install_seam_if_loaded()  # idempotent
    assert [h for _, h, _ in HookRegistry._hooks[inkling_model.SERVING_TARGET]].count(
        inkling_model.serving_backend_after) == 1


def test_seam_not_installed_without_the_model(monkeypatch):
    monkeypatch.delitem(sys.modules, inkling_model.ATTN_MODULE, raising=False)
    assert not inkling_model.install_seam_if_loaded()


def test_prologue_hook_defers_to_sglang_unless_inkling_serves_decode():
    calls = []

    def sglang_kernel(*args, **kwargs):
        calls.append("sglang")
        return "sglang"

    backend = SimpleNamespace(decode_attention_backend_str="fa4")
    with forward_context(ForwardContext(attn_backend=backend)):
        assert inkling_model.prologue_decode_around(sglang_kernel, torch.zeros(1, 8)) == "sglang"
    assert calls == ["sglang"]
    assert not inkling_model.decode_backend_is_inkling()  # outside a forward


def test_prologue_hook_runs_the_decode_routes_prologue():
    """With inkling serving decode, the hooked prologue is the serving route's ``decode_prologue`` (the torch route's
    reference on a CPU), found on the decode side of SGLang's prefill/decode split too."""
    from sglang_inkling_backend.reference import prologue as reference_prologue

    backend = _inkling_step_setup()[2]
    split = SimpleNamespace(prefill_backend=SimpleNamespace(), decode_backend=backend,
                            decode_attention_backend_str="inkling")
    with forward_context(ForwardContext(attn_backend=split)):
        assert inkling_model.our_prologue_decode() is reference_prologue.inkling_attn_prologue_decode
    calls = []

    class Marked(type(backend.route)):
        @property
        def decode_prologue(self):
            return lambda *args, **kwargs: calls.append((args, kwargs)) or "ours"

    backend.use_route(Marked())
    with forward_context(ForwardContext(attn_backend=split)):
        assert inkling_model.prologue_decode_around(lambda *a, **k: "sglang", "qkvr", mxfp8_quant=False) == "ours"
    assert calls == [(("qkvr",), {"mxfp8_quant": False})]


# --- one decode step of an Inkling attention layer, FA4 path, MXFP8 pool ------------------------------------------


def _inkling_step_setup(seed=0, window=None):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16)  # noqa: E731
    layer = RadixAttention(HQ, D, 1.0 / D, HKV, layer_id=0, sliding_window_size=window - 1 if window else -1)
    r2t = ReqToTokenPool(4, 300, "cpu", False)
    pool = inkling_pool_class("mxfp8")(512, 128, torch.float8_e4m3fn, HKV, D, 1, "cpu", False)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=r2t, token_to_kv_pool=pool, dtype=torch.bfloat16,
                             page_size=128, kv_cache_dtype=torch.float8_e4m3fn,
                             model=torch.nn.ModuleList([layer]),
                             model_config=SimpleNamespace(is_encoder_decoder=False, head_dim=D, context_len=300))
    backend = InklingAttnBackend(runner)
    backend.decode_attention_backend_str = "inkling"  # what ModelRunner stamps
    # history: request rows 1 and 2 with 150 and 37 cached tokens at scattered slots
    free = (torch.randperm(511, generator=g) + 1).tolist()
    history = {}
    for row, n in ((1, 150), (2, 37)):
        slots = torch.tensor(free[:n]); free = free[n:]
        r2t.req_to_token[row, :n] = slots.to(torch.int32)
        k, v = rnd(n, HKV, D), rnd(n, HKV, D)
        pool.set_kv_buffer(layer, slots, k, v)
        history[row] = (k, v)
    new_slots = torch.tensor(free[:2])
    for i, row in enumerate((1, 2)):
        r2t.req_to_token[row, history[row][0].shape[0]] = int(new_slots[i])
    seq_lens = torch.tensor([151, 38])
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, req_pool_indices=torch.tensor([1, 2]),
                         seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(), out_cache_loc=new_slots,
                         out_cache_loc_is_physical=False, extend_seq_lens=None, encoder_lens=None, spec_info=None)
    # the model's packed projection row [q | k | v | r] and its short-conv state
    dq, dkv = HQ * D, HKV * D
    qkvr = rnd(2, dq + 2 * dkv + HQ * D_REL)
    conv = dict(k_cache=rnd(3, W - 1, dkv), v_cache=rnd(3, W - 1, dkv), cache_indices=torch.tensor([1, 2], dtype=torch.int32),
                cache_mask=torch.tensor([True, True]), k_weight=rnd(dkv, W, scale=0.3), v_weight=rnd(dkv, W, scale=0.3),
                q_gamma=rnd(D, scale=0.1) + 1, k_gamma=rnd(D, scale=0.1) + 1)
    proj = rnd(D_REL, 12, scale=0.5)
    return layer, pool, backend, fb, history, qkvr, conv, proj


def _dense_inkling(q, ks, vs, rel, window):
    """q [Hq, D] float at the last position of keys ks/vs [L, Hkv, D]; Inkling: scale 1/D + relative bias."""
    L = ks.shape[0]
    k = ks.float().repeat_interleave(HQ // HKV, 1)
    v = vs.float().repeat_interleave(HQ // HKV, 1)
    logits = torch.einsum("hd,lhd->hl", q.float(), k) / D
    dist = (L - 1) - torch.arange(L)
    e = rel.shape[-1]
    logits = logits + torch.where((dist < e).view(1, -1), rel.float()[:, dist.clamp(max=e - 1)], 0.0)
    if window is not None:
        logits = logits.masked_fill((dist > window - 1).view(1, -1), float("-inf"))
    return torch.einsum("hl,lhd->hd", torch.softmax(logits, -1), v)


@pytest.mark.parametrize("window", [None, 64])
def test_inkling_fa4_path_decode_step_on_inkling_backend(isolated_hooks, monkeypatch, window):
    monkeypatch.setenv(inkling_model.QUERY_FORMAT_ENV, "mxfp8")  # FA4's contract: the prologue rounds q
    layer, pool, backend, fb, history, qkvr, conv, proj = _inkling_step_setup(window=window)
    assert inkling_model.install_seam_if_loaded()
    dq, dkv = HQ * D, HKV * D
    q, k, v, r = qkvr.split([dq, dkv, dkv, HQ * D_REL], dim=-1)  # strided views, as _project_qkvr makes them
    k_buf, v_buf = pool.get_key_buffer(0), pool.get_value_buffer(0)
    sfk, sfv = pool.get_kv_scale_buffer(0)
    # the model's eligibility checks for the fused MXFP8 store (attn.py _fused_kv_store_eligible and friends)
    assert k_buf.dtype == torch.float8_e4m3fn and k_buf.stride()[1:] == (D, 1) and k_buf.stride(0) % 32 == 0
    assert sfk.dim() == 5 and sfv.dim() == 5 and pool.page_size == 128
    backend.init_forward_metadata(fb)
    conv_before = conv["k_cache"].clone()
    with forward_context(ForwardContext(attn_backend=backend)):
        # the model imports the symbol from SGLang's module at call time: the hooked one
        q_out, k_out, v_out, q_scale = sglang_prologue.inkling_attn_prologue_decode(
            q, conv["k_cache"], conv["v_cache"], conv["cache_indices"], conv["cache_mask"], conv["k_weight"],
            conv["v_weight"], conv["q_gamma"], conv["k_gamma"], 1e-6, fb.out_cache_loc, k_buf, v_buf, 0, dq,
            dq + dkv, dq, dkv, do_store=True, mxfp8_quant=True, sfk=sfk, sfv=sfv, page_size=128)
        rel = (r.reshape(2, HQ, D_REL).float() @ proj.float()).to(torch.bfloat16)  # RelLogitsProj, no tau
        out = backend.forward(q_out, k_out, v_out, layer, fb, save_kv_cache=False, rel_bias=rel,
                              rel_bias_event=None, q_descale=q_scale)
    assert q_out.dtype == torch.float8_e4m3fn and q_scale is not None
    assert not torch.equal(conv["k_cache"], conv_before)  # our prologue ran (it shifts the conv cache)
    # the prologue stored the new token's K/V as MXFP8 in the pool, at SGLang's interleaved scale positions
    layout = pool.scale_layout(0)
    kd, ks = mxfp8.quantize(k_out.view(2, HKV, D))
    assert torch.equal(k_buf[fb.out_cache_loc].view(torch.uint8), kd.view(torch.uint8))
    assert torch.equal(layout.gather(sfk, fb.out_cache_loc), ks)
    # attention against the dense Inkling oracle over the MXFP8 round trip of the history plus the new token
    rt = lambda x: mxfp8.dequantize(*mxfp8.quantize(x), torch.float32)  # noqa: E731
    q_deq = mxfp8.dequantize(q_out.view(2, HQ, D), q_scale.view(torch.uint8).view(2, HQ, D // 32), torch.float32)
    worst = 0.0
    for b, row in enumerate((1, 2)):
        hk, hv = history[row]
        ks_all = torch.cat([rt(hk), rt(k_out[b].view(1, HKV, D))])
        vs_all = torch.cat([rt(hv), rt(v_out[b].view(1, HKV, D))])
        ref = _dense_inkling(q_deq[b], ks_all, vs_all, rel[b], window)
        worst = max(worst, float((out[b].view(HQ, D).float() - ref).abs().max()))
    assert worst <= 2 ** -7, worst


def test_backend_reads_triton_style_and_prequantized_kv_kwargs():
    """The model's non-fused MXFP8 path: q, k, v all quantized by to_mxfp8 (k/v_descale), relative bias as the Triton
    score_mod; the backend stores the given bytes and scales as they are."""
    layer, pool, backend, fb, history, qkvr, conv, proj = _inkling_step_setup(seed=1)
    from sglang.kernels.ops.attention.score_mod import relative_bias_score_mod

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, HQ, D, generator=g).to(torch.bfloat16)
    k = torch.randn(2, HKV, D, generator=g).to(torch.bfloat16)
    v = torch.randn(2, HKV, D, generator=g).to(torch.bfloat16)
    (qd, qs), (kd, ks), (vd, vs) = mxfp8.quantize(q), mxfp8.quantize(k), mxfp8.quantize(v)
    e8m0 = torch.float8_e8m0fnu
    rel = torch.randn(2, HQ, 12, generator=g).to(torch.bfloat16)
    backend.init_forward_metadata(fb)
    out = backend.forward(qd.view(2, -1), kd.view(2, -1), vd.view(2, -1), layer, fb,
                          score_mod=relative_bias_score_mod, aux_tensors=[rel], q_descale=qs.view(e8m0),
                          k_descale=ks.view(e8m0), v_descale=vs.view(e8m0))
    assert torch.equal(pool.get_key_buffer(0)[fb.out_cache_loc].view(torch.uint8), kd.view(torch.uint8))
    assert torch.equal(pool.scale_layout(0).gather(pool.get_kv_scale_buffer(0)[1], fb.out_cache_loc), vs)
    rt = lambda x: mxfp8.dequantize(*mxfp8.quantize(x), torch.float32)  # noqa: E731
    for b, row in enumerate((1, 2)):
        hk, hv = history[row]
        ref = _dense_inkling(rt(q[b]), torch.cat([rt(hk), rt(k[b:b + 1])]), torch.cat([rt(hv), rt(v[b:b + 1])]),
                             rel[b], None)
        assert float((out[b].view(HQ, D).float() - ref).abs().max()) <= 2 ** -7


@pytest.mark.parametrize("window", [None, 64])
def test_decode_step_with_the_query_kept_bf16(isolated_hooks, monkeypatch, window):
    """The default (INKLING_MXFP8_QUERY unset: bf16): the hooked decode prologue stores MXFP8 K/V as before and
    returns q unrounded with UNROUNDED_QUERY for q_descale (the model passes it on); the backend attends with that
    q. Against the oracle with q rounded the output is further off than with q as it is."""
    monkeypatch.delenv(inkling_model.QUERY_FORMAT_ENV, raising=False)
    assert inkling_model.query_format() == "bf16"
    layer, pool, backend, fb, history, qkvr, conv, proj = _inkling_step_setup(window=window)
    assert inkling_model.install_seam_if_loaded()
    dq, dkv = HQ * D, HKV * D
    q, k, v, r = qkvr.split([dq, dkv, dkv, HQ * D_REL], dim=-1)
    k_buf, v_buf = pool.get_key_buffer(0), pool.get_value_buffer(0)
    sfk, sfv = pool.get_kv_scale_buffer(0)
    backend.init_forward_metadata(fb)
    with forward_context(ForwardContext(attn_backend=backend)):
        q_out, k_out, v_out, q_scale = sglang_prologue.inkling_attn_prologue_decode(
            q, conv["k_cache"], conv["v_cache"], conv["cache_indices"], conv["cache_mask"], conv["k_weight"],
            conv["v_weight"], conv["q_gamma"], conv["k_gamma"], 1e-6, fb.out_cache_loc, k_buf, v_buf, 0, dq,
            dq + dkv, dq, dkv, do_store=True, mxfp8_quant=True, sfk=sfk, sfv=sfv, page_size=128)
        rel = (r.reshape(2, HQ, D_REL).float() @ proj.float()).to(torch.bfloat16)
        out = backend.forward(q_out, k_out, v_out, layer, fb, save_kv_cache=False, rel_bias=rel,
                              rel_bias_event=None, q_descale=q_scale)
    assert q_out.dtype == torch.bfloat16 and q_scale is kv_views.UNROUNDED_QUERY
    kd, ks = mxfp8.quantize(k_out.view(2, HKV, D))
    assert torch.equal(k_buf[fb.out_cache_loc].view(torch.uint8), kd.view(torch.uint8))
    assert torch.equal(pool.scale_layout(0).gather(sfk, fb.out_cache_loc), ks)
    rt = lambda x: mxfp8.dequantize(*mxfp8.quantize(x), torch.float32)  # noqa: E731
    worst = rounded = 0.0
    for b, row in enumerate((1, 2)):
        hk, hv = history[row]
        ks_all = torch.cat([rt(hk), rt(k_out[b].view(1, HKV, D))])
        vs_all = torch.cat([rt(hv), rt(v_out[b].view(1, HKV, D))])
        got = out[b].view(HQ, D).float()
        worst = max(worst, float((got - _dense_inkling(q_out[b].view(HQ, D), ks_all, vs_all, rel[b], window))
                                 .abs().max()))
        rounded = max(rounded, float((got - _dense_inkling(rt(q_out[b].view(HQ, D)), ks_all, vs_all, rel[b], window))
                                     .abs().max()))
    assert worst <= 2 ** -7 and rounded > worst, (worst, rounded)


def test_extend_prologue_hook_keeps_the_query_and_stores_mxfp8(isolated_hooks, monkeypatch):
    """The hooked extend prologue (SGLang's kernel, stood in for here) runs in bf16 mode without its store, then
    K/V go to the MXFP8 pool as the MXFP8 mode would store them; SGLang's kernel runs as called when inkling does
    not serve or the query format is mxfp8."""
    layer, pool, backend, fb, history, qkvr, conv, proj = _inkling_step_setup()
    calls = []
    g = torch.Generator().manual_seed(3)
    k_new, v_new = (torch.randn(3, HKV * D, generator=g).bfloat16() for _ in range(2))

    def sglang_kernel(**kw):
        calls.append({name: kw[name] for name in ("mxfp8_quant", "do_store", "sfk")})
        return kw["qkvr"][:, :HQ * D], k_new, v_new, ("q scale" if kw["mxfp8_quant"] else None)

    sglang_kernel.__wrapped__ = sglang_prologue.inkling_attn_prologue_extend  # its signature, for the hook's bind
    k_buf, v_buf = pool.get_key_buffer(0), pool.get_value_buffer(0)
    sfk, sfv = pool.get_kv_scale_buffer(0)
    loc = torch.tensor([300, 301, 302])
    x = torch.randn(3, HQ * D, generator=g).bfloat16()
    args = dict(qkvr=x, k_cache=None, v_cache=None, cache_indices=None, cache_mask=None, has_initial_state=None,
                cu=None, si=None, k_weight=None, v_weight=None, track_rows=None, track_mask=None, track_dst=None,
                q_gamma=None, k_gamma=None, eps=1e-6, loc=loc, k_buf=k_buf, v_buf=v_buf, q_off=0, k_off=0, v_off=0,
                dq=HQ * D, dkv=HKV * D, do_store=True, mxfp8_quant=True, sfk=sfk, sfv=sfv, page_size=128)
    backend.prefill_attention_backend_str = "inkling"
    monkeypatch.setenv(inkling_model.QUERY_FORMAT_ENV, "bf16")
    # The Inkling model's forward sees SGLang's hybrid wrapper, which holds ours as full_attn_backend.
    from sglang.srt.layers.attention.linear.inkling_sconv_backend import InklingShortConvHybridAttnBackend

    wrapper = object.__new__(InklingShortConvHybridAttnBackend)
    wrapper.full_attn_backend = backend
    wrapper.prefill_attention_backend_str = "inkling"
    with forward_context(ForwardContext(attn_backend=wrapper)):
        q, k, v, q_scale = inkling_model.prologue_extend_around(sglang_kernel, **args)
    assert calls == [{"mxfp8_quant": False, "do_store": False, "sfk": None}]
    assert torch.equal(q, x) and q_scale is kv_views.UNROUNDED_QUERY
    kd, ks = mxfp8.quantize(k_new.view(3, HKV, D))
    assert torch.equal(k_buf[loc].view(torch.uint8), kd.view(torch.uint8))
    assert torch.equal(pool.scale_layout(0).gather(sfk, loc), ks)
    vd, vs = mxfp8.quantize(v_new.view(3, HKV, D))
    assert torch.equal(v_buf[loc].view(torch.uint8), vd.view(torch.uint8))
    for query_format, serving in (("mxfp8", "inkling"), ("bf16", "fa4")):
        monkeypatch.setenv(inkling_model.QUERY_FORMAT_ENV, query_format)
        backend.prefill_attention_backend_str = serving
        calls.clear()
        with forward_context(ForwardContext(attn_backend=backend)):
            assert inkling_model.prologue_extend_around(sglang_kernel, **args)[3] == "q scale"
        assert calls == [{"mxfp8_quant": True, "do_store": True, "sfk": sfk}]
    monkeypatch.setenv(inkling_model.QUERY_FORMAT_ENV, "fp4")
    with pytest.raises(ValueError, match="INKLING_MXFP8_QUERY must be one of"):
        inkling_model.query_format()
