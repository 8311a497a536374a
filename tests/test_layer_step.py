"""The core's per-layer step (``layer_step``), which both hosts' adapters call: a mixed batch's decode rows go to the
route's decode and its extend rows to its extend, each with its own keys and parameters, in the batch's row order;
the query is cast only for a route that multiplies in the model's dtype; bad arguments are refused before any
write. The torch route and the reference run here; the hosts' own tests run the same step through their adapters."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from sglang_inkling_backend import layer_step
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
from sglang_inkling_backend.rails import KVRails
from sglang_inkling_backend.reference.attention import paged_decode_attention, paged_extend_attention
from sglang_inkling_backend.routes import TorchRoute
from sglang_inkling_backend.step_plans import DecodePlanCache

HQ, HKV, D = 4, 2, 32
SPEC = LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D ** -0.5)


@dataclass
class Keys:
    """Two decodes (5 and 3 keys) then one extend (4 new tokens after a 6-token prefix), slots disjoint."""
    num_decode_rows: int = 2
    max_seq_len: int = 10
    plans: DecodePlanCache = field(default_factory=DecodePlanCache)

    def decode_keys(self, window, reads_page_tables):
        assert not reads_page_tables  # the torch route reads rails
        return KVRails(torch.tensor([0, 5, 8]), torch.arange(0, 8))

    def extend_keys(self, window):
        return KVRails(torch.tensor([0, 10]), torch.arange(8, 18)), torch.tensor([0, 4])


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = PagedKV(torch.randn(18, HKV, D, generator=g), torch.randn(18, HKV, D, generator=g))
    return kv, torch.randn(6, HQ, D, generator=g)


def params_of(first, last):
    return attention_params(SPEC, rows=last - first)


def test_mixed_batch_rows_take_their_own_keys():
    kv, q = inputs()
    keys = Keys()
    out = layer_step.attend(TorchRoute(), SPEC, q, kv, keys, params_of, None)
    params = AttentionParams(softmax_scale=D ** -0.5)
    rails = keys.decode_keys(None, False)
    decoded = paged_decode_attention(q[:2], kv, rails.indptr, rails.indices, params)
    rails, qo = keys.extend_keys(None)
    extended = paged_extend_attention(q[2:], kv, rails.indptr, rails.indices, qo, params)
    torch.testing.assert_close(out, torch.cat([decoded, extended]), rtol=0, atol=0)
    # The keys follow the row: request 1's query in row 0 reads request 0's keys, and the result moves by far more
    # than rounding (so the equality above could not hold with rows sent to the wrong keys).
    swapped = layer_step.attend(TorchRoute(), SPEC, q[[1, 0, 2, 3, 4, 5]], kv, keys, params_of, None)
    assert (swapped[0] - out[1]).abs().max() > 0.1


def test_out_receives_the_rows_in_its_dtype():
    kv, q = inputs(1)
    out = torch.full((6, HQ, D), float("nan"), dtype=torch.bfloat16)
    got = layer_step.attend(TorchRoute(), SPEC, q, kv, Keys(), params_of, None, out)
    assert got is out and not out.isnan().any()
    torch.testing.assert_close(out.float(), layer_step.attend(TorchRoute(), SPEC, q, kv, Keys(), params_of, None),
                               rtol=2 ** -8, atol=1e-2)


def test_one_kind_of_row_returns_the_routes_result():
    kv, q = inputs(2)
    decode_only = layer_step.attend(TorchRoute(), SPEC, q[:2], kv, Keys(num_decode_rows=2), params_of, None)
    assert decode_only.shape == (2, HQ, D) and decode_only.dtype == torch.float32


class ModelDtypeRoute(TorchRoute):
    query_in_model_dtype = True


def test_query_cast_only_where_the_route_multiplies_in_the_model_dtype():
    q = torch.randn(3, HQ * D)
    assert layer_step.prepare_query(q, SPEC, TorchRoute(), torch.bfloat16).dtype == torch.float32
    prepared = layer_step.prepare_query(q, SPEC, ModelDtypeRoute(), torch.bfloat16)
    assert prepared.dtype == torch.bfloat16 and prepared.shape == (3, HQ, D)
    with pytest.raises(ValueError, match="without q_descale"):
        layer_step.prepare_query(q.to(torch.float8_e4m3fn), SPEC, TorchRoute(), torch.bfloat16)


def test_bad_split_or_out_is_refused_before_any_write():
    kv, q = inputs(3)
    out = torch.zeros(6, HQ, D)
    with pytest.raises(ValueError, match=r"num_decode_rows must lie in \[0, 6\]"):
        layer_step.attend(TorchRoute(), SPEC, q, kv, Keys(num_decode_rows=7), params_of, None, out)
    with pytest.raises(ValueError, match="out must have the query's shape"):
        layer_step.attend(TorchRoute(), SPEC, q, kv, Keys(), params_of, None, torch.zeros(5, HQ, D))
    assert not out.any()


def _mxfp8_pool(k, v):
    """One MXFP8 layer of 128 slots (one page) holding ``k``/``v`` at slots 0.."""
    from sglang_inkling_backend.kv_pool import InklingKVPool
    from sglang_inkling_backend.layer_plan import LayerPlan
    plan = LayerPlan.from_windows({0: None}, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    pool = InklingKVPool(plan, 128, 128, kv_format="mxfp8")
    pool.set_kv_buffer(0, torch.arange(k.shape[0]), k, v)
    return pool.paged_kv(0)


def test_extend_rows_read_their_own_keys_from_the_forward_and_the_prefix_from_the_pool():
    """forward_kv: the extend's 4 new keys (slots 14-17) in the forward's bf16, its 6-key prefix as the MXFP8 pool
    holds it; decode rows read the pool. Without forward_kv the new keys are read back rounded, and the extend rows
    move by far more than float32 rounding."""
    g = torch.Generator().manual_seed(4)
    k_fwd, v_fwd = (torch.randn(18, HKV, D, generator=g) * 3).bfloat16(), (torch.randn(18, HKV, D, generator=g)
                                                                             * 3).bfloat16()
    kv = _mxfp8_pool(k_fwd, v_fwd)
    q = torch.randn(6, HQ, D, generator=g)
    rows_kv = (torch.cat([k_fwd[[4, 7]], k_fwd[14:18]]), torch.cat([v_fwd[[4, 7]], v_fwd[14:18]]))
    keys = Keys()
    out = layer_step.attend(TorchRoute(), SPEC, q, kv, keys, params_of, None, forward_kv=rows_kv)
    k_all, v_all = kv.read(torch.arange(18))
    k_all[14:18], v_all[14:18] = k_fwd[14:18].float(), v_fwd[14:18].float()
    params = AttentionParams(softmax_scale=D ** -0.5)
    rails, qo = keys.extend_keys(None)
    want = paged_extend_attention(q[2:], PagedKV(k_all, v_all), rails.indptr, rails.indices, qo, params)
    torch.testing.assert_close(out[2:], want, rtol=0, atol=1e-6)
    from_pool = layer_step.attend(TorchRoute(), SPEC, q, kv, Keys(), params_of, None)
    torch.testing.assert_close(out[:2], from_pool[:2], rtol=0, atol=0)  # decodes read the pool either way
    assert (from_pool[2:] - out[2:]).abs().max() > 1e-3


def test_an_extend_without_a_prefix_attends_the_forward_keys_alone():
    """Every key new (rails == qo_indptr): nothing is gathered, the result is attention over the forward's K/V."""
    g = torch.Generator().manual_seed(5)
    k_fwd, v_fwd = torch.randn(4, HKV, D, generator=g).bfloat16(), torch.randn(4, HKV, D, generator=g).bfloat16()
    kv = _mxfp8_pool(torch.cat([k_fwd, k_fwd]), torch.cat([v_fwd, v_fwd]))

    @dataclass
    class NoPrefix(Keys):
        num_decode_rows: int = 0

        def extend_keys(self, window):
            return KVRails(torch.tensor([0, 4]), torch.arange(4, 8)), torch.tensor([0, 4])

    q = torch.randn(4, HQ, D, generator=g)
    out = layer_step.attend(TorchRoute(), SPEC, q, kv, NoPrefix(), params_of, None, forward_kv=(k_fwd, v_fwd))
    want = paged_extend_attention(q, PagedKV(k_fwd.float(), v_fwd.float()), torch.tensor([0, 4]), torch.arange(4),
                                  torch.tensor([0, 4]), AttentionParams(softmax_scale=D ** -0.5))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"forward_kv\[0\] \(k\) must be a bf16/fp16/fp32 tensor of shape "):
        layer_step.attend(TorchRoute(), SPEC, q, kv, NoPrefix(), params_of, None, forward_kv=(k_fwd[:3], v_fwd))
