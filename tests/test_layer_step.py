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
