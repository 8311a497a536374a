"""Property-based tests (hypothesis) of the public write and read paths: the core pool (``InklingKVPool``: every KV
format, hybrid full + windowed layers), ``mxfp8`` and ``ScaleLayout``, and the Triton store and decode kernels
under the interpreter (tiny shapes, few examples).

Each example draws a call and whether it is valid; an invalid one carries exactly one defect (negative, out-of-range,
duplicate or float slots, a list, a wrong shape, dtype or device, a bad scale) and must raise a ValueError or
TypeError leaving every buffer byte-identical. A valid one (NaN and inf data included) must agree with the reference:
the bytes the core's formulas give, at the written slots only. Examples are derandomized (the same in every run, so
CI is reproducible) and the database is off."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's jit is imported anywhere

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_inkling_backend import InklingKVPool, LayerPlan, mxfp8  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention as reference_decode  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

CORE = settings(derandomize=True, database=None, deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KERNELS = settings(CORE, max_examples=25)
CLEAN_ERRORS = (ValueError, TypeError)
SLOT_DEFECTS = ("negative", "out_of_range", "duplicate", "float", "list", "two_d")


def snapshot(pool):
    return [t.clone().view(torch.uint8) for layer in pool.layers.values() for t in layer.tensors()]


def same_bytes(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@st.composite
def pools(draw):
    kv_format = draw(st.sampled_from(["bf16", "fp16", "fp32", "fp8_e4m3", "mxfp8"]))
    page = draw(st.sampled_from([128, 32] if kv_format == "mxfp8" else [1, 16, 128]))
    hkv, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([32, 64]))
    plan = LayerPlan.from_windows({0: None, 1: 8}, num_q_heads=2 * hkv, num_kv_heads=hkv, head_dim=d)
    size = draw(st.sampled_from([1, 2])) * max(page, 64)
    swa = draw(st.sampled_from([None, max(page, 32)]))
    k_scale = draw(st.sampled_from([1.0, 0.5, 2.0]))
    return InklingKVPool(plan, size, page, kv_format, swa_size=swa, k_scale=k_scale, v_scale=1.0 / k_scale)


def bound(pool):
    """Slots every layer has (a write or move to any layer must fit the smallest sub-pool to be valid here)."""
    return min(buf.num_slots for buf in pool.layers.values())


@st.composite
def slot_sets(draw, num_slots, limit=12):
    """``(loc, defect, n)``: ``n`` distinct in-range slots (``defect`` None), or the same with one defect."""
    n = draw(st.integers(1, min(limit, num_slots - 1)))
    slots = draw(st.lists(st.integers(1, num_slots - 1), min_size=n, max_size=n, unique=True))
    defect = draw(st.sampled_from((None,) * 4 + SLOT_DEFECTS))
    if defect == "negative":
        slots[draw(st.integers(0, n - 1))] = -draw(st.integers(1, 3))
    elif defect == "out_of_range":
        slots[draw(st.integers(0, n - 1))] = num_slots + draw(st.integers(0, 5))
    elif defect == "duplicate":
        slots.append(slots[draw(st.integers(0, n - 1))])
        n += 1
    elif defect == "float":
        return torch.tensor(slots, dtype=torch.float32), defect, n
    elif defect == "list":
        return slots, defect, n
    elif defect == "two_d":
        return torch.tensor(slots).view(1, -1), defect, n
    return torch.tensor(slots), defect, n


def values(draw, n, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hkv, d, generator=g) * draw(st.sampled_from([1e-3, 1.0, 300.0]))
    if draw(st.booleans()):  # non-finite data is valid: it quantizes to NaN blocks
        x.view(-1)[draw(st.integers(0, x.numel() - 1))] = draw(st.sampled_from([float("nan"), float("inf")]))
    return x.to(draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])))


def expected_read(pool, x, write_scale, read_scale):
    """What read_kv must give for values ``x`` written to ``pool``, from the format's formulas (fp8: stored as
    ``x / write_scale``, read back times the pool's scale)."""
    if pool.kv_format == "mxfp8":
        return mxfp8.dequantize(*mxfp8.quantize(x), torch.float32)
    if pool.kv_format == "fp8_e4m3":
        return mxfp8.quantize_per_tensor(x, write_scale).float() * read_scale
    return x.to(pool.store_dtype).float()


def assert_same(a, b):
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


@CORE
@given(data=st.data())
def test_set_kv_buffer(data):
    pool = data.draw(pools())
    layer = data.draw(st.sampled_from(sorted(pool.layers)))
    buf = pool.layers[layer]
    hkv, d = buf.k.shape[1:]
    loc, slot_defect, n = data.draw(slot_sets(buf.num_slots))
    valid = slot_defect is None
    k = values(data.draw, n, hkv, d, seed=data.draw(st.integers(0, 99)))
    v = values(data.draw, n, hkv, d, seed=data.draw(st.integers(100, 199)))
    kwargs = {}
    defect = data.draw(st.sampled_from([None] * 6 + ["shape", "int_values", "fp8_values", "scale"]))
    if valid and defect == "shape":
        v, valid = v[:, :, : d // 2], False
    elif valid and defect == "int_values":
        k, valid = k.to(torch.int32), False
    elif valid and defect == "fp8_values":
        v, valid = v.float().clamp(-448, 448).to(torch.float8_e4m3fn), False
    elif valid and defect == "scale" and pool.kv_format == "fp8_e4m3":
        kwargs["k_scale"] = data.draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), True]))
        valid = False
    if valid and pool.kv_format == "fp8_e4m3" and data.draw(st.booleans()):
        kwargs["k_scale"] = data.draw(st.sampled_from([0.25, 3.0]))
    if valid and data.draw(st.booleans()):
        k = k.reshape(n, hkv * d)  # the flat [N, Hkv * D] form is accepted too
    before = {i: [t.clone().view(torch.uint8) for t in b.tensors()] for i, b in pool.layers.items()}
    event(f"{pool.kv_format}: " + ("valid" if valid else f"invalid ({slot_defect or defect})"))
    if not valid:
        with pytest.raises(CLEAN_ERRORS):
            pool.set_kv_buffer(layer, loc, k, v, **kwargs)
        assert all(same_bytes(before[i], [t.view(torch.uint8) for t in b.tensors()]) for i, b in pool.layers.items())
        return
    pool.set_kv_buffer(layer, loc, k, v, **kwargs)
    got_k, got_v = pool.read_kv(layer, loc)
    assert_same(got_k, expected_read(pool, k.reshape(n, hkv, d), kwargs.get("k_scale", pool.k_scale), pool.k_scale))
    assert_same(got_v, expected_read(pool, v.reshape(n, hkv, d), pool.v_scale, pool.v_scale))
    # nothing else was written: the other slots of this layer (data and scale bytes) and the other layer
    other = torch.tensor([s for s in range(buf.num_slots) if s not in set(loc.tolist())])
    assert torch.equal(buf.k.view(torch.uint8)[other], before[layer][0][other])
    assert torch.equal(buf.v.view(torch.uint8)[other], before[layer][1][other])
    if buf.layout is not None:
        assert torch.equal(buf.layout.gather(buf.sfk, other), buf.layout.gather(before[layer][2], other))
        assert torch.equal(buf.layout.gather(buf.sfv, other), buf.layout.gather(before[layer][3], other))
    for i, b in pool.layers.items():
        if i != layer:
            assert same_bytes(before[i], [t.view(torch.uint8) for t in b.tensors()])


@CORE
@given(data=st.data())
def test_move_kv_cache(data):
    pool = data.draw(pools())
    for i, buf in pool.layers.items():  # fill every slot of every layer
        shape = (buf.num_slots - 1, *buf.k.shape[1:])
        g = torch.Generator().manual_seed(i)
        pool.set_kv_buffer(i, torch.arange(1, buf.num_slots), torch.randn(shape, generator=g),
                           torch.randn(shape, generator=g))
    tgt, tgt_defect, n = data.draw(slot_sets(bound(pool), limit=6))
    tgt_ok = tgt_defect is None
    src_ids = data.draw(st.lists(st.integers(1, bound(pool) - 1), min_size=n, max_size=n))  # repeats allowed
    src, src_ok = torch.tensor(src_ids), True
    defect = data.draw(st.sampled_from([None] * 4 + ["src_out_of_range", "src_negative", "src_float", "shape"]))
    if tgt_ok and defect == "src_out_of_range":
        src[0], src_ok = max(b.num_slots for b in pool.layers.values()), False  # fits the full layer only
    elif tgt_ok and defect == "src_negative":
        src[-1], src_ok = -1, False
    elif tgt_ok and defect == "src_float":
        src, src_ok = src.float(), False
    elif tgt_ok and defect == "shape":
        src, src_ok = torch.cat([src, src[:1]]), False
    before = snapshot(pool)
    event("valid" if tgt_ok and src_ok else f"invalid ({tgt_defect or defect})")
    if not (tgt_ok and src_ok):
        with pytest.raises(CLEAN_ERRORS):
            pool.move_kv_cache(tgt, src)
        assert same_bytes(before, snapshot(pool))
        return
    reads = {i: pool.read_kv(i, src) for i in pool.layers}
    pool.move_kv_cache(tgt, src)
    for i in pool.layers:
        got = pool.read_kv(i, tgt)
        assert_same(got[0], reads[i][0])
        assert_same(got[1], reads[i][1])


@CORE
@given(data=st.data())
def test_set_mxfp8_kv_buffer(data):
    hkv, d = data.draw(st.sampled_from([1, 2])), data.draw(st.sampled_from([32, 64]))
    plan = LayerPlan.from_windows({0: None}, num_q_heads=hkv, num_kv_heads=hkv, head_dim=d)
    pool = InklingKVPool(plan, 256, 128, "mxfp8")
    loc, slot_defect, n = data.draw(slot_sets(pool.layers[0].num_slots))
    valid = slot_defect is None
    k = values(data.draw, n, hkv, d, seed=1)
    v = values(data.draw, n, hkv, d, seed=2)
    kd, ks = mxfp8.quantize(k)
    vd, vs = mxfp8.quantize(v)
    defect = data.draw(st.sampled_from([None] * 4 + ["bf16_data", "float_scales", "no_scales", "scale_shape"]))
    if valid and defect == "bf16_data":
        vd, valid = v.bfloat16(), False
    elif valid and defect == "float_scales":
        vs, valid = vs.to(data.draw(st.sampled_from([torch.float16, torch.float32, torch.int64]))), False
    elif valid and defect == "no_scales":
        ks, valid = None, False
    elif valid and defect == "scale_shape":
        vs, valid = vs.reshape(-1), False
    before = snapshot(pool)
    event("valid" if valid else f"invalid ({slot_defect or defect})")
    if not valid:
        with pytest.raises(CLEAN_ERRORS):
            pool.set_mxfp8_kv_buffer(0, loc, kd, ks, vd, vs)
        assert same_bytes(before, snapshot(pool))
        return
    pool.set_mxfp8_kv_buffer(0, loc, kd.view(torch.uint8) if data.draw(st.booleans()) else kd, ks, vd, vs)
    got_k, got_v = pool.read_kv(0, loc)
    assert_same(got_k, mxfp8.dequantize(kd, ks, torch.float32))
    assert_same(got_v, mxfp8.dequantize(vd, vs, torch.float32))


@CORE
@given(data=st.data())
def test_read_kv(data):
    pool = data.draw(pools())
    layer = data.draw(st.sampled_from(sorted(pool.layers)))
    slots, defect, _ = data.draw(slot_sets(pool.layers[layer].num_slots))
    if defect not in (None, "duplicate"):  # reading a slot twice is fine
        with pytest.raises(CLEAN_ERRORS):
            pool.read_kv(layer, slots)
        return
    k, v = pool.read_kv(layer, slots)
    assert k.shape == (slots.numel(), *pool.layers[layer].k.shape[1:]) and not k.any() and not v.any()


@CORE
@given(data=st.data())
def test_mxfp8_quantize_rule(data):
    n, d = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([32, 64]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    x = torch.randn(n, d, generator=g) * data.draw(st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e4]))
    if data.draw(st.booleans()):
        x.view(-1)[data.draw(st.integers(0, x.numel() - 1))] = data.draw(st.sampled_from([float("nan"),
                                                                                          float("-inf")]))
    x = x.to(data.draw(st.sampled_from([torch.bfloat16, torch.float32])))
    q, e = mxfp8.quantize(x)
    blocks = x.float().view(n, d // 32, 32)
    finite = torch.isfinite(blocks).all(-1)
    assert bool((e[~finite] == mxfp8.NAN_SCALE).all())
    assert bool((q.view(torch.uint8).view(n, -1, 32)[~finite] == mxfp8.E4M3_NAN).all())
    scale = mxfp8.exponent_to_scale(e)[finite]
    amax = blocks.abs().amax(-1)[finite].clamp(min=mxfp8.AMAX_FLOOR)
    assert bool((amax <= 448 * scale).all())  # no saturation
    assert bool(((amax > 224 * scale) | (e[finite] == 0)).all())  # the smallest such exponent
    back = mxfp8.dequantize(q, e, torch.float32).view(n, -1, 32)[finite]
    exact = blocks[finite]
    # round to nearest e4m3 (3 mantissa bits): within 2**-4 of the value, or half the subnormal step 2**-9
    assert bool(((back - exact).abs() <= exact.abs() * 2.0 ** -4 + scale.unsqueeze(-1) * 2.0 ** -10).all())
    with pytest.raises(CLEAN_ERRORS):
        mxfp8.dequantize(q, e.to(data.draw(st.sampled_from([torch.float32, torch.int64, torch.int8]))))


@CORE
@given(data=st.data())
def test_scale_layout_scatter_gather(data):
    page = data.draw(st.sampled_from([128, 32]))
    layout = ScaleLayout.for_pool(page * data.draw(st.integers(1, 3)), data.draw(st.sampled_from([1, 2])),
                                  data.draw(st.sampled_from([32, 64, 128])), page)
    everything = layout.flat_index(torch.arange(layout.num_slots)).reshape(-1)
    assert torch.equal(everything.sort().values, torch.arange(layout.num_bytes))  # a bijection onto the buffer
    sf = layout.empty()
    slots, defect, n = data.draw(slot_sets(layout.num_slots))
    valid = defect is None
    scales = torch.randint(0, 255, (n, layout.num_kv_heads, layout.blocks_per_head), dtype=torch.uint8)
    if valid and data.draw(st.booleans()):
        scales, valid = scales.to(data.draw(st.sampled_from([torch.float32, torch.int64]))), False
    if not valid:
        with pytest.raises(CLEAN_ERRORS):
            layout.scatter(sf, slots, scales)
        assert not sf.any()
        return
    layout.scatter(sf, slots, scales)
    assert torch.equal(layout.gather(sf, slots), scales)
    assert int((sf != 0).sum()) == int((scales != 0).sum())  # nothing else written


# --- Triton kernels under the interpreter ---------------------------------------------------------------------

def _kernels():
    try:
        import triton  # noqa: F401
    except ImportError as err:
        pytest.skip(f"triton is not importable ({err}); the kernel properties need it")
    from sglang_inkling_backend.triton.decode_attention import paged_decode_attention
    from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8
    return paged_decode_attention, store_kv_mxfp8


@KERNELS
@given(data=st.data())
def test_triton_store_matches_the_core(data):
    _, store_kv_mxfp8 = _kernels()
    hkv, d, page = data.draw(st.sampled_from([1, 2])), 32, data.draw(st.sampled_from([128, 32]))
    plan = LayerPlan.from_windows({0: None}, num_q_heads=hkv, num_kv_heads=hkv, head_dim=d)
    core = InklingKVPool(plan, 128, page, "mxfp8")
    layer = core.layers[0]
    fused = PagedKV(layer.k.clone(), layer.v.clone(), layer.sfk.clone(), layer.sfv.clone(), layer.layout)
    loc, defect, n = data.draw(slot_sets(layer.num_slots, limit=6))
    valid = defect is None
    k, v = values(data.draw, n, hkv, d, seed=3), values(data.draw, n, hkv, d, seed=4)
    before = [t.clone().view(torch.uint8) for t in (fused.k_buffer, fused.v_buffer, fused.k_scales, fused.v_scales)]
    event("valid" if valid else f"invalid ({defect})")
    if not valid:
        with pytest.raises(CLEAN_ERRORS):
            store_kv_mxfp8(fused, loc, k, v)
        after = [t.view(torch.uint8) for t in (fused.k_buffer, fused.v_buffer, fused.k_scales, fused.v_scales)]
        assert same_bytes(before, after)
        return
    store_kv_mxfp8(fused, loc, k, v)
    core.set_kv_buffer(0, loc, k, v)
    for a, b in ((fused.k_buffer, layer.k), (fused.v_buffer, layer.v), (fused.k_scales, layer.sfk),
                 (fused.v_scales, layer.sfv)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@KERNELS
@given(data=st.data())
def test_triton_decode_matches_the_reference(data):
    paged_decode_attention, _ = _kernels()
    hkv, d = 1, 32
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    kv = PagedKV(torch.randn(160, hkv, d, generator=g), torch.randn(160, hkv, d, generator=g))
    lengths = data.draw(st.lists(st.integers(1, 70), min_size=1, max_size=3))
    indptr = torch.tensor([0] + lengths).cumsum(0)
    indices = torch.randperm(159, generator=g)[: int(indptr[-1])] + 1
    q = torch.randn(len(lengths), 2, d, generator=g)
    params = AttentionParams(d ** -0.5, window=data.draw(st.sampled_from([None, 16])),
                             logit_cap=data.draw(st.sampled_from([0.0, 5.0])))
    defect = data.draw(st.sampled_from([None] * 3 + ["max_seq_len", "slot", "empty", "indptr_dtype"]))
    max_seq_len = data.draw(st.sampled_from([None, max(lengths), max(lengths) + 7]))
    if defect == "max_seq_len":
        max_seq_len = max(lengths) - 1 if max(lengths) > 1 else 0
    elif defect == "slot":
        indices[data.draw(st.integers(0, indices.numel() - 1))] = data.draw(st.sampled_from([-1, 160]))
    elif defect == "empty":
        indptr = torch.cat([indptr, indptr[-1:]])
        q = torch.randn(len(lengths) + 1, 2, d, generator=g)
    elif defect == "indptr_dtype":
        indptr = indptr.float()
    event("valid" if defect is None else f"invalid ({defect})")
    if defect is not None:
        with pytest.raises(CLEAN_ERRORS):
            paged_decode_attention(q, kv, indptr, indices, params, max_seq_len=max_seq_len)
        return
    want = reference_decode(q, kv, indptr, indices, params)
    got = paged_decode_attention(q, kv, indptr, indices, params, max_seq_len=max_seq_len, out=torch.empty_like(q))
    assert float((got - want).norm() / want.norm()) < 1e-5  # float32 pools: summation order only
