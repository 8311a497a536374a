"""The layer plan and the decode context: the worked example (windows {0: 4, 1: 4, 3: None, 4: 4, 5: None}, layer 2
without attention) and the errors."""

from types import SimpleNamespace

import pytest
import torch

from sglang_inkling_backend import LayerPlan, LayerSpec
from sglang_inkling_backend.attention_inputs import AttentionParams
from sglang_inkling_backend.mlx.decode_context import MISSING_FULL_MAP_ERROR, BatchedDecodeContext, make_decode_context

WINDOWS = {0: 4, 1: 4, 3: None, 4: 4, 5: None}  # layer 2 has no attention


def test_pool_maps_of_the_worked_example():
    plan = LayerPlan.from_windows(WINDOWS)
    assert plan.attention_pool_index_by_layer == {0: 0, 1: 1, 3: 2, 4: 3, 5: 4}
    assert plan.full_kv_pool_index_by_layer == {3: 0, 5: 1}
    assert plan.swa_kv_pool_index_by_layer == {0: 0, 1: 1, 4: 2}
    assert plan.full_layer_ids == (3, 5) and plan.windowed_layer_ids == (0, 1, 4)
    assert plan.rope_layer() == 3  # a full layer, not the first (sliding) one
    with pytest.raises(ValueError, match="layer 2 has no attention"):
        plan.window(2)


def test_gemma3_config_gives_five_local_to_one_global():
    cfg = SimpleNamespace(num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                          hidden_size=640, sliding_window=512, query_pre_attn_scalar=256, rope_theta=1e6,
                          rope_local_base_freq=1e4,
                          layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                       for i in range(18)])
    plan = LayerPlan.from_hf_config(cfg)
    assert plan.full_layer_ids == (5, 11, 17)
    assert plan.full_kv_pool_index_by_layer == {5: 0, 11: 1, 17: 2}
    assert plan.spec(0).window == 512 and plan.spec(0).rope_theta == 1e4 and plan.spec(5).rope_theta == 1e6
    assert plan.spec(0).scale == pytest.approx(1 / 16)


def test_inkling_config_scale_is_one_over_d_and_local_geometry():
    cfg = SimpleNamespace(model_type="inkling", num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8,
                          head_dim=128, hidden_size=1536, sliding_window=512, local_layer_ids=[0, 2],
                          swa_num_attention_heads=32, swa_num_key_value_heads=4, swa_head_dim=128,
                          rel_extent=1024, log_scaling_n_floor=128000, log_scaling_alpha=0.1)
    plan = LayerPlan.from_hf_config(cfg)
    assert plan.windowed_layer_ids == (0, 2) and plan.full_layer_ids == (1, 3)
    assert plan.spec(0).num_q_heads == 32 and plan.spec(0).rel_extent == 512
    assert plan.spec(1).scale == 1 / 128 and plan.spec(1).rel_extent == 1024
    assert plan.spec(1).log_scaling.n_floor == 128000 and plan.spec(0).log_scaling is None
    per_rank = plan.with_tp(4)
    assert (per_rank.spec(1).num_q_heads, per_rank.spec(1).num_kv_heads) == (16, 2)


def test_tp_replicates_kv_heads_and_rejects_bad_splits():
    plan = LayerPlan.from_windows({0: 512, 1: None}, num_q_heads=4, num_kv_heads=1, head_dim=256)
    assert plan.with_tp(2).spec(1).num_kv_heads == 1 and plan.with_tp(2).spec(1).num_q_heads == 2
    with pytest.raises(ValueError, match="num_q_heads=4 is not divisible by tp_size=3"):
        plan.with_tp(3)


def test_layer_spec_errors():
    with pytest.raises(ValueError, match=r"num_q_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        LayerSpec(num_q_heads=6, num_kv_heads=4, head_dim=64)
    with pytest.raises(ValueError, match="window must be None"):
        LayerSpec(window=0, num_q_heads=1, num_kv_heads=1, head_dim=64)
    with pytest.raises(ValueError, match="needs at least one attention layer"):
        LayerPlan([LayerSpec(has_attention=False)])


def _caches(plan):
    return [[f"cache{i}"] * 3 for i in range(len(plan.attention_layer_ids))]


def test_decode_padding_examples():
    plan = LayerPlan.from_windows(WINDOWS)
    ctx = make_decode_context(plan, [5, 2, 9], _caches(plan))
    pads, mask = ctx.decode_padding(None)
    assert pads == [4, 7, 0] and mask.shape == (3, 1, 1, 10)
    assert mask[:, 0, 0].sum(dim=1).tolist() == [6, 3, 10]
    pads, mask = ctx.decode_padding(4)
    assert pads == [0, 1, 0]
    assert mask[:, 0, 0].int().tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert ctx.decode_padding(4) is ctx.decode_padding(4)  # memoised per window
    ctx2 = make_decode_context(plan, [7, 9], [[None] * 2] * 5)
    assert ctx2.decode_padding(4) == ([0, 0], None)
    assert ctx.offsets == [5, 2, 9] and ctx.max_len == 10 and ctx.needs_padding


def test_factory_fills_both_maps_and_picks_caches():
    plan = LayerPlan.from_windows(WINDOWS)
    ctx = make_decode_context(plan, [1, 2, 3], _caches(plan), fused_rope_scatter=object())
    assert ctx.full_kv_pool_index_by_layer == {3: 0, 5: 1}
    assert ctx.cache_for(5, 0) == "cache4"


def test_missing_full_map_with_fused_kernel_raises():
    with pytest.raises(ValueError) as err:
        BatchedDecodeContext([1, 2], [[None, None]], fused_rope_scatter=object())
    assert str(err.value) == MISSING_FULL_MAP_ERROR == (
        "BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + pool-scatter kernel "
        "is active")
    ctx = BatchedDecodeContext([1, 2], [[None, None], [None, None]])  # fused kernel off: identity default
    assert ctx.attention_pool_index_by_layer == {0: 0, 1: 1}


def test_factory_checks_cache_count():
    plan = LayerPlan.from_windows(WINDOWS)
    with pytest.raises(ValueError, match=r"one entry per attention layer \(5\), got 2"):
        make_decode_context(plan, [1], [[None], [None]])


def test_custom_mask_factory():
    plan = LayerPlan.from_windows({0: None})
    ctx = make_decode_context(plan, [0, 3], [[None, None]], mask_factory=lambda rows: rows)
    assert ctx.decode_padding(None) == ([3, 0], [[True, False, False, False], [True, True, True, True]])
    assert torch.is_tensor(make_decode_context(plan, [0, 3], [[None, None]]).decode_padding(None)[1])


@pytest.mark.parametrize("make", [
    lambda scale: LayerSpec(num_q_heads=2, num_kv_heads=1, head_dim=32, softmax_scale=scale),
    lambda scale: AttentionParams(scale),
])
def test_a_softmax_scale_that_overflows_as_the_kernels_apply_it_is_refused(make):
    """The kernels take base-2 logits (scale x log2(e)): 3e38 overflowed float32 and gave all-NaN outputs."""
    with pytest.raises(ValueError, match=r"softmax_scale 3e\+38 overflows float32 .* at most 2.359e\+38"):
        make(3e38)
    assert make(2.3e38).softmax_scale == 2.3e38  # the largest that stays finite is taken as it is
