"""Triton extend attention (prefill over a cached prefix) against the torch reference, on the CPU under the Triton
interpreter (small shapes).

Error bound: the interpreter's dots run in float32 (see ``triton.inputs.dot_dtype``) and the tests ask for a
float32 output, so kernel and reference differ only by float32 summation order and the exp2 softmax: 1e-5
relative (Frobenius; seen ~1e-7), far below a real bug (a missed key, a causal or window off-by-one, a wrong bias
offset: 1e-2 or more). The GPU's bf16 path is checked by gpu_tests/check_triton_gpu.py.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_extend_attention as reference_extend  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton.extend_attention import paged_extend_attention  # noqa: E402
from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-5


def make_pool(fmt, hkv, d, slots, gen, page=128):
    k = torch.randn(slots, hkv, d, generator=gen).to(DEV)
    v = torch.randn(slots, hkv, d, generator=gen).to(DEV)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(slots, hkv, d, page)
        data = lambda: torch.zeros(slots, hkv, d, dtype=torch.float8_e4m3fn, device=DEV)
        pool = PagedKV(data(), data(), layout.empty(DEV), layout.empty(DEV), layout)
        store_kv_mxfp8(pool, torch.arange(slots, device=DEV), k.bfloat16(), v.bfloat16())
        return pool
    if fmt == "fp8":
        return PagedKV((k / 0.5).to(torch.float8_e4m3fn), (v / 0.25).to(torch.float8_e4m3fn), k_scale=0.5,
                       v_scale=0.25)
    return PagedKV(k.bfloat16(), v.bfloat16())


def make_batch(qlens, prefixes, slots, gen):
    kvlens = [q + p for q, p in zip(qlens, prefixes)]
    qo = torch.tensor([0] + qlens).cumsum(0).to(torch.int32).to(DEV)
    kv_indptr = torch.tensor([0] + kvlens).cumsum(0).to(torch.int32).to(DEV)
    kv_indices = torch.randperm(slots, generator=gen)[: sum(kvlens)].to(torch.int32).to(DEV)
    return qo, kv_indptr, kv_indices


MODES = {
    "plain": lambda t, hq, d, g: AttentionParams(d ** -0.5),
    "inkling": lambda t, hq, d, g: AttentionParams(1.0 / d, rel_bias=torch.randn(t, hq, 48, generator=g).to(DEV)),
    "inkling-local": lambda t, hq, d, g: AttentionParams(1.0 / d, window=24,
                                                         rel_bias=torch.randn(t, hq, 24, generator=g).to(DEV)),
    "generic": lambda t, hq, d, g: AttentionParams(d ** -0.5, window=40, logit_cap=3.0,
                                                   sinks=torch.randn(hq, generator=g).to(DEV)),
}


CASES = [("mxfp8", mode) for mode in sorted(MODES)] + [("bf16", "generic"), ("fp8", "inkling")]


@pytest.mark.parametrize("fmt,mode", CASES)
def test_extend_matches_reference(fmt, mode):
    """Prefill without prefix, a single-token extend after a prefix, chunked prefill longer than a query block
    (16 rows of 4 heads): every causal / window / bias edge."""
    gen = torch.Generator().manual_seed(hash((fmt, mode)) % 2**31)
    hq, hkv, d = 8, 2, 64
    pool = make_pool(fmt, hkv, d, 256, gen)  # small: filling it runs the store kernel per slot (interpreter)
    qo, kv_indptr, kv_indices = make_batch([5, 1, 20], [0, 70, 50], pool.num_slots, gen)
    t = int(qo[-1])
    q = torch.randn(t, hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES[mode](t, hq, d, gen)
    ref = reference_extend(q, pool, kv_indptr, kv_indices, qo, params)
    out = torch.full(q.shape, float("nan"), device=DEV)
    paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, params, out=out)
    assert not torch.isnan(out).any()
    assert ((out - ref).norm() / ref.norm()).item() < TOL


@pytest.mark.parametrize("hq,hkv,block_rows", [(6, 2, 64), (16, 1, 16)])
def test_extend_group_shapes(hq, hkv, block_rows):
    """GQA groups that do not divide the row block, and groups as large as the block."""
    gen = torch.Generator().manual_seed(hq * 10 + block_rows)
    d = 32
    pool = make_pool("mxfp8", hkv, d, 128, gen)
    qo, kv_indptr, kv_indices = make_batch([13, 3], [20, 0], pool.num_slots, gen)
    t = int(qo[-1])
    q = torch.randn(t, hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES["inkling"](t, hq, d, gen)
    ref = reference_extend(q, pool, kv_indptr, kv_indices, qo, params)
    out = paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, params, block_rows=block_rows,
                                 out=torch.full(q.shape, float("nan"), device=DEV))
    assert ((out - ref).norm() / ref.norm()).item() < TOL


def test_extend_rejects_bad_input():
    gen = torch.Generator().manual_seed(0)
    pool = make_pool("mxfp8", 2, 64, 256, gen)
    qo, kv_indptr, kv_indices = make_batch([4, 2], [3, 0], 256, gen)
    q = torch.randn(6, 8, 64).bfloat16().to(DEV)
    p = AttentionParams(0.1)
    with pytest.raises(ValueError, match="qo_indptr must start at 0"):
        paged_extend_attention(q[:5], pool, kv_indptr, kv_indices, qo, p)
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        paged_extend_attention(q, pool, torch.tensor([0, 4, 5], dtype=torch.int32), kv_indices, qo, p)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        paged_extend_attention(q, pool, kv_indptr[:2], kv_indices, qo, p)
    with pytest.raises(ValueError, match="kv_indices must be slots"):
        paged_extend_attention(q, pool, kv_indptr, torch.full_like(kv_indices, 300), qo, p)
    with pytest.raises(ValueError, match="rel_bias"):
        paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, AttentionParams(0.1, rel_bias=torch.zeros(2, 8, 4)))
    with pytest.raises(TypeError, match="qo_indptr"):
        paged_extend_attention(q, pool, kv_indptr, kv_indices, qo.float(), p)


def test_a_steps_blocks_give_the_same_bytes_and_are_laid_out_once_per_step(monkeypatch):
    """``extend_blocks`` (the grid read from qo_indptr once) gives the per-call layout's bytes; through
    GpuRoute.extend with the step's plans it is made once for layers of one head grouping and again for another,
    and a call then reads nothing back. Blocks of another grouping, or with validate/verify, are refused."""
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.rails import KVRails
    from sglang_inkling_backend.step_plans import DecodePlanCache
    from sglang_inkling_backend.gpu.route import GpuRoute

    gen = torch.Generator().manual_seed(31)
    hq, hkv, d = 8, 2, 64
    pool = make_pool("mxfp8", hkv, d, 256, gen)
    qo, kv_indptr, kv_indices = make_batch([5, 1, 20], [0, 70, 50], pool.num_slots, gen)
    qo, kv_indptr, kv_indices = qo.long(), kv_indptr.long(), kv_indices.long()
    t = int(qo[-1])
    q = torch.randn(t, hq, d, generator=gen).bfloat16().to(DEV)
    params = MODES["inkling-local"](t, hq, d, gen)
    want = paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, params)
    blocks = kernels.extend_blocks(qo, hq, hkv)
    assert blocks.block_m == 16 and blocks.block_req.tolist() == [0, 1, 2, 2]
    assert blocks.block_row.tolist() == [0, 5, 6, 22]
    assert torch.equal(paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, params, validate=False,
                                              blocks=blocks), want)
    made = []
    real = kernels.extend_blocks
    monkeypatch.setattr(kernels, "extend_blocks", lambda *a, **k: made.append(a) or real(*a, **k))
    route, plans = GpuRoute(kernels), DecodePlanCache()
    rails = KVRails(kv_indptr, kv_indices)
    wide_q = torch.randn(t, 2 * hq, d, generator=gen).bfloat16().to(DEV)
    wide = AttentionParams(1.0 / d, window=24, rel_bias=torch.randn(t, 2 * hq, 24, generator=gen).to(DEV))
    for _ in range(2):
        assert torch.equal(route.extend(q, pool, rails, qo, params, plans=plans), want)
        route.extend(wide_q, pool, rails, qo, wide, plans=plans)
    assert len(made) == 2  # one per head grouping (G 4 and 8), for four layers
    monkeypatch.undo()
    for kwargs, err, match in (({"blocks": kernels.extend_blocks(qo, 2 * hq, hkv)}, ValueError,
                                r"blocks were laid out 8 rows per program; this layer's heads \(8 over 2\) take 16"),
                               ({"blocks": blocks, "validate": True}, ValueError, "validate=False"),
                               ({"blocks": (blocks.block_req, blocks.block_row)}, TypeError,
                                "blocks must be None or an ExtendBlocks")):
        kwargs.setdefault("validate", False)
        with pytest.raises(err, match=match):
            paged_extend_attention(q, pool, kv_indptr, kv_indices, qo, params, **kwargs)
