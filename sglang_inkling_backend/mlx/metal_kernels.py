"""The Inkling Metal kernels: their specs, their launch descriptions, and the ``mx.fast.metal_kernel`` runner.

A kernel is described twice over and nowhere else: ``MetalKernelSpec`` (name, the body and header
sources under ``metal/``, input and output names) and ``MetalLaunch`` (the arrays, output shapes and
dtypes, grid, threadgroup, template arguments of one call). ``run_metal`` hands both to MLX on Apple
silicon; ``tools/check_metal_on_cpu`` hands the same two objects to g++ on Linux, so the launch
arithmetic is exercised along with the kernel source.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

logger = logging.getLogger(__name__)

METAL_SOURCE_DIR = Path(__file__).resolve().parent / "metal"
IMPLEMENTATIONS = ("auto", "metal", "mlx_ops")


@dataclass(frozen=True)
class MetalKernelSpec:
    name: str
    body_file: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    header_files: tuple[str, ...] = ("inkling_common.metal",)

    def body_path(self) -> Path:
        return METAL_SOURCE_DIR / self.body_file

    def header_paths(self) -> list[Path]:
        return [METAL_SOURCE_DIR / name for name in self.header_files]

    def body_source(self) -> str:
        return self.body_path().read_text()

    def header_source(self) -> str:
        return "\n".join(path.read_text() for path in self.header_paths())


@dataclass
class MetalLaunch:
    inputs: list[mx.array]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[Any]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    template: list[tuple[str, Any]] = field(default_factory=list)

    def kwargs(self) -> dict[str, Any]:
        return dict(
            inputs=self.inputs,
            output_shapes=self.output_shapes,
            output_dtypes=self.output_dtypes,
            grid=self.grid,
            threadgroup=self.threadgroup,
            template=self.template,
        )


ROPE_QK = MetalKernelSpec(
    name="inkling_rope_qk",
    body_file="rope_qk.metal",
    input_names=("q", "k", "positions", "inv_freq"),
    output_names=("q_rot", "k_rot"),
)
ROPE_QK_MXFP8 = MetalKernelSpec(
    name="inkling_rope_qk_mxfp8",
    body_file="rope_qk_mxfp8.metal",
    input_names=("q", "k", "v", "positions", "inv_freq"),
    output_names=("q_rot", "k_rot", "k_data", "k_scales", "v_data", "v_scales"),
)
DECODE_MXFP8 = MetalKernelSpec(
    name="inkling_decode_mxfp8",
    body_file="decode_mxfp8.metal",
    input_names=(
        "q", "k_data", "k_scales", "v_data", "v_scales", "kv_indptr", "kv_indices", "params", "sinks",
        "rel_bias",
    ),
    output_names=("out",),
)


def threadgroup_for(grid: tuple[int, int, int], max_threads: int = 256) -> tuple[int, int, int]:
    """A threadgroup that fits the grid: up to 32 along x, then y, at most ``max_threads`` threads."""
    x = max(1, min(grid[0], 32))
    y = max(1, min(grid[1], max_threads // x))
    return (x, y, 1)


def metal_available() -> bool:
    return bool(mx.metal.is_available())


def require_metal(what: str) -> None:
    """Raise (and log) when the Metal back-end is missing, instead of degrading silently."""
    if metal_available():
        return
    message = (
        f"{what}: the Metal kernel needs Apple silicon with MLX's Metal back-end, and "
        "mx.metal.is_available() is False here (mx.fast.metal_kernel would raise 'No Metal back-end'). "
        "Pass implementation='mlx_ops' to run the MLX-ops twin, or run on a Mac."
    )
    logger.error(message)
    raise RuntimeError(message)


def resolve_implementation(implementation: str, what: str) -> str:
    """'auto' -> 'metal' on Apple silicon, else 'mlx_ops' with a log line saying why."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "metal":
        require_metal(what)
        return "metal"
    if implementation == "auto":
        if metal_available():
            return "metal"
        _log_twin_fallback(what)
    return "mlx_ops"


@functools.lru_cache(maxsize=None)
def _log_twin_fallback(what: str) -> None:
    logger.warning(
        "%s: no Metal back-end on this machine (mx.metal.is_available() is False); "
        "running the MLX-ops twin instead of the Metal kernel", what
    )


@functools.lru_cache(maxsize=None)
def _compiled(spec: MetalKernelSpec):
    return mx.fast.metal_kernel(
        name=spec.name,
        input_names=list(spec.input_names),
        output_names=list(spec.output_names),
        source=spec.body_source(),
        header=spec.header_source(),
    )


def run_metal(spec: MetalKernelSpec, launch: MetalLaunch) -> list[mx.array]:
    require_metal(spec.name)
    return _compiled(spec)(**launch.kwargs())
