"""A store never reads what it writes: K, V or block scales that are views of the pool's own buffers are refused
with a ValueError naming the argument before any byte is written, for every pool format and entry (the core
pool's ``set_kv_buffer`` and ``set_mxfp8_kv_buffer``, ``kv_views.store_kv_unchecked`` as the adapters' eager and
graph stores call it). Before, a 16/32-bit pool wrote K and then torch refused V's overlap (a RuntimeError), and the
pre-quantized MXFP8 entries copied from the rows and scale bytes they were overwriting, with no error."""
from __future__ import annotations

import pytest
import torch

from sglang_inkling_backend import kv_views
from sglang_inkling_backend.kv_pool import InklingKVPool
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec

T = torch.tensor
SLOTS = {"bf16": (T([10, 11]), T([11, 12])), "fp16": (T([10, 11]), T([11, 12])), "fp32": (T([10, 11]), T([11, 12])),
         "mxfp8": (T([130, 131]), T([131, 132]))}


def pool(fmt):
    p = InklingKVPool(LayerPlan([LayerSpec(num_q_heads=4, num_kv_heads=2, head_dim=32)]), size=256,
                      page_size=128 if fmt == "mxfp8" else 1, kv_format=fmt)
    k = torch.randn(2, 2, 32, generator=torch.Generator().manual_seed(3)).bfloat16()
    p.set_kv_buffer(0, SLOTS[fmt][0], k, k * 2)
    k = k.float() if fmt == "fp32" else k
    return p, k


def untouched(p, fn, match):
    before = [t.clone() for t in p.layers[0].tensors()]
    with pytest.raises(ValueError, match=match):
        fn()
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, p.layers[0].tensors()))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("side", ["k", "v"])
def test_k_or_v_viewing_the_pool_is_refused_before_any_write(fmt, side):
    """(An 8-bit pool's rows are e4m3, which set_kv_buffer refuses by dtype; their pre-quantized entry is below.)"""
    p, k = pool(fmt)
    buf = p.layers[0]
    view = (buf.k if side == "k" else buf.v)[10:12]  # the stored rows themselves
    k = k.to(buf.k.dtype)
    args = (view, k.clone()) if side == "k" else (k.clone(), view)
    untouched(p, lambda: p.set_kv_buffer(0, SLOTS[fmt][1], *args),
              f"cache_{side} is a view of the KV pool's own buffers")  # set_kv_buffer's own argument names


@pytest.mark.parametrize("side", ["k_data", "v_data"])
def test_premade_mxfp8_rows_viewing_the_pool_are_refused_before_any_write(side):
    p, k = pool("mxfp8")
    buf = p.layers[0]
    own = (buf.k if side == "k_data" else buf.v)[130:132]
    other = torch.zeros(2, 2, 32, dtype=torch.float8_e4m3fn)
    scales = torch.full((2, 2, 1), 127, dtype=torch.uint8)
    data = (own, other) if side == "k_data" else (other, own)
    untouched(p, lambda: p.set_mxfp8_kv_buffer(0, T([131, 132]), data[0], scales, data[1], scales.clone()),
              f"{side} is a view of the KV pool's own buffers")


def test_premade_mxfp8_scales_viewing_the_pool_are_refused_before_any_write():
    p, k = pool("mxfp8")
    buf = p.layers[0]
    data = torch.zeros(2, 2, 32, dtype=torch.float8_e4m3fn)
    own_scales = buf.sfk.view(-1)[:2 * 2 * 1].view(2, 2, 1)  # bytes of the pool's K scale buffer
    untouched(p, lambda: p.set_mxfp8_kv_buffer(0, T([131, 132]), data, own_scales, data.clone(),
                                               torch.zeros(2, 2, 1, dtype=torch.uint8)),
              "k_scales is a view of the KV pool's own buffers")


def test_copies_of_the_pool_rows_are_stored():
    """The refusal is about storage, not values: a clone of the same rows is an ordinary write."""
    p, k = pool("bf16")
    rows = p.layers[0].k[10:12].clone()
    p.set_kv_buffer(0, T([20, 21]), rows, rows)
    assert torch.equal(p.layers[0].k[20:22], rows)


def test_the_graph_store_refuses_views_too():
    p, k = pool("mxfp8")
    from sglang_inkling_backend.attention_inputs import PagedKV

    buf = p.layers[0]
    kv = PagedKV(buf.k, buf.v, buf.sfk, buf.sfv, buf.layout)
    before = [t.clone() for t in buf.tensors()]
    with pytest.raises(ValueError, match="v_block_scales is a view of the KV pool's own buffers"):
        kv_views.store_kv_unchecked(kv, T([140]), torch.zeros(1, 2, 32, dtype=torch.float8_e4m3fn),
                                    torch.zeros(1, 2, 32, dtype=torch.float8_e4m3fn),
                                    k_block_scales=torch.zeros(1, 2, 1, dtype=torch.uint8),
                                    v_block_scales=buf.sfv.view(-1)[:2])
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, buf.tensors()))
