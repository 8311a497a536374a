"""Bad input found by probing the core's less-used entry points as a demanding user would (the reliability issue's
second round): each raises a ValueError/TypeError naming what is wrong, where it was silently accepted before
(a string or bool scale used as a number, a window of 2.5 rounded up, -5 read as full attention, a config whose
sliding layers have no window size served as full attention, extra or unknown layer types, a query offset that
does not start at 0 leaving rows uninitialised, a "finite" scale past float32's range)."""

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
    from sglang_inkling_backend.decode_context import BatchedDecodeContext

    caches = [[None], [None], [None]]
    BatchedDecodeContext([4], caches, full_kv_pool_index_by_layer={0: 0, 2: 1})  # a valid map
    with pytest.raises(ValueError, match=match):
        BatchedDecodeContext([4], caches, full_kv_pool_index_by_layer=full_map)


# --- round two, after the re-probe (bench/results/current/bad-input-probe/) ------------------------------------

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
    from sglang_inkling_backend.decode_context import BatchedDecodeContext

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
