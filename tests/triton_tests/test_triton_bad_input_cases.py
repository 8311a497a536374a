"""Issue 15's Triton cases, under the interpreter on the CPU (tiny shapes): a max_seq_len below a request's length
is refused (it gave a wrong result), the extend's tile sizes are checked, a zero-key decode request raises as in
the reference, the fused store refuses a slot named twice, and the prologue's NaN bytes equal the reference's."""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests", allow_module_level=True)

triton = pytest.importorskip("triton")

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention as reference_decode  # noqa: E402
from sglang_inkling_backend.reference import prologue as reference_prologue  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import prologue as fused_prologue  # noqa: E402
from sglang_inkling_backend.triton.decode_attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.triton.extend_attention import paged_extend_attention  # noqa: E402
from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8  # noqa: E402

from sglang_inkling_backend.triton import device, encode  # noqa: E402

if not all(isinstance(fn, triton.runtime.interpreter.InterpretedFunction)
           for fn in (device.scale_offsets, encode.mxfp8_encode_blocks,
                      fused_prologue._inkling_prologue_decode_kernel)):
    importlib.reload(device)  # the helpers and the encoder the prologue calls, then the prologue, interpreted
    importlib.reload(encode)
    fused_prologue = importlib.reload(fused_prologue)

D = 32


def float_pool(slots=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return PagedKV(torch.randn(slots, 1, D, generator=g), torch.randn(slots, 1, D, generator=g))


def test_a_max_seq_len_below_a_request_is_refused():
    kv = float_pool()
    q = torch.randn(2, 1, D, generator=torch.Generator().manual_seed(1))
    indptr, indices = torch.tensor([0, 300, 500]), torch.arange(1, 501)
    params = AttentionParams(D ** -0.5)
    with pytest.raises(ValueError, match=r"max_seq_len=1 is below the longest request's 300 keys"):
        paged_decode_attention(q, kv, indptr, indices, params, max_seq_len=1)
    with pytest.raises(ValueError, match="max_seq_len must be None or a positive int"):
        paged_decode_attention(q, kv, indptr, indices, params, max_seq_len=0)
    want = reference_decode(q, kv, indptr, indices, params)
    for max_seq_len in (None, 300, 512):  # exact, or an upper bound
        got = paged_decode_attention(q, kv, indptr, indices, params, max_seq_len=max_seq_len, out=torch.empty_like(q))
        assert float((got - want).norm() / want.norm()) < 1e-5, max_seq_len


@pytest.mark.parametrize("name,value", [("block_n", 17), ("block_n", 8), ("block_rows", 24), ("block_n", True)])
def test_extend_tile_sizes_are_checked(name, value):
    kv = float_pool(64)
    q = torch.randn(4, 1, D)
    with pytest.raises(ValueError, match=f"{name} must be a power of two >= 16, got {value!r}"):
        paged_extend_attention(q, kv, torch.tensor([0, 4]), torch.arange(1, 5), torch.tensor([0, 4]),
                               AttentionParams(0.1), **{name: value})


def test_a_zero_key_decode_request_raises_in_both():
    kv = float_pool(64)
    q = torch.randn(2, 1, D)
    args = (q, kv, torch.tensor([0, 3, 3]), torch.arange(1, 4), AttentionParams(0.1))
    for fn in (reference_decode, paged_decode_attention):
        with pytest.raises(ValueError, match=r"every decode request needs at least one key \(its own\)"):
            fn(*args)


def test_fused_store_refuses_a_slot_twice():
    layout = ScaleLayout.for_pool(256, 1, D, 128)
    kv = PagedKV(torch.zeros(256, 1, D, dtype=torch.float8_e4m3fn), torch.zeros(256, 1, D, dtype=torch.float8_e4m3fn),
                 layout.empty(), layout.empty(), layout)
    k = torch.randn(3, 1, D).bfloat16()
    with pytest.raises(ValueError, match="loc must not name a slot twice in one write"):
        store_kv_mxfp8(kv, torch.tensor([5, 6, 5]), k, k)
    assert not kv.k_buffer.view(torch.uint8).any() and not kv.k_scales.any()


@pytest.mark.parametrize("mx", [False, True])
def test_prologue_nan_bytes_equal_the_reference(mx):
    from test_reference_prologue import clone_args, make_case

    args, packed = make_case(T=2, mxfp8_mode=mx)
    packed[0, 5] = float("nan")  # q
    packed[1, 2 * 128 + 7] = float("nan")  # k
    packed[1, 3 * 128 + 9] = float("inf")  # v: its conv turns it into NaN
    a, b = clone_args(args), clone_args(args)
    out_ref = reference_prologue.inkling_attn_prologue_decode(**a)
    out_fused = fused_prologue.inkling_attn_prologue_decode(**b)
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)  # noqa: E731
    nans = 0
    for name, x, y in list(zip(("q_out", "k_out", "v_out", "q_scale"), out_ref, out_fused)) + [
            (key, a[key], b[key]) for key in a if isinstance(a[key], torch.Tensor) and key != "qkvr"]:
        if x is None:
            continue
        assert torch.equal(bits(x), bits(y)), name
        if x.dtype == torch.bfloat16:
            nans += int(torch.isnan(x).sum())
    assert nans > 0  # the case does carry NaNs to the outputs
