"""Arguments of the wrong kind: a tensor where it cannot be used, something else where a tensor goes, a value object
built around its checks, extents and counts that disagree. Each class is one check in ``checks.py`` used at every
entry it reaches; every refusal is a ValueError/TypeError naming the argument, raised before any buffer is written
(buffers are compared byte for byte).

- device: a tensor on the meta device, a device torch cannot reach here (``require_tensor``, ``require_device``,
  ``require_pin_memory``);
- list: a Python list (or None) where a tensor goes (``require_tensor``);
- bypass: a value object built without its checking factory (``ScaleLayout(...)``, a layout that is no
  ``ScaleLayout``, rails of lists): the checks are the constructor's own;
- extent: an extent of 0 where one is needed, tensors read together whose shapes differ (``require_extents``,
  ``require_same_shape``);
- count: a per-request array shorter than its count (``require_entries``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from sglang_inkling_backend import checks, kv_views, layer_step, mxfp8, rails
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext
from sglang_inkling_backend.kv_pool import HostKVTier, InklingKVPool
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec
from sglang_inkling_backend.reference.attention import paged_decode_attention, paged_extend_attention
from sglang_inkling_backend.routes import TorchRoute
from sglang_inkling_backend.scale_layout import ScaleLayout

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_bad_input_values' SGLang pool builder
from test_bad_input_values import _sglang_pool  # noqa: E402

T = torch.tensor
META = "on the meta device"
UNREACHABLE = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"  # past this machine's GPUs


def meta(t: torch.Tensor) -> torch.Tensor:
    return t.to("meta")


def plan():
    return LayerPlan.from_windows({0: None, 1: 4, 2: None}, num_q_heads=2, num_kv_heads=1, head_dim=32)


def pool(fmt="bf16"):
    p = InklingKVPool(plan(), size=256 if fmt == "mxfp8" else 64, page_size=128 if fmt == "mxfp8" else 1,
                      kv_format=fmt)
    k = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    p.set_kv_buffer(0, T([130, 131]) if fmt == "mxfp8" else T([3, 4]), k, k)
    return p, k


def snapshot(p):
    return {(i, n): t.clone() for i, layer in p.layers.items() for n, t in enumerate(layer.tensors())}


def refused_untouched(p, exc, match, fn):
    before = snapshot(p)
    with pytest.raises(exc, match=match):
        fn()
    after = snapshot(p)
    assert all(torch.equal(before[key].view(torch.uint8), after[key].view(torch.uint8)) for key in before)


def kv16():
    g = torch.Generator().manual_seed(2)
    return PagedKV(torch.randn(16, 1, 32, generator=g), torch.randn(16, 1, 32, generator=g))


def decode(kv=None, q=None, indptr=None, indices=None, params=None):
    return paged_decode_attention(torch.randn(2, 2, 32) if q is None else q, kv16() if kv is None else kv,
                                  T([0, 3, 8]) if indptr is None else indptr,
                                  torch.arange(1, 9) if indices is None else indices,
                                  AttentionParams(0.2) if params is None else params)


# --- the checks themselves -------------------------------------------------------------------------------------
def test_require_device_refuses_meta_and_unreachable_devices_and_keeps_reachable_ones():
    assert checks.require_device("cpu") == torch.device("cpu")
    assert checks.require_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device must be a device that can hold data here, got meta"):
        checks.require_device("meta")
    with pytest.raises(ValueError, match=rf"pool device must be a device that can hold data here, got {UNREACHABLE}"):
        checks.require_device(UNREACHABLE, "pool device")
    with pytest.raises(ValueError, match=r"device must be a torch device or its name .* got 'bogus'"):
        checks.require_device("bogus")
    with pytest.raises(TypeError, match=r"device must be a torch.device or its name .* got None"):
        checks.require_device(None)


def test_require_tensor_refuses_lists_and_meta_tensors_by_name():
    t = torch.zeros(2)
    assert checks.require_tensor(t, "x") is t
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        checks.require_tensor([0.0], "x")
    with pytest.raises(ValueError, match=rf"x must be a torch.Tensor holding data, got a tensor {META}"):
        checks.require_tensor(meta(t), "x")


def test_extent_shape_and_count_checks_name_the_argument():
    with pytest.raises(ValueError, match=r"bias's extent \(dim 2\) must be >= 1, got shape \(1, 2, 0\)"):
        checks.require_extents(torch.zeros(1, 2, 0), "bias", (None, None, "extent"))
    checks.require_extents(torch.zeros(0, 2, 1), "bias", (None, None, "extent"))  # an unlabelled dim may be 0
    with pytest.raises(ValueError, match=r"k and v must have the same shape, got \(1, 2\) and \(1, 3\)"):
        checks.require_same_shape(torch.zeros(1, 2), "k", torch.zeros(1, 3), "v")
    with pytest.raises(ValueError, match=r"seq_lens must be at least 3 entries long, one per request, got 2"):
        checks.require_entries(torch.zeros(2), "seq_lens", 3, "request", at_least=True)
    with pytest.raises(ValueError, match=r"caches must be 2 entries long, one per request, got 3"):
        checks.require_entries([1, 2, 3], "caches", 2, "request")


# --- device: meta tensors and devices torch cannot reach ------------------------------------------------------
@pytest.mark.parametrize("fmt, call, match", [
    ("bf16", lambda p, k: p.set_kv_buffer(0, T([5, 6]), meta(k), k), r"cache_k must be .* holding data"),
    ("bf16", lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, meta(k)), r"cache_v must be .* holding data"),
    ("bf16", lambda p, k: p.set_kv_buffer(0, meta(T([5, 6])), k, k), r"loc must be .* holding data"),
    ("mxfp8", lambda p, k: p.set_kv_buffer(0, meta(T([132, 133])), k, k), r"loc must be .* holding data"),
    ("mxfp8", lambda p, k: p.set_mxfp8_kv_buffer(0, T([132, 133]), k.to(torch.float8_e4m3fn),
                                                 meta(torch.zeros(2, 1, 1, dtype=torch.uint8)),
                                                 k.to(torch.float8_e4m3fn), torch.zeros(2, 1, 1, dtype=torch.uint8)),
     r"k_scales must be .* holding data"),
    ("mxfp8", lambda p, k: p.set_mxfp8_kv_buffer(0, T([132, 133]), k.to(torch.float8_e4m3fn),
                                                 torch.zeros(2, 1, 1, dtype=torch.uint8),
                                                 meta(k.to(torch.float8_e4m3fn)),
                                                 torch.zeros(2, 1, 1, dtype=torch.uint8)),
     r"v_data must be .* holding data"),
    ("bf16", lambda p, k: p.move_kv_cache(T([9, 10]), meta(T([3, 4]))), r"src_loc must be .* holding data"),
    ("bf16", lambda p, k: p.read_kv(0, meta(T([3]))), r"slots must be .* holding data"),
    ("bf16", lambda p, k: HostKVTier(p, 2).backup(meta(T([3])), T([0])), r"device_pages must be .* holding data"),
    ("bf16", lambda p, k: HostKVTier(p, 2).restore(meta(T([0])), T([3])), r"host_pages must be .* holding data"),
])
def test_the_pool_refuses_meta_tensors_before_any_write(fmt, call, match):
    """Was: NotImplementedError from a copy (set_kv_buffer, move, read), and for set_mxfp8_kv_buffer after its K
    data were written (a partial write)."""
    p, k = pool(fmt)
    refused_untouched(p, ValueError, match + r", got a tensor on the meta device", lambda: call(p, k))


@pytest.mark.parametrize("device", [UNREACHABLE, torch.device(UNREACHABLE), "meta"])
def test_constructors_refuse_a_device_torch_cannot_reach(device):
    """Was: torch's AssertionError ('Torch not compiled with CUDA enabled') for InklingKVPool(device='cuda') on a
    machine without CUDA; a meta pool was built (holding nothing)."""
    name = str(torch.device(device))
    with pytest.raises(ValueError, match=rf"device must be a device that can hold data here, got {name}"):
        InklingKVPool(plan(), 64, 1, device=device)
    with pytest.raises(ValueError, match=rf"device must be a device that can hold data here, got {name}"):
        ScaleLayout.for_pool(8, 1, 32, 1).empty(device)
    with pytest.raises(ValueError, match=rf"device must be a device that can hold data here, got {name}"):
        SpecVerify.from_trees([(torch.ones(1, 1, dtype=torch.bool), T([0]))], device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: 'cuda' is a device it can reach")
def test_a_pool_on_cuda_without_cuda_is_refused_by_name():
    with pytest.raises(ValueError, match=r"device must be a device that can hold data here, got cuda: torch cannot "
                                         r"reach a cuda device"):
        InklingKVPool(plan(), 64, 1, device="cuda")


def test_host_tier_pin_memory_is_a_bool_and_needs_an_accelerator():
    p, _ = pool()
    with pytest.raises(TypeError, match=r"pin_memory must be a bool, got 1"):
        HostKVTier(p, 2, pin_memory=1)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator.is_available() if accelerator is not None else torch.cuda.is_available():
        pytest.skip("this machine has an accelerator: pinned memory is available")
    with pytest.raises(ValueError, match=r"pin_memory=True needs an accelerator torch can reach"):
        HostKVTier(p, 2, pin_memory=True)  # was: torch's RuntimeError


@pytest.mark.parametrize("call, match", [
    (lambda: PagedKV(meta(torch.zeros(8, 1, 32)), meta(torch.zeros(8, 1, 32))), "k_buffer"),
    (lambda: kv16().read(meta(T([1, 2]))), "slots"),
    (lambda: AttentionParams(0.2, sinks=meta(torch.zeros(2))), "sinks"),
    (lambda: AttentionParams(0.2, rel_bias=meta(torch.zeros(2, 2, 4))), "rel_bias"),
    (lambda: decode(q=meta(torch.randn(2, 2, 32))), "q"),
    (lambda: decode(indptr=meta(T([0, 3, 8]))), "kv_indptr"),
    (lambda: decode(indices=meta(torch.arange(1, 9))), "kv_indices"),
    (lambda: paged_extend_attention(torch.randn(6, 2, 32), kv16(), T([0, 5, 8]), torch.arange(1, 9),
                                    meta(T([0, 4, 6])), AttentionParams(0.2)), "qo_indptr"),
    (lambda: SpecVerify(meta(torch.ones(1, dtype=torch.bool)), T([0, 1]), T([0])), "tree_mask"),
    (lambda: rails.gather_rails(torch.arange(40).view(4, 10), T([1]), meta(T([3]))), "seq_lens"),
    (lambda: rails.page_table(torch.arange(40).view(4, 10), meta(T([1])), 2), "rows"),
    (lambda: rails.block_table_token_table(meta(T([[1]])), 4), "block_table"),
    (lambda: kv_views.dequantize_query(meta(torch.zeros(2, 64)), 2, 32, None), "q"),
    (lambda: mxfp8.quantize(meta(torch.ones(32))), "x"),
    (lambda: checks.require_slots(meta(T([1, 2])), "loc", 10), "loc"),
    (lambda: checks.require_slots_once(meta(T([1, 2])), "loc", 10), "loc"),
    (lambda: ScaleLayout.for_pool(8, 1, 32, 1).gather(meta(torch.zeros(8, 1, 1, dtype=torch.uint8)), T([1])), "sf"),
])
def test_every_core_entry_refuses_a_meta_tensor_by_name(call, match):
    """Was: NotImplementedError/RuntimeError from the first read, or meta results (no data) returned silently."""
    with pytest.raises(ValueError, match=rf"{match} must be .* holding data, got a tensor {META}"):
        call()


def test_a_meta_scale_source_is_refused_before_the_indexed_store_ignores_it():
    layout, sf = ScaleLayout.for_pool(8, 1, 32, 1), torch.zeros(8, 1, 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"scales must be .* holding data, got a tensor {META}"):
        layout.scatter(sf, T([1]), meta(torch.ones(1, 1, 1, dtype=torch.uint8)))  # was: no error, nothing stored
    assert not sf.any()


def test_layer_step_attend_refuses_a_meta_or_list_out():
    route, spec = TorchRoute(), LayerSpec(num_q_heads=2, num_kv_heads=1, head_dim=32, softmax_scale=0.2)
    r = rails.KVRails(T([0, 3, 8]), torch.arange(1, 9))
    keys = type("Keys", (), dict(num_decode_rows=2, max_seq_len=8, plans=None, decode_keys=lambda s, w, p: r))()
    from sglang_inkling_backend.step_plans import DecodePlanCache
    keys.plans = DecodePlanCache()
    q = torch.randn(2, 2, 32)
    assert layer_step.attend(route, spec, q, kv16(), keys, lambda a, b: AttentionParams(0.2), None).shape == q.shape
    with pytest.raises(ValueError, match=rf"out must be .* holding data, got a tensor {META}"):
        layer_step.attend(route, spec, q, kv16(), keys, lambda a, b: AttentionParams(0.2), None,
                          torch.zeros(2, 2, 32, device="meta"))  # was: a meta result, no error
    with pytest.raises(TypeError, match=r"out must be .* got list"):
        layer_step.attend(route, spec, q, kv16(), keys, lambda a, b: AttentionParams(0.2), None, [0.0])


# --- list: a Python list where a tensor goes -------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda p: HostKVTier(p, 2).backup([3], T([0])), "device_pages"),
    (lambda p: HostKVTier(p, 2).backup(T([3]), [0]), "host_pages"),
    (lambda p: HostKVTier(p, 2).restore(T([0]), [3]), "device_pages"),
    (lambda p: HostKVTier(p, 2).backup(None, T([0])), "device_pages"),
])
def test_the_host_tier_refuses_pages_that_are_not_tensors(call, match):
    """Was: AttributeError ('list' object has no attribute 'shape')."""
    p, _ = pool()
    refused_untouched(p, TypeError, rf"{match} must be a 1-D int32/int64 tensor of page ids, got", lambda: call(p))


@pytest.mark.parametrize("call, match", [
    (lambda: rails.page_table([[0, 1]], T([0]), 1), r"token_to_slot must be an integer tensor, got list"),
    (lambda: rails.window_start([5], [1], 2), r"seq_lens must be an integer tensor, got list"),
    (lambda: rails.translate_rails((T([0, 2]), T([3, 4])), torch.arange(10)), r"rails must be KVRails, got tuple"),
    (lambda: rails.KVRails([0, 2], [3, 4]), r"indptr must be .* got list"),
    (lambda: rails.KVPages([[1]], T([3]), 16), r"page_table must be .* got list"),
    (lambda: kv_views.paged_kv("mxfp8", [0], [0], page_size=1, k_scales=torch.zeros(1), v_scales=torch.zeros(1)),
     r"k_buffer must be .* got list"),
    (lambda: SpecVerify.from_trees([(torch.ones(1, 1, dtype=torch.bool), T([0]))]).check_queries([0, 1]),
     r"qo_indptr must be .* got list"),
    (lambda: TorchRoute().extend(torch.randn(6, 2, 32), kv16(), None, T([0, 4, 6]), AttentionParams(0.2)),
     r"the torch route reads per-token rails \(KVRails\), got NoneType"),
])
def test_core_entries_refuse_a_list_by_name(call, match):
    """Was: AttributeError (or torch's TypeError about list operands) from the first use."""
    with pytest.raises(TypeError, match=match):
        call()


# --- bypass: value objects built without their factory ----------------------------------------------------------
def e4m3(slots=8, d=32):
    return torch.full((slots, 1, d), 1.0).to(torch.float8_e4m3fn)


def test_a_scale_layout_is_checked_however_it_is_built():
    """Was: ScaleLayout(8, 1, 32, 128) (8 slots, zero interleaved pages) accepted, and a PagedKV over it an
    IndexError at its first read."""
    with pytest.raises(ValueError, match=r"num_slots must be a multiple of page_size=128 for the interleaved layout"):
        ScaleLayout(8, 1, 32, 128)
    with pytest.raises(ValueError, match=r"page_size must be an int >= 1, got 0"):
        ScaleLayout(8, 1, 32, 0)
    with pytest.raises(ValueError, match=r"head_dim must be a multiple of 32"):
        ScaleLayout(8, 1, 48, 1)
    assert ScaleLayout(256, 2, 64, 128) == ScaleLayout.for_pool(256, 2, 64, 128)  # valid: the same layout


def test_a_paged_kv_needs_a_scale_layout():
    with pytest.raises(TypeError, match=r"layout must be a ScaleLayout .* got \(8, 1, 32, 1\) \(tuple\)"):
        PagedKV(e4m3(), e4m3(), torch.zeros(8, 1, 1, dtype=torch.uint8), torch.zeros(8, 1, 1, dtype=torch.uint8),
                (8, 1, 32, 1))  # was: AttributeError


# --- extent: zero extents and K/V shapes that differ -----------------------------------------------------------
def test_a_relative_bias_of_extent_0_is_refused_where_built_and_where_read():
    """Was: RuntimeError ('index -1 is out of bounds for dimension 2 with size 0') inside the reference."""
    with pytest.raises(ValueError, match=r"rel_bias's rel_extent .* \(dim 2\) must be >= 1, got shape \(2, 2, 0\)"):
        AttentionParams(0.2, rel_bias=torch.zeros(2, 2, 0))
    params = AttentionParams(0.2, rel_bias=torch.zeros(2, 2, 4))
    params.rel_bias = torch.zeros(2, 2, 0)  # a dataclass field replaced after construction: the reader checks again
    with pytest.raises(ValueError, match=r"rel_bias's rel_extent .* must be >= 1"):
        decode(params=params)


@pytest.mark.parametrize("k, v, match", [
    (torch.zeros(16, 1, 32), torch.zeros(16, 1, 64),
     r"k_buffer and v_buffer must have the same shape \[slots, Hkv, D\], got \(16, 1, 32\) and \(16, 1, 64\)"),
    (torch.zeros(16, 0, 32), torch.zeros(16, 0, 32), r"k_buffer's Hkv \(KV heads\) \(dim 1\) must be >= 1"),
    (torch.zeros(16, 1, 0), torch.zeros(16, 1, 0), r"k_buffer's D \(head_dim\) \(dim 2\) must be >= 1"),
    (torch.zeros(0, 1, 32), torch.zeros(0, 1, 32), r"k_buffer's slots \(dim 0\) must be >= 1"),
])
def test_a_paged_kv_refuses_k_and_v_of_other_shapes_and_zero_extents(k, v, match):
    """Was: accepted; the reference then raised RuntimeError (head dims 32 and 64), ZeroDivisionError (no KV head)
    or computed over nothing."""
    with pytest.raises(ValueError, match=match):
        PagedKV(k, v)


def test_the_reference_refuses_a_query_without_heads():
    with pytest.raises(ValueError, match=r"q's Hq \(query heads\) \(dim 1\) must be >= 1"):
        decode(q=torch.zeros(2, 0, 32))  # was: an empty result, no error


# --- count: per-request arrays against their counts ----------------------------------------------------------------
def test_a_decode_context_needs_one_cache_per_request_in_every_layer():
    """Was: accepted; cache_for(layer, 1) then refused the request 'in [0, 1)' although the batch has 2."""
    assert BatchedDecodeContext([3, 4], [["a", "b"], ["c", "d"]]).cache_for(1, 1) == "d"
    with pytest.raises(ValueError, match=r"attention_layer_caches\[1\] must be 2 entries long, one per request"):
        BatchedDecodeContext([3, 4], [["a", "b"], ["c"]])
    with pytest.raises(TypeError, match=r"attention_layer_caches\[0\] must be a list of the layer's caches"):
        BatchedDecodeContext([3], [None])  # was: TypeError from len() naming nothing


# --- the SGLang host: its pool (skips without SGLang; test_bad_input_values' builder) and its host-free metadata -----------------
@pytest.mark.parametrize("fmt, entry", [("bf16", 0), ("mxfp8", 0), ("mxfp8", 2)])
def test_sglang_load_cpu_copy_refuses_a_meta_tensor_before_layer_0_is_written(fmt, entry):
    """Was: layer 0 restored, then NotImplementedError at layer 1's copy (a partial write)."""
    pool = _sglang_pool(fmt)
    src = torch.tensor([3, 130])
    k = torch.randn(2, 2, 32).bfloat16()
    pool.set_kv_buffer(None, src, k, k, layer_id_override=0)
    pool.set_kv_buffer(None, src, k, k, layer_id_override=1)
    saved = pool.get_cpu_copy(src)
    pool.load_cpu_copy(saved, src)  # valid
    saved[1][entry] = meta(saved[1][entry])
    before = [t.clone() for t in (*pool.k_buffer, *pool.v_buffer)]
    with pytest.raises(ValueError, match=r"kv_cache_cpu\[1\]'s (k|k_scales) must be .* holding data"):
        pool.load_cpu_copy(saved, src)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(before, (*pool.k_buffer, *pool.v_buffer)))


def test_sglang_pool_refuses_a_device_torch_cannot_reach():
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

    prepare_sglang_cpu_import()
    from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class

    with pytest.raises(ValueError, match=rf"device must be a device that can hold data here, got {UNREACHABLE}"):
        inkling_pool_class("bf16")(256, 1, torch.bfloat16, 2, 32, 2, UNREACHABLE, False)


def test_sglang_graph_buffers_refuse_unreachable_devices_and_lists():
    from sglang_inkling_backend.hosts.sglang.metadata import (DecodeGraphBuffers, VerifyGraphBuffers,
                                                              build_forward_metadata)

    for device in (UNREACHABLE, "meta"):
        with pytest.raises(ValueError, match=r"device must be a device that can hold data here"):
            DecodeGraphBuffers(4, 64, [], device, swa=False)  # was: AssertionError / buffers of no data
        with pytest.raises(ValueError, match=r"device must be a device that can hold data here"):
            VerifyGraphBuffers(4, 3, 64, [], device, swa=False)
    r2t = torch.arange(64).view(1, 64)
    with pytest.raises(TypeError, match=r"seq_lens must be an integer tensor, got list"):
        DecodeGraphBuffers(4, 64, [], "cpu", swa=False).refill(r2t, T([0]), [3])  # was: AttributeError
    with pytest.raises(ValueError, match=rf"seq_lens must be an integer tensor holding data, got a tensor {META}"):
        DecodeGraphBuffers(4, 64, [], "cpu", swa=False).refill(r2t, T([0]), meta(T([3])))
    with pytest.raises(TypeError, match=r"seq_lens must be an integer tensor, got list"):
        VerifyGraphBuffers(4, 3, 64, [], "cpu", swa=False).refill(r2t, T([0]), [3], T([3, 4, 5]), None, num_real=1)
    with pytest.raises(TypeError, match=r"extend_seq_lens must be None or an integer tensor, got list"):
        build_forward_metadata(r2t, T([0]), T([5]), extend_seq_lens=[2])
    with pytest.raises(TypeError, match=r"out_cache_loc must be None or an integer tensor, got list"):
        build_forward_metadata(r2t, T([0]), T([5]), full_to_swa=torch.arange(64), out_cache_loc=[4])
