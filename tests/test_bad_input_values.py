"""Values that are not what they claim, at the core's less-used entry points: each raises a ValueError/TypeError
naming what is wrong where it would otherwise be used as it came (a string or bool scale used as a number, a window
of 2.5 rounded up, -5 read as full attention, a config whose sliding layers have no window size served as full
attention, extra or unknown layer types, a query offset that does not start at 0 leaving rows uninitialised, a
"finite" scale past float32's range)."""

from types import SimpleNamespace

import pytest
import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.checks import require_real
from sglang_inkling_backend.hosts.sglang.layers import record_window
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec
from sglang_inkling_backend.reference.attention import paged_extend_attention


@pytest.mark.parametrize("value, window", [(None, None), (-1, None), (0, 1), (255, 256)])
def test_record_window_of_valid_sizes(value, window):
    assert record_window(value) == window


@pytest.mark.parametrize("value", [2.5, -5, True, "4"])
def test_record_window_refuses_what_is_not_a_size(value):
    with pytest.raises(ValueError, match="sliding_window_size must be None, -1 .* or an int >= 0"):
        record_window(value)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(softmax_scale="0.1"), TypeError, r"LayerSpec.softmax_scale must be a finite number > 0, got '0.1'"),
    (dict(softmax_scale=0.0), ValueError, r"LayerSpec.softmax_scale must be a finite number > 0"),
    (dict(k_scale=True), TypeError, r"LayerSpec.k_scale must be"),
    (dict(rel_extent=2.5), TypeError, r"LayerSpec.rel_extent must be an int"),
    (dict(logit_cap=float("inf")), ValueError, r"LayerSpec.logit_cap must be a finite number >= 0"),
])
def test_layer_spec_refuses_bad_scalars(kwargs, error, match):
    with pytest.raises(error, match=match):
        LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=64, **kwargs)


def test_layer_spec_stores_numbers_as_floats():
    spec = LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=64, softmax_scale=1, k_scale=2)
    assert isinstance(spec.softmax_scale, float) and isinstance(spec.k_scale, float)


def config(**kw):
    base = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=128)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, match", [
    (dict(layer_types=["sliding_attention"] * 3, sliding_window=None), r"sliding_attention layers but "
                                                                         r"config.sliding_window is None"),
    (dict(layer_types=["full_attention"] * 4), r"names 4 layers, the model has num_hidden_layers=3"),
    (dict(layer_types=["full_attention", "chunked_attention", "full_attention"]), r"holds \['chunked_attention'\]"),
    (dict(num_attention_heads=0), r"positive ints, got 3 and 0"),
])
def test_layer_plan_from_config_refuses_what_it_cannot_serve(kw, match):
    with pytest.raises(ValueError, match=match):
        LayerPlan.from_hf_config(config(**kw))


def test_layer_plan_from_a_valid_config():
    plan = LayerPlan.from_hf_config(config(layer_types=["sliding_attention", "sliding_attention", "full_attention"]))
    assert [plan.window(i) for i in range(3)] == [128, 128, None]


def test_reference_extend_refuses_query_offsets_not_from_zero():
    kv = PagedKV(torch.randn(8, 1, 32), torch.randn(8, 1, 32))
    q = torch.randn(3, 2, 32)
    kv_indptr, kv_indices = torch.tensor([0, 4, 8]), torch.arange(8)
    paged_extend_attention(q, kv, kv_indptr, kv_indices, torch.tensor([0, 1, 3]), AttentionParams(0.2))
    with pytest.raises(ValueError, match="qo_indptr must start at 0 and be non-decreasing"):
        paged_extend_attention(q, kv, kv_indptr, kv_indices, torch.tensor([1, 2, 3]), AttentionParams(0.2))


@pytest.mark.parametrize("value", [1e300, -3.5e38])
def test_a_scale_past_float32s_range_is_refused(value):
    with pytest.raises(ValueError, match=r"in float32"):
        require_real(value, "k_scale")
    assert require_real(3.0e38, "k_scale") == 3.0e38


@pytest.mark.parametrize("full_map, match", [
    ({0: 0, 2: 0}, r"gives two layers the same pool index"),
    ({0: 0, 2: 5}, r"layer 2's pool index 5 is out of range \[0, 2\)"),
    ({0: -1}, r"every pool index must be an int >= 0, got -1"),
    ({0: 0, 7: 1}, r"names layers \[7\] that have no attention cache"),
    ({True: 0}, r"every layer id must be an int >= 0, got True"),
])
def test_decode_context_refuses_a_bad_full_pool_map(full_map, match):
    from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext

    caches = [[None], [None], [None]]
    BatchedDecodeContext([4], caches, full_kv_pool_index_by_layer={0: 0, 2: 1})  # a valid map
    with pytest.raises(ValueError, match=match):
        BatchedDecodeContext([4], caches, full_kv_pool_index_by_layer=full_map)


# --- scales that vanish or overflow in float32, offsets and ranges (bench/results/current/bad-input-probe/) -------

def test_a_scale_that_is_zero_in_float32_is_refused():
    from sglang_inkling_backend import mxfp8

    with pytest.raises(ValueError, match="scale must be a finite number > 0, got 1e-50 \\(below float32's smallest"):
        mxfp8.quantize_per_tensor(torch.zeros(4), 1e-50)  # was: 0 / 0 -> NaN bytes


@pytest.mark.parametrize("scale,exc", [(float("nan"), ValueError), (float("inf"), ValueError), (0.0, ValueError),
                                       (-1.0, ValueError), (1e300, ValueError), (1e-50, ValueError),
                                       (True, TypeError), ("2.0", TypeError)])
def test_paged_kv_refuses_a_per_tensor_scale_it_cannot_use(scale, exc):
    data = torch.zeros(4, 1, 32).to(torch.float8_e4m3fn)
    with pytest.raises(exc, match="k_scale must be"):
        PagedKV(data, data, k_scale=scale)  # was: read as NaN, zeros or negated values, or a TypeError at read
    assert PagedKV(data, data, k_scale=0.5).k_scale == 0.5


def test_attend_refuses_an_integer_output():
    from sglang_inkling_backend.layer_step import attend

    q = torch.zeros(1, 2, 32)
    with pytest.raises(TypeError, match="out must be a floating-point tensor"):
        attend(None, None, q, None, SimpleNamespace(num_decode_rows=1), lambda a, b: AttentionParams(1.0), None,
               torch.zeros(1, 2, 32, dtype=torch.int32))  # was: the attention truncated into ints


def test_decode_context_names_an_unknown_layer_or_request():
    from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext

    ctx = BatchedDecodeContext([4, 7], [["c00", "c01"], ["c10", "c11"]])
    assert ctx.cache_for(1, 1) == "c11"
    with pytest.raises(ValueError, match=r"layer_id must be one of the model's attention layers \[0, 1\], got 9"):
        ctx.cache_for(9, 0)  # was: KeyError
    with pytest.raises(ValueError, match=r"request must be an int in \[0, 2\)"):
        ctx.cache_for(0, 2)  # was: IndexError


def test_a_pool_on_an_unknown_device_is_refused_by_name():
    from sglang_inkling_backend.kv_pool import InklingKVPool

    with pytest.raises(ValueError, match="device must be a torch device or its name"):
        InklingKVPool(LayerPlan.from_windows({0: None}, num_q_heads=2, num_kv_heads=1, head_dim=32), 16, 1,
                      device="bogus")  # was: torch's RuntimeError


def test_choose_route_takes_a_device_name():
    from sglang_inkling_backend.routes import choose_route

    assert choose_route("cpu").name == "torch"  # was: AttributeError


def test_rails_helpers_refuse_indices_outside_their_tables():
    """IndexErrors before: a map shorter than the slots the rails read, and rows past the token table."""
    from sglang_inkling_backend import rails
    r = rails.KVRails(torch.tensor([0, 2]), torch.tensor([3, 30]))
    with pytest.raises(ValueError, match=r"full_to_swa must map every full-pool slot .* 10 entries, .* \[3, 30\]"):
        rails.translate_rails(r, torch.arange(10))
    with pytest.raises(TypeError, match="full_to_swa must be a 1-D int32/int64 map"):
        rails.translate_rails(r, torch.arange(40.0))
    assert rails.translate_rails(r, torch.arange(40) * 2).indices.tolist() == [6, 60]
    table = torch.arange(4 * 8).view(4, 8)
    with pytest.raises(ValueError, match=r"rows must be rows of token_to_slot in \[0, 4\), got \[9, 9\]"):
        rails.page_table(table, torch.tensor([9]), 2)
    with pytest.raises(TypeError, match="rows must be a 1-D int32/int64 tensor"):
        rails.page_table(table, torch.tensor([1.5]), 2)
    assert rails.page_table(table, torch.tensor([1]), 2).tolist() == [[4, 5, 6, 7]]


def test_quantizer_saturates_rather_than_overflowing_float32():
    from sglang_inkling_backend import mxfp8
    data, scales = mxfp8.quantize(torch.tensor([[1e300] + [0.0] * 31], dtype=torch.float64))
    assert mxfp8.dequantize(data, scales, torch.float32)[0, 0].item() == mxfp8.LARGEST_ROUND_TRIP


# --- values the probe found accepted as they came (bench/results/current/bad-input-probe/) -----------------------

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(rope_theta="1e4"), TypeError, r"LayerSpec.rope_theta must be a finite number > 0, got '1e4'"),
    (dict(rope_theta=-1.0), ValueError, r"LayerSpec.rope_theta must be a finite number > 0, got -1.0"),
    (dict(log_scaling=5), TypeError, r"LayerSpec.log_scaling must be None or a LogScaling, got 5"),
    (dict(has_attention="no"), TypeError, r"LayerSpec.has_attention must be a bool, got 'no'"),
])
def test_layer_spec_refuses_a_bad_rope_theta_log_scaling_or_has_attention(kwargs, error, match):
    with pytest.raises(error, match=match):
        LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=64, **kwargs)  # was: stored as given


def test_layer_spec_keeps_valid_rope_theta_and_log_scaling():
    from sglang_inkling_backend.layer_plan import LogScaling

    spec = LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=64, rope_theta=10000, log_scaling=LogScaling(128))
    assert spec.rope_theta == 10000.0 and isinstance(spec.rope_theta, float)
    assert spec.log_scaling.n_floor == 128 and spec.log_scaling.alpha == 0.1
    assert not LayerSpec(has_attention=False).has_attention
    with pytest.raises(ValueError, match=r"LogScaling.n_floor must be an int >= 1, got 0"):
        LogScaling(0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: LayerPlan.from_windows({0: None}, num_layers=True), TypeError, r"num_layers must be an int, got True"),
    (lambda: LayerPlan.from_windows({0: None}, num_layers=2.5), TypeError, r"num_layers must be an int, got 2.5"),
    (lambda: LayerPlan.from_windows({"0": None}), TypeError, r"windows must map int layer ids to windows"),
    (lambda: LayerPlan.from_windows({0: None}, num_q_heads=4, num_kv_heads=2).with_tp(True), ValueError,
     r"tp_size must be a positive int, got True"),
    (lambda: LayerPlan.from_windows({0: None, 1: 4}).spec(True), ValueError,
     r"layer_id must be an int in \[0, 2\), got True"),
    (lambda: LayerPlan(None), TypeError, r"specs must be a sequence of LayerSpec, got NoneType"),
])
def test_layer_plan_refuses_bools_where_ints_go(call, error, match):
    with pytest.raises(error, match=match):
        call()  # was: True read as 1


INKLING = dict(model_type="inkling", local_layer_ids=[0, 2], rel_extent=64, swa_head_dim=64)


@pytest.mark.parametrize("kw, error, match", [
    (dict(num_key_value_heads=0), ValueError, r"config.num_key_value_heads must be an int >= 1, got 0"),
    (dict(num_key_value_heads=3), ValueError,
     r"config.num_attention_heads \(4\) must be a multiple of config.num_key_value_heads \(3\)"),
    (dict(num_key_value_heads="2"), TypeError, r"config.num_key_value_heads must be an int, got '2'"),
    (dict(head_dim=0, hidden_size=256), ValueError, r"config.head_dim must be an int >= 1, got 0"),
    (dict(head_dim=None), ValueError, r"config must give head_dim or hidden_size"),
    (dict(head_dim=None, hidden_size=250), ValueError,
     r"config.hidden_size \(250\) must be a multiple of config.num_attention_heads \(4\)"),
    (dict(sliding_window=0, use_sliding_window=True), ValueError, r"config.sliding_window must be an int >= 1, got 0"),
    (dict(sliding_window=None, use_sliding_window=True), ValueError,
     r"config.use_sliding_window is True but config.sliding_window is None"),
    (dict(use_sliding_window="false"), TypeError, r"config.use_sliding_window must be a bool, got 'false'"),
    (dict(sliding_window_pattern=0), ValueError, r"config.sliding_window_pattern must be an int >= 1, got 0"),
    (dict(layer_types=["sliding_attention"] * 3, sliding_window=2.5), TypeError,
     r"config.sliding_window must be an int, got 2.5"),
    (dict(attn_logit_softcapping="30"), TypeError, r"config.attn_logit_softcapping must be a finite number >= 0"),
    (dict(attn_logit_softcapping=-5.0), ValueError, r"config.attn_logit_softcapping must be a finite number >= 0"),
    (dict(query_pre_attn_scalar=0), ValueError, r"config.query_pre_attn_scalar must be a finite number > 0"),
    (dict(query_pre_attn_scalar="256"), TypeError, r"config.query_pre_attn_scalar must be a finite number > 0"),
    (dict(rope_theta="1e4"), TypeError, r"config.rope_theta must be a finite number > 0"),
    ({**INKLING, "local_layer_ids": [0, 5]}, ValueError, r"config.local_layer_ids must name layers in \[0, 3\).*\[5\]"),
    ({**INKLING, "local_layer_ids": [-1]}, ValueError, r"config.local_layer_ids must name layers in \[0, 3\).*\[-1\]"),
    ({**INKLING, "local_layer_ids": ["0"]}, TypeError, r"config.local_layer_ids' entries must be an int"),
    ({**INKLING, "sliding_window": None}, ValueError,
     r"config.local_layer_ids names local layers but config.sliding_window is None"),
    ({**INKLING, "log_scaling_n_floor": 0}, ValueError, r"config.log_scaling_n_floor must be an int >= 1, got 0"),
    ({**INKLING, "rel_extent": 0}, ValueError, r"config.rel_extent must be an int >= 1, got 0"),
    ({**INKLING, "swa_num_key_value_heads": 3}, ValueError,
     r"config.swa_num_attention_heads \(4\) must be a multiple of config.swa_num_key_value_heads \(3\)"),
])
def test_layer_plan_from_config_names_the_bad_config_field(kw, error, match):
    with pytest.raises(error, match=match):
        LayerPlan.from_hf_config(config(**kw))  # was: 0 read as absent, a string kept, or LayerSpec's field named


def test_layer_plan_from_config_still_reads_valid_configs():
    def summary(plan):
        return [(s.window, s.num_kv_heads, s.head_dim, s.softmax_scale, s.logit_cap) for s in plan.specs]

    # head_dim derived from hidden_size; an unused sliding_window (even 0) is not read
    plan = LayerPlan.from_hf_config(config(head_dim=None, hidden_size=256, sliding_window=0))
    assert summary(plan) == [(None, 2, 64, None, 0.0)] * 3
    plan = LayerPlan.from_hf_config(config(num_key_value_heads=None, use_sliding_window=False,
                                           attn_logit_softcapping=None, query_pre_attn_scalar=None))
    assert summary(plan) == [(None, 4, 64, None, 0.0)] * 3
    plan = LayerPlan.from_hf_config(config(use_sliding_window=True, query_pre_attn_scalar=256,
                                           attn_logit_softcapping=50.0, rope_theta=1e4))
    assert summary(plan) == [(128, 2, 64, 1 / 16, 50.0)] * 3 and plan.spec(0).rope_theta == 1e4
    plan = LayerPlan.from_hf_config(config(sliding_window_pattern=3))
    assert [plan.window(i) for i in range(3)] == [128, 128, None]
    plan = LayerPlan.from_hf_config(config(**INKLING, log_scaling_n_floor=None))
    assert [plan.window(i) for i in range(3)] == [128, None, 128] and plan.spec(1).log_scaling is None
    plan = LayerPlan.from_hf_config(config(**{**INKLING, "local_layer_ids": []}, log_scaling_n_floor=64))
    assert plan.windowed_layer_ids == () and plan.spec(0).log_scaling.n_floor == 64


def test_decode_context_refuses_a_bool_window_no_caches_and_no_mask_factory():
    from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext

    ctx = BatchedDecodeContext([1, 5], [[None, None]])
    with pytest.raises(ValueError, match=r"window must be None or a positive int, got True"):
        ctx.decode_padding(True)  # was: window 1
    with pytest.raises(TypeError, match=r"attention_layer_caches must be a list .* got NoneType"):
        BatchedDecodeContext([4], None)
    with pytest.raises(TypeError, match=r"mask_factory must be callable"):
        BatchedDecodeContext([1, 5], [[None, None]], mask_factory=None)  # was: a TypeError at decode_padding
    assert ctx.decode_padding(2)[0] == [0, 0]


@pytest.mark.parametrize("kv_format, page_size, size", [("bf16", 1, 64), ("mxfp8", 128, 256)])
def test_pool_write_refuses_a_bool_layer_before_writing(kv_format, page_size, size):
    from sglang_inkling_backend.kv_pool import InklingKVPool

    plan = LayerPlan.from_windows({0: None, 1: 4}, num_q_heads=2, num_kv_heads=1, head_dim=32)
    pool = InklingKVPool(plan, size, page_size, kv_format=kv_format)
    before = [t.clone() for layer in pool.layers.values() for t in layer.tensors()]
    k = torch.randn(2, 1, 32).bfloat16()
    with pytest.raises(TypeError, match=r"layer must be an int layer id or have an int .layer_id, got bool"):
        pool.set_kv_buffer(True, torch.tensor([5, 6]), k, k)  # was: written to layer 1
    after = [t for layer in pool.layers.values() for t in layer.tensors()]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, after))


def test_pool_sizes_refuse_bools():
    from sglang_inkling_backend.kv_pool import HostKVTier, InklingKVPool, tokens_that_fit

    plan = LayerPlan.from_windows({0: None}, num_q_heads=2, num_kv_heads=1, head_dim=32)
    with pytest.raises(ValueError, match=r"byte_budget must be a non-negative int, got True"):
        tokens_that_fit(True, plan, "bf16")
    assert tokens_that_fit(1024, plan, "bf16") == 1024 // (2 * 32 * 2)
    with pytest.raises(ValueError, match=r"num_pages must be a positive int, got True"):
        HostKVTier(InklingKVPool(plan, 16, 1), True)


@pytest.mark.parametrize("args, error, match", [
    (dict(seq_lens=torch.tensor([3.5])), TypeError, r"seq_lens must be an integer tensor, got torch.float32"),
    (dict(rows=torch.tensor([1.7])), TypeError, r"req_pool_indices must be an integer tensor, got torch.float32"),
    (dict(start=torch.tensor([-2])), ValueError, r"start must be >= 0 \(a rail's first position\), got -2"),
    (dict(start=torch.tensor([1.0])), TypeError, r"start must be an integer tensor, got torch.float32"),
])
def test_gather_rails_refuses_float_lengths_and_a_negative_start(args, error, match):
    from sglang_inkling_backend import rails

    table = torch.arange(40).view(4, 10)
    call = dict(rows=torch.tensor([1]), seq_lens=torch.tensor([3]), start=None)
    assert rails.gather_rails(table, call["rows"], call["seq_lens"]).indices.tolist() == [10, 11, 12]
    call.update(args)
    with pytest.raises(error, match=match):
        rails.gather_rails(table, call["rows"], call["seq_lens"], call["start"])  # was: truncated, or wrapped


@pytest.mark.parametrize("window", [True, 2.5])
def test_window_start_refuses_a_window_that_is_not_an_int(window):
    from sglang_inkling_backend import rails

    with pytest.raises(TypeError, match="window must be an int"):
        rails.window_start(torch.tensor([5]), torch.tensor([1]), window)
    assert rails.window_start(torch.tensor([5]), torch.tensor([1]), 2).tolist() == [3]


def test_paged_kv_view_refuses_an_unknown_format():
    from sglang_inkling_backend import kv_views

    fp8 = torch.zeros(8, 1, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"kv_format must be one of .*, got 'mxfp4'"):
        kv_views.paged_kv("mxfp4", fp8, fp8, page_size=1)  # was: served as fp8_e4m3
    assert kv_views.paged_kv("fp8_e4m3", fp8, fp8, page_size=1).kv_format == "fp8_e4m3"


@pytest.mark.parametrize("name, value, match", [
    ("sinks", torch.zeros(1, 2), r"sinks must be 1-D \[Hq\] .* got shape \(1, 2\)"),
    ("rel_bias", torch.zeros(2, 8), r"rel_bias must be 3-D \[query rows, Hq, rel_extent\], got shape \(2, 8\)"),
])
def test_attention_params_refuse_sinks_or_bias_of_the_wrong_rank(name, value, match):
    with pytest.raises(ValueError, match=match):
        AttentionParams(0.2, **{name: value})  # was: refused only by the first kernel call


def _sglang_pool(fmt):
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

    prepare_sglang_cpu_import()
    from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class

    page, dtype = (128, torch.float8_e4m3fn) if fmt == "mxfp8" else (1, torch.bfloat16)
    return inkling_pool_class(fmt)(256, page, dtype, 2, 32, 2, "cpu", False)


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])
def test_sglang_pool_refuses_a_bool_layer_id_override(fmt):
    pool = _sglang_pool(fmt)
    before = [t.clone() for t in (*pool.k_buffer, *pool.v_buffer)]
    k = torch.randn(2, 2, 32).bfloat16()
    with pytest.raises(TypeError, match=r"layer_id_override must be an int, got True"):
        pool.set_kv_buffer(None, torch.tensor([5, 6]), k, k, layer_id_override=True)  # was: written to layer 1
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(before, (*pool.k_buffer, *pool.v_buffer)))
    pool.set_kv_buffer(None, torch.tensor([5, 6]), k, k, layer_id_override=1)


def test_sglang_bf16_pool_refuses_scale_bytes_in_a_cpu_copy():
    pool = _sglang_pool("bf16")
    src = torch.tensor([3, 4])
    saved = pool.get_cpu_copy(src)
    pool.load_cpu_copy(saved, src)  # valid: scales None
    saved[0][2] = torch.zeros(2, 2, 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"kv_cache_cpu\[0\]'s k_scales and v_scales must be None for a bf16 pool"):
        pool.load_cpu_copy(saved, src)  # was: ignored


def test_q_descale_with_an_unquantized_query_is_refused():
    from sglang_inkling_backend import kv_views
    q = torch.zeros(2, 4 * 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"q_descale \(MXFP8 block scales\) goes with a float8_e4m3fn q, got it with "
                                         r"a torch.bfloat16 q"):
        kv_views.dequantize_query(q, 4, 32, torch.zeros(2, 4, 1, dtype=torch.uint8))
    assert kv_views.dequantize_query(q, 4, 32, None).shape == (2, 4, 32)
