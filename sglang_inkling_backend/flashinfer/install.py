"""Whether FlashInfer can serve on a device, and what its families share: the version floor, the kernel settings
(``INKLING_EXTEND_KERNEL``, ``INKLING_DECODE_KERNEL``), the float workspace, the head sizes and query dtypes."""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

from .. import settings
from ..settings import KERNEL_CHOICES  # noqa: F401  (the families' choices)

MIN_FLASHINFER = (0, 5)  # the wrappers' plan/run keywords used here are those of 0.5 and 0.7
FLOAT_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace, one per route, shared by its wrappers
HEAD_DIMS = (64, 128, 256)
QUERY_DTYPES = (torch.bfloat16, torch.float16)

logger = logging.getLogger(__name__)
_PLANNED_SHAPES: set = set()  # (family, shape) pairs whose first plan this process has run


def version_tuple(text: str) -> tuple:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def kernel_setting(env: str) -> str:
    """The setting ``env`` (auto when unset); a ValueError naming the variable for anything but ``KERNEL_CHOICES``."""
    return settings.kernel_family(env)


def load_flashinfer(device: torch.device, wrapper: Optional[str] = None):
    """``(flashinfer module, "")`` or ``(None, why)``, for a family that needs FlashInfer's class ``wrapper``. The
    GPU's capability is the route's check (``routes.choose_route`` serves a GPU before sm_80 with the torch route,
    before it asks for a family)."""
    if device.type != "cuda" or torch.version.hip is not None or not torch.cuda.is_available():
        return None, f"FlashInfer runs on NVIDIA GPUs only (device {device})"
    try:
        import flashinfer
    except Exception as err:  # a missing or broken third-party install: the Triton kernels serve instead
        return None, f"FlashInfer is not importable ({type(err).__name__}: {err})"
    version = getattr(flashinfer, "__version__", "0.0")
    if version_tuple(version) < MIN_FLASHINFER:
        return None, f"FlashInfer {version} is older than {'.'.join(map(str, MIN_FLASHINFER))}"
    if wrapper is not None and not hasattr(flashinfer, wrapper):
        return None, f"FlashInfer {version} has no {wrapper}"
    return flashinfer, ""


def find_flashinfer(env: str, wrapper: str, device: torch.device):
    """``(flashinfer module, "")`` where the family set by ``env`` (auto, triton, flashinfer) may run FlashInfer's
    class ``wrapper`` on ``device``, else ``(None, why)``; ``env=flashinfer`` raises (ValueError) when it cannot."""
    setting = kernel_setting(env)
    if setting == "triton":
        return None, f"{env}=triton"
    flashinfer, why = load_flashinfer(device, wrapper)
    if flashinfer is None and setting == "flashinfer":
        raise ValueError(f"{env}=flashinfer, but {why}")
    return flashinfer, why


def float_workspace(device: torch.device) -> torch.Tensor:
    """The float workspace the route's FlashInfer wrappers share: their kernels run one after another on one
    stream (SGLang's flashinfer backend shares one the same way)."""
    return torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def plan_logging_first(family: str, shape: tuple, plan: Callable[[], None]) -> None:
    """``plan()``, with an INFO line before and after the first one of ``(family, shape)`` in this process: FlashInfer
    loads a shape's kernel module at its first plan, and JIT-builds it there where its cache lacks it, inside the
    step that asked; the lines say why that step took so long."""
    if (family, shape) in _PLANNED_SHAPES:
        plan()
        return
    logger.info("inkling: FlashInfer %s, first plan of %s: loading its kernel module (a JIT build where FlashInfer's "
                "cache lacks it)", family, shape)
    start = time.perf_counter()
    plan()
    _PLANNED_SHAPES.add((family, shape))
    logger.info("inkling: FlashInfer %s, %s ready in %.1f s", family, shape, time.perf_counter() - start)
