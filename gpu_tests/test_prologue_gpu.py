"""GPU: the fused Triton decode prologue is byte-identical to the torch reference (run on the CPU) at Inkling's
per-rank shapes: outputs, conv caches, pool bytes and interleaved scales. Fresh random inputs every run (the seed
is printed), pool buffers filled with random bytes and the allocator poisoned with 0xFF before each run, so an
output element the kernel fails to write shows up as a mismatch. Also checks the CUDA-graph path.

Run on a GPU machine: ``python -m pytest -q gpu_tests/test_prologue_gpu.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

from sglang_inkling_backend.reference import prologue as reference  # noqa: E402
from sglang_inkling_backend.triton import prologue as fused  # noqa: E402

D = 128
SEED = int.from_bytes(os.urandom(4), "little")


def poison_allocator():
    """Fill freed small-pool blocks with 0xFF so torch.empty outputs start as NaN bytes."""
    blocks = [torch.full((1 << 16,), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(256)]
    del blocks
    torch.cuda.synchronize()


def random_case(T, hq, hkv, W, mx, tau, track, seed, padding=True):
    g = torch.Generator().manual_seed(seed)
    dq, dkv, d_rel = hq * D, hkv * D, 16
    cache_slots = 2 * T + 8
    kv_slots = 128 * ((T * 3) // 128 + 2)
    packed = torch.randn(T, dq + 2 * dkv + hq * d_rel, generator=g).mul(2.0).bfloat16()
    perm = torch.randperm(cache_slots - 1, generator=g) + 1
    ci = perm[:T].to(torch.int32)
    cm = torch.rand(T, generator=g) < 0.8
    if padding and T > 1:
        ci[-1] = -1  # a padding row (CUDA-graph style)
        cm[-1] = False
    loc = (torch.randperm(kv_slots - 1, generator=g)[:T] + 1).long()
    if T > 2:
        loc[1] = -1
    kv_dtype = torch.float8_e4m3fn if mx else torch.bfloat16
    args = dict(
        qkvr=packed[:, :dq],
        k_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16(),
        v_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16(),
        cache_indices=ci, cache_mask=cm,
        k_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16(),
        v_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16(),
        q_gamma=(1 + 0.2 * torch.randn(D, generator=g)).bfloat16(),
        k_gamma=(1 + 0.2 * torch.randn(D, generator=g)).bfloat16(),
        eps=1e-6, loc=loc,
        # pool bytes: random garbage (only written, never read), so untouched slots must stay as they were
        k_buf=torch.randint(0, 256, (kv_slots, hkv, D * (1 if mx else 2)), dtype=torch.uint8, generator=g)
        .view(kv_dtype),
        v_buf=torch.randint(0, 256, (kv_slots, hkv, D * (1 if mx else 2)), dtype=torch.uint8, generator=g)
        .view(kv_dtype),
        q_off=0, k_off=dq, v_off=dq + dkv, dq=dq, dkv=dkv,
    )
    if mx:
        shape = (kv_slots // 128, hkv, 32, 4, 4)
        args.update(mxfp8_quant=True,
                    sfk=torch.randint(0, 255, shape, dtype=torch.uint8, generator=g),
                    sfv=torch.randint(0, 255, shape, dtype=torch.uint8, generator=g))
    if tau:
        positions = torch.randint(0, 1 << 20, (T,), generator=g)
        args["log_scaling_tau"] = reference.log_scaling_tau(positions, 128000, 0.1)
    if track:
        args["track_mask"] = torch.rand(T, generator=g) < 0.5
        args["track_indices"] = (perm[T:2 * T]).long()
    return args, packed


def to_device(args, packed, device):
    out = {}
    packed_dev = packed.to(device)
    for k, v in args.items():
        if k == "qkvr":
            out[k] = packed_dev[:, :v.shape[1]]
        elif isinstance(v, torch.Tensor):
            out[k] = v.to(device)
        else:
            out[k] = v
    return out


def as_bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def compare(ref_args, ref_out, dev_args, dev_out, label):
    for name, x, y in zip(("q_out", "k_out", "v_out", "q_scale"), ref_out, dev_out):
        if x is None:
            assert y is None
            continue
        y = y.cpu()
        mismatch = (as_bytes(x) != as_bytes(y)).sum().item()
        assert mismatch == 0, f"{label}: {name} differs in {mismatch} of {x.numel()} elements (seed {SEED})"
    for key, value in ref_args.items():
        if isinstance(value, torch.Tensor) and key != "qkvr":
            y = dev_args[key].cpu()
            mismatch = (as_bytes(value) != as_bytes(y)).sum().item()
            assert mismatch == 0, f"{label}: buffer {key} differs in {mismatch} elements (seed {SEED})"


CASES = [
    # (T, hq, hkv, W, mxfp8, tau, track)
    (1, 16, 2, 4, True, True, False),
    (8, 16, 2, 4, True, True, True),
    (64, 16, 2, 4, True, False, True),
    (128, 16, 2, 4, True, True, True),
    (128, 16, 2, 4, False, True, True),
    (8, 16, 2, 4, False, False, False),
    (37, 8, 1, 4, True, True, True),   # TP8 per-rank geometry, odd batch
    (19, 5, 3, 3, True, True, True),   # odd head counts, W = 3
]


@pytest.mark.parametrize("T,hq,hkv,W,mx,tau,track", CASES)
def test_fused_prologue_bytes_equal_reference(T, hq, hkv, W, mx, tau, track):
    print(f"seed {SEED}")
    args, packed = random_case(T, hq, hkv, W, mx, tau, track, SEED + T * 131 + hq)
    dev_args = to_device(args, packed, "cuda")
    ref_args = {k: (v.clone() if isinstance(v, torch.Tensor) and k != "qkvr" else v) for k, v in args.items()}
    ref_out = reference.inkling_attn_prologue_decode(**ref_args)
    poison_allocator()
    dev_out = fused.inkling_attn_prologue_decode(**dev_args)
    torch.cuda.synchronize()
    compare(ref_args, ref_out, dev_args, dev_out, f"T={T} hq={hq} hkv={hkv} W={W} mxfp8={mx}")


@pytest.mark.parametrize("mx", [True, False])
def test_fused_prologue_in_a_cuda_graph(mx):
    T = 64
    args, packed = random_case(T, 16, 2, 4, mx, True, True, SEED + 7)
    dev_args = to_device(args, packed, "cuda")
    warm = {k: (v.clone() if isinstance(v, torch.Tensor) and k != "qkvr" else v) for k, v in dev_args.items()}
    fused.inkling_attn_prologue_decode(**warm)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    poison_allocator()
    with torch.cuda.graph(graph):
        dev_out = fused.inkling_attn_prologue_decode(**dev_args)  # value checks skip themselves while capturing
    graph.replay()
    torch.cuda.synchronize()
    ref_args = {k: (v.clone() if isinstance(v, torch.Tensor) and k != "qkvr" else v) for k, v in args.items()}
    ref_out = reference.inkling_attn_prologue_decode(**ref_args)
    compare(ref_args, ref_out, dev_args, dev_out, f"graph mxfp8={mx}")


def test_value_errors_on_gpu_leave_buffers_untouched():
    args, packed = random_case(8, 16, 2, 4, True, True, True, SEED + 11)
    dev_args = to_device(args, packed, "cuda")
    dev_args["loc"][3] = dev_args["k_buf"].shape[0]  # one past the pool
    before = {k: v.clone() for k, v in dev_args.items() if isinstance(v, torch.Tensor) and k != "qkvr"}
    with pytest.raises(ValueError, match="loc must be <"):
        fused.inkling_attn_prologue_decode(**dev_args)
    dev_args["loc"][3] = dev_args["loc"][4]  # duplicate store slot
    before["loc"] = dev_args["loc"].clone()
    with pytest.raises(ValueError, match="loc must be distinct"):
        fused.inkling_attn_prologue_decode(**dev_args)
    for k, v in before.items():
        assert torch.equal(as_bytes(dev_args[k]), as_bytes(v)), k
