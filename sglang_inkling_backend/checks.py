"""Argument checks shared by the core: each raises a ValueError or TypeError naming the argument, the value and
what was expected, and none writes anything (callers run every check before their first write).

``bool`` is refused wherever an int or a float is expected (``True`` is an ``int`` to Python, never a head count).
"""

from __future__ import annotations

import math
import numbers
import weakref
from typing import Callable, Optional

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
PADDING_SLOT = 0  # the pool's padding sink (as in SGLang): written by padded batches, never read


class UnsupportedFeature(ValueError, NotImplementedError):
    """A refusal of a feature or mode this backend does not implement (a layer's logit cap, a forward mode, fused
    output quantization), naming it. A ValueError, as every refusal of a caller's input here is; also a
    NotImplementedError, the type SGLang's and vLLM's own backends raise for the same refusals, so a host that catches
    that type still does."""


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{value!r} ({type(value).__name__})"


def is_int(value) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value) -> bool:
    """An ``int`` or another integral number (a numpy integer), not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An ``int`` or a ``float``, not a ``bool`` (any value: NaN and infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def require_int(value, name: str, minimum: Optional[int] = None) -> int:
    """An int >= ``minimum``: TypeError for a non-int, ValueError for an int below ``minimum``."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def require_positive_int(value, name: str) -> int:
    return require_int(value, name, 1)


def require_int_value(value, name: str, expected: str = "a positive int", *, minimum: Optional[int] = 1,
                      maximum: Optional[int] = None, valid: Optional[Callable[[int], bool]] = None) -> int:
    """An int in ``[minimum, maximum]`` (a bound of None: none) for which ``valid`` holds, else one ValueError
    (a non-int included) "{name} must be {expected}, got {value!r}"."""
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum) \
            or (valid is not None and not valid(value)):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def require_bool(value, name: str, expected: str = "a bool") -> bool:
    """A ``bool`` (TypeError naming ``name`` and ``expected`` otherwise: 1 is not True here)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be {expected}, got {_describe(value)}")
    return value


# --- tensors and devices ----------------------------------------------------------------------------------------
# Every public entry that takes a tensor checks it here first (``require_tensor``): a list, a numpy array or None
# is a TypeError naming the argument (never an AttributeError from the first ``.shape``), and a tensor on the
# ``meta`` device (shapes, no data) a ValueError (never a NotImplementedError from the first read, nor a store
# that writes nothing: torch ignores a meta source in an indexed store). Every constructor that allocates on a
# device checks it here (``require_device``): its name parses, it is not ``meta``, and torch can reach it here.
# FakeTensors (torch.compile's tracing) report the device they stand for, so they pass.


_reachable_devices: set = set()  # devices found reachable: the launchers ask for theirs on every plan


def _unreachable(device: torch.device) -> str:
    """Why torch cannot hold data on ``device`` in this process, or "" when it can."""
    if device.type == "meta":
        return "the meta device holds shapes only, no data"
    if device.type == "cpu" or device in _reachable_devices:
        return ""
    why = _why_unreachable(device)
    if not why:
        _reachable_devices.add(device)
    return why


def _why_unreachable(device: torch.device) -> str:
    module = getattr(torch, device.type, None)  # torch.cuda (ROCm too), torch.mps, torch.xpu, ...
    available = getattr(module, "is_available", None)
    if callable(available):
        if not available():
            built = "" if device.type != "cuda" or torch.backends.cuda.is_built() else ", torch was built without it"
            return f"torch cannot reach a {device.type} device in this process (torch.{device.type}.is_available() " \
                   f"is False{built})"
        count = getattr(module, "device_count", None)
        if device.index is not None and callable(count) and device.index >= count():
            return f"this machine has {count()} {device.type} device(s), so indices 0 to {count() - 1}"
        return ""
    try:  # a backend without an availability query: try a tensor of no elements
        torch.empty(0, device=device)
    except Exception as err:  # torch raises RuntimeError, AssertionError, ... by backend
        return f"torch cannot make a tensor there ({type(err).__name__}: {err})"
    return ""


def require_device(device, name: str = "device") -> torch.device:
    """``device`` (a ``torch.device`` or its name) as a ``torch.device`` that can hold data here: not ``meta``, and
    one torch can reach in this process (``'cuda'`` on a machine without CUDA, ``'cuda:3'`` on one with two GPUs
    are refused). For constructors, before their first allocation."""
    if not (isinstance(device, (str, torch.device)) or is_int(device)):
        raise TypeError(f"{name} must be a torch.device or its name (e.g. 'cpu', 'cuda:0'), got {_describe(device)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a torch device or its name (e.g. 'cpu', 'cuda:0'), got {device!r}") \
            from err
    why = _unreachable(dev)
    if why:
        raise ValueError(f"{name} must be a device that can hold data here, got {dev}: {why}")
    return dev


def require_tensor(value, name: str, expected: str = "a torch.Tensor", *, show_value: bool = False) -> torch.Tensor:
    """``value`` itself, once it is a tensor that holds data: TypeError (naming ``name`` and ``expected``, and the
    type it got, with its value where ``show_value``) for anything else, ValueError for a tensor on the ``meta``
    device. No device read."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be {expected}, got {_describe(value) if show_value else type(value).__name__}")
    if value.device.type == "meta":
        raise ValueError(f"{name} must be {expected} holding data, got a tensor on the meta device (shape "
                         f"{tuple(value.shape)}, no data to read or store)")
    return value


def require_pin_memory(value, name: str = "pin_memory") -> bool:
    """A bool; True only where torch has a pinned-memory allocator (an accelerator it can reach)."""
    require_bool(value, name)
    accelerator = getattr(torch, "accelerator", None)
    reachable = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if value and not reachable:
        raise ValueError(f"{name}=True needs an accelerator torch can reach (pinned host memory is an accelerator's "
                         f"allocation); none is available in this process: pass {name}=False")
    return value


def require_extents(t: torch.Tensor, name: str, labels) -> None:
    """Each dimension of ``t`` that ``labels`` names (None: any size, 0 included) must be >= 1: an extent of 0
    (no heads, no channels, a relative bias reaching no distance) is refused by name before anything indexes it."""
    for dim, label in enumerate(labels):
        if label is not None and t.shape[dim] < 1:
            raise ValueError(f"{name}'s {label} (dim {dim}) must be >= 1, got shape {tuple(t.shape)}")


def require_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str, why: str = "") -> None:
    """Two tensors read together (K and V, their scale buffers) must have one shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{a_name} and {b_name} must have the same shape{why}, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")


def require_entries(t, name: str, count: int, counted: str, *, at_least: bool = False) -> None:
    """A per-request array (a tensor's first dimension, or a sequence's length) must hold ``count`` entries, one
    per ``counted`` (``at_least``: ``count`` or more, a host's padded buffer), checked where the count and the
    array meet, before anything indexes one by the other."""
    n = t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else len(t)
    if n < count or (n != count and not at_least):
        shape = f" (shape {tuple(t.shape)})" if isinstance(t, torch.Tensor) else ""
        raise ValueError(f"{name} must be {'at least ' if at_least else ''}{count} entries long, one per {counted}, "
                         f"got {n}{shape}")


FLOAT32_MAX = 3.4028234663852886e38  # the kernels compute in float32: a larger "finite" value is an inf there
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal: a positive scale below it is 0 or subnormal there


def require_real(value, name: str, expected: str = "a finite number") -> float:
    """A number finite in float32 (a Python int or float, not bool, or a one-element floating tensor), as a float."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = float(value.item())
    if not is_number(value):
        raise TypeError(f"{name} must be {expected}, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {expected}, got {value}")
    if abs(value) > FLOAT32_MAX:
        raise ValueError(f"{name} must be {expected} in float32 (|x| <= {FLOAT32_MAX:.4g}), got {value}")
    return value


def require_positive_real(value, name: str) -> float:
    """A number > 0 that stays > 0 in float32 (the kernels take scales as float32: 1e-50 would be 0 there)."""
    value = require_real(value, name, "a finite number > 0")
    if value < FLOAT32_TINY:
        why = "" if value <= 0 else f" (below float32's smallest normal, {FLOAT32_TINY:.4g}: 0 or subnormal there)"
        raise ValueError(f"{name} must be a finite number > 0, got {value}{why}")
    return value


LOG2E = 1.4426950408889634


def require_softmax_scale(value, name: str) -> float:
    """A softmax scale: a number > 0 that stays finite as the kernels apply it (times log2(e): base-2 logits)."""
    value = require_positive_real(value, name)
    if value * LOG2E > FLOAT32_MAX:
        raise ValueError(f"{name} {value:g} overflows float32 as the kernels apply it (times log2(e), base-2 "
                         f"logits): at most {FLOAT32_MAX / LOG2E:.4g}")
    return value


def require_non_negative_real(value, name: str) -> float:
    value = require_real(value, name, "a finite number >= 0")
    if value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def require_slots(slots, name: str, num_slots: int, distinct: bool = False, where: str = "",
                  padding_slots: int = 1) -> torch.Tensor:
    """A 1-D int32/int64 tensor of slot ids in ``[0, num_slots)``, as int64. ``distinct``: no slot twice, except
    the padding sink, slots ``[0, padding_slots)`` (slot 0; vLLM's null block is a whole block), which are never
    read (one write must not store two values in one slot: which one lands would depend on the device). One device
    read for the range and the duplicates together (a device tensor's every read waits for the GPU)."""
    require_tensor(slots, name, "a 1-D int32/int64 tensor of slot ids", show_value=True)
    if slots.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64 slot ids, got {slots.dtype}")
    if slots.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(slots.shape)}")
    if not slots.numel():
        return slots.long()
    wide = slots.long()
    stats = [wide.min(), wide.max()]
    if distinct:
        # padding slots become distinct negative keys, so a sort puts any repeated real slot side by side
        sink = wide < PADDING_SLOT + padding_slots
        keyed = torch.where(sink, -1 - torch.arange(wide.numel(), device=wide.device), wide)
        ordered = torch.sort(keyed).values
        stats.append((ordered[1:] == ordered[:-1]).sum())
    lo, hi, *repeats = torch.stack(stats).tolist()
    if lo < 0 or hi >= num_slots:
        raise ValueError(f"{name} must be slots in [0, {num_slots}){where}, got [{lo}, {hi}]")
    if repeats and repeats[0]:
        values, counts = torch.unique(wide[~sink], return_counts=True)
        sink_name = "slot 0" if padding_slots == 1 else f"slots 0-{padding_slots - 1}"
        raise ValueError(f"{name} must not name a slot twice in one write ({sink_name}, the padding sink, "
                         f"excepted), got slot {int(values[counts > 1][0])} {int(counts.max())} times")
    return wide


_checked_slots: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, pointer, shape, check) of slots found valid


def require_slots_once(slots, name: str, num_slots: int, distinct: bool = False, where: str = "",
                       padding_slots: int = 1) -> torch.Tensor:
    """``require_slots``, reading the device only the first time this tensor, at this version, is checked against
    the same bounds: every layer of a step writes the step's one ``out_cache_loc``, which needs one read, not one
    per layer (each read is a device sync the GPU waits at). A write that bypasses torch's version counter
    (a kernel storing through the tensor's pointer) is not seen: SGLang builds a new ``out_cache_loc`` per eager
    batch, and its graph buffers are stored through unchecked (``kv_views.store_kv_unchecked``)."""
    if not isinstance(slots, torch.Tensor) or slots.dtype not in INDEX_DTYPES or slots.dim() != 1 \
            or slots.device.type == "meta":
        return require_slots(slots, name, num_slots, distinct, where, padding_slots)  # its TypeError/ValueError
    # A view is remembered by the tensor it views (SGLang's breakable prefill graph hands each layer a new view
    # out_cache_loc[:n] of one buffer): the same range of the same base, at the same version (views share their
    # base's version counter), is the same values.
    anchor = slots._base if slots._base is not None else slots
    key = (slots._version, slots.data_ptr(), tuple(slots.shape), tuple(slots.stride()), num_slots, distinct,
           padding_slots)
    seen = _checked_slots.get(id(anchor))
    if seen is not None and seen[0]() is anchor and seen[1:] == key:
        return slots.long()
    checked = require_slots(slots, name, num_slots, distinct, where, padding_slots)
    if len(_checked_slots) > 4096:  # ids of collected tensors are reused: forget them now and then
        for k in [k for k, v in _checked_slots.items() if v[0]() is None]:
            del _checked_slots[k]
    _checked_slots[id(anchor)] = (weakref.ref(anchor), *key)
    return checked


def stream_capturing(device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph (never on other devices)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_checked_finite: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, pointer, shape) of tensors found finite


def require_finite_once(t: torch.Tensor, name: str) -> None:
    """Refuse a tensor holding a NaN or an infinity, reading it (one sync) the first time this tensor, at this
    version, is seen; for weights (``sinks``) that a layer passes on every call. Skipped while a CUDA graph is
    being captured (nothing can be read back). A change that bypasses torch's version counter (``param.data.copy_``)
    is not seen again."""
    if stream_capturing(t.device):
        return
    key = (t._version, t.data_ptr(), tuple(t.shape))
    seen = _checked_finite.get(id(t))
    if seen is not None and seen[0]() is t and seen[1:] == key:
        return
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite (a NaN or an infinity makes every output it touches NaN), got "
                         f"{int((~torch.isfinite(t)).sum())} non-finite of {t.numel()}")
    if len(_checked_finite) > 4096:  # ids of collected tensors are reused: forget them now and then
        for k in [k for k, v in _checked_finite.items() if v[0]() is None]:
            del _checked_finite[k]
    _checked_finite[id(t)] = (weakref.ref(t), *key)


def triton_head_dim_ok(head_dim: int) -> bool:
    """The head sizes the Triton kernels serve: a power of two (their tiles are) of at least 32 (one MXFP8 scale
    block). The route policy (``routes``) and the kernels' own checks (``triton/inputs.py``, ``triton/kv_store.py``)
    read it here."""
    return head_dim >= 32 and head_dim & (head_dim - 1) == 0
