"""The MLX-ops MXFP8 format against the core quantizer: bytes must be identical."""

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.mlx import mxfp8_ops  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402


def _core_bytes(x: torch.Tensor):
    data, scales = mxfp8.quantize(x)
    return data.view(torch.uint8), scales


def _edge_values() -> torch.Tensor:
    """Blocks that stress the exponent rule and e4m3 rounding: exact powers of two at 448 * 2^k, mantissas
    just above 1.75, e4m3 ties (odd/even), subnormal ties, zeros, negative zeros, huge and tiny blocks."""
    blocks = []
    for amax in (448.0, 3.5, 3.5000002, 1.76, 1.75, 500.0, 449.0, 2.0 ** -20, 1e-30, 3e38, 1.0, 3.3e38):
        row = torch.linspace(-amax, amax, 32)
        row[0] = amax
        blocks.append(row)
    ties = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 232.0, 124.0, 84.0, 2.0 ** -10, 3 * 2.0 ** -10,
                         2.0 ** -9, 0.0, -0.0, 447.9, -448.0, 240.0, 248.0] * 2)
    blocks.append(ties)
    blocks.append(torch.zeros(32))
    blocks.append(-torch.zeros(32))
    return torch.stack(blocks).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_bytes_match_core_on_random_rows(dtype):
    torch.manual_seed(0)
    x = (torch.randn(7, 3, 128) * torch.logspace(-6, 6, 7).view(7, 1, 1)).to(dtype)
    data, scales = mxfp8_ops.quantize(from_torch(x))
    core_data, core_scales = _core_bytes(x)
    assert torch.equal(to_torch(data), core_data)
    assert torch.equal(to_torch(scales), core_scales)


def test_quantize_bytes_match_core_on_edge_blocks():
    x = _edge_values()
    data, scales = mxfp8_ops.quantize(from_torch(x))
    core_data, core_scales = _core_bytes(x)
    assert torch.equal(to_torch(scales), core_scales)
    assert torch.equal(to_torch(data), core_data)
    # the exponent rule's fixed points, spelled out
    assert to_torch(scales)[:7, 0].tolist() == [127, 120, 121, 120, 119, 128, 128]  # 448*2^(e-127) >= amax, smallest e
    assert int(to_torch(scales)[-1, 0]) == mxfp8.ZERO_BLOCK_EXPONENT


def test_non_finite_blocks_follow_the_core():
    x = torch.randn(4, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    x[2, 0] = float("-inf")
    data, scales = mxfp8_ops.quantize(from_torch(x))
    core_data, core_scales = _core_bytes(x)
    assert torch.equal(to_torch(scales), core_scales)
    assert torch.equal(to_torch(data), core_data)
    assert to_torch(scales)[0].tolist() == [mxfp8.NAN_SCALE, int(core_scales[0, 1])]


def test_dequantize_matches_core_exactly():
    torch.manual_seed(1)
    x = torch.randn(5, 2, 64) * 30
    data, scales = _core_bytes(x)
    ours = mxfp8_ops.dequantize(from_torch(data), from_torch(scales))
    assert torch.equal(to_torch(ours), mxfp8.dequantize(data, scales, torch.float32))


@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_scale_offsets_match_core_layout(page_size):
    layout = ScaleLayout.for_pool(256, 3, 128, page_size)
    slots = torch.tensor([0, 1, 31, 32, 100, 127, 128, 200, 255])
    ours = mxfp8_ops.scale_offsets(from_torch(slots.int()), 3, 128, page_size)
    assert torch.equal(to_torch(ours), layout.flat_index(slots))


def test_bad_head_dim_is_rejected():
    with pytest.raises(ValueError, match="divisible by 32"):
        mxfp8_ops.quantize(mx.zeros((2, 48)))


def test_e4m3_codec_against_torch():
    """Decode: all 256 codes. Encode: a dense sweep of [-448, 448], every code and every midpoint (ties)."""
    codes = torch.arange(256, dtype=torch.uint8)
    ref = codes.view(torch.float8_e4m3fn).float()
    ours = to_torch(mxfp8_ops.e4m3_decode(from_torch(codes)))
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours[~ref.isnan()], ref[~ref.isnan()])
    finite = ref[~ref.isnan()].sort().values
    x = torch.cat([torch.linspace(-448, 448, 400_001), (torch.rand(200_000) * 2 - 1) * 2.0 ** -5, finite,
                   (finite[:-1] + finite[1:]) / 2, torch.tensor([-0.0, 0.0])])
    encoded = to_torch(mxfp8_ops.e4m3_encode(from_torch(x)))
    assert torch.equal(encoded, x.to(torch.float8_e4m3fn).view(torch.uint8))
