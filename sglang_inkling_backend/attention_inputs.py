"""What every attention implementation reads, defined once: one layer's K/V pool buffers as kernel input
(``PagedKV``), the layer's attention parameters (``AttentionParams``) and a speculative verify step's draft trees
(``SpecVerify``, the same for every layer of the step). The reference (``reference/``), the Triton
kernels, the MLX path and the hosts import them from here; the definitions of what the parameters mean are the
reference's docstring (``reference/attention.py``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import kv_formats, mxfp8
from .checks import (INDEX_DTYPES, _describe, require_device, require_extents, require_finite_once,
                     require_non_negative_real, require_positive_int, require_positive_real, require_same_shape,
                     require_slots, require_softmax_scale, require_tensor)
from .scale_layout import ScaleLayout

FLOAT_KV_DTYPES = tuple(kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE)  # bf16, fp16, fp32


@dataclass
class PagedKV:
    """One layer's K/V pool buffers ``[slots, Hkv, D]``: bf16/fp16/fp32; or float8_e4m3fn with a per-tensor
    ``k_scale``/``v_scale``; or MXFP8 (float8_e4m3fn plus ``k_scales``/``v_scales`` scale buffers in ``layout``)."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scales: Optional[torch.Tensor] = None
    v_scales: Optional[torch.Tensor] = None
    layout: Optional[ScaleLayout] = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self):
        for name in ("k_buffer", "v_buffer"):
            buf = require_tensor(getattr(self, name), name, "a 3-D tensor [slots, Hkv, D]")
            if buf.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor [slots, Hkv, D], got {tuple(buf.shape)}")
            require_extents(buf, name, ("slots", "Hkv (KV heads)", "D (head_dim)"))
        # every reader takes V's rows, heads and channels as K's (no route serves a V head_dim other than K's)
        require_same_shape(self.k_buffer, "k_buffer", self.v_buffer, "v_buffer", " [slots, Hkv, D]")
        if self.k_buffer.dtype != self.v_buffer.dtype:
            raise TypeError(f"k_buffer and v_buffer must share a dtype, got {self.k_buffer.dtype} and "
                            f"{self.v_buffer.dtype}")
        if self.k_buffer.dtype not in FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,):
            raise TypeError(f"k_buffer must be one of {FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,)}, got {self.k_buffer.dtype}")
        for name in ("k_scale", "v_scale"):  # host numbers: checking them reads nothing from the device
            value = getattr(self, name)
            if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()):
                setattr(self, name, require_positive_real(value, name))
        has_scales = self.k_scales is not None or self.v_scales is not None
        if has_scales:
            if self.k_scales is None or self.v_scales is None or self.layout is None:
                raise ValueError("an MXFP8 PagedKV needs k_scales, v_scales and their layout")
            if not isinstance(self.layout, ScaleLayout):
                raise TypeError(f"layout must be a ScaleLayout (ScaleLayout.for_pool), got {_describe(self.layout)}")
            if self.k_buffer.dtype != mxfp8.DATA_DTYPE:
                raise TypeError(f"MXFP8 scale buffers need float8_e4m3fn data, got {self.k_buffer.dtype}")
            expected = (self.layout.num_slots, self.layout.num_kv_heads, self.layout.head_dim)
            if tuple(self.k_buffer.shape) != expected:
                raise ValueError(f"k_buffer must have shape {expected} to match its scale layout, "
                                 f"got {tuple(self.k_buffer.shape)}")
            self.layout.check_buffer(self.k_scales, "k_scales")
            self.layout.check_buffer(self.v_scales, "v_scales")

    @property
    def is_mxfp8(self) -> bool:
        return self.k_scales is not None

    @property
    def kv_format(self) -> kv_formats.KVFormat:
        """The pool's KV format: MXFP8 where it has scale buffers, else the unquantized format of its dtype, else
        (e4m3 bytes without scale buffers) per-tensor fp8."""
        if self.is_mxfp8:
            return kv_formats.KVFormat.MXFP8
        return kv_formats.UNQUANTIZED_FORMAT_OF_DTYPE.get(self.k_buffer.dtype, kv_formats.KVFormat.FP8_E4M3)

    @property
    def num_slots(self) -> int:
        return self.k_buffer.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k_buffer.shape[1]

    @property
    def head_dim(self) -> int:
        return self.k_buffer.shape[2]

    def read(self, slots: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized float32 ``(k, v)`` of ``slots`` (1-D int32/int64 in ``[0, num_slots)``): ``[N, Hkv, D]``
        each. ``check=False`` skips the slot checks (the caller has made them)."""
        slots = require_slots(slots, "slots", self.num_slots) if check else slots.long()
        k, v = self.k_buffer[slots], self.v_buffer[slots]
        if self.is_mxfp8:
            return (mxfp8.dequantize(k, self.layout.gather(self.k_scales, slots), torch.float32),
                    mxfp8.dequantize(v, self.layout.gather(self.v_scales, slots), torch.float32))
        if k.dtype == mxfp8.DATA_DTYPE:
            return k.float() * self.k_scale, v.float() * self.v_scale
        return k.float(), v.float()


@dataclass
class AttentionParams:
    softmax_scale: float
    window: Optional[int] = None  # keys at distance 0 .. window-1; None: all earlier keys
    rel_bias: Optional[torch.Tensor] = None  # [query rows, Hq, rel_extent]
    logit_cap: float = 0.0
    sinks: Optional[torch.Tensor] = None  # [Hq], one extra logit per head in the softmax denominator

    def __post_init__(self):
        self.softmax_scale = require_softmax_scale(self.softmax_scale, "softmax_scale")
        if self.window is not None:
            require_positive_int(self.window, "window")
        self.logit_cap = require_non_negative_real(self.logit_cap, "logit_cap")  # 0 disables it
        for name in ("rel_bias", "sinks"):
            t = getattr(self, name)
            if t is not None and not require_tensor(t, name, "None or a floating-point tensor").is_floating_point():
                raise TypeError(f"{name} must be None or a floating-point tensor, got {t.dtype}")
        if self.rel_bias is not None:
            check_rel_bias(self.rel_bias)
        if self.sinks is not None and self.sinks.dim() != 1:
            raise ValueError(f"sinks must be 1-D [Hq] (one per query head), got shape {tuple(self.sinks.shape)}")
        # sinks are weights: read once per tensor and version. rel_bias is an activation, like q, k and v: never read
        # back (a NaN there propagates to its rows' outputs, as in every attention kernel)
        if self.sinks is not None:
            require_finite_once(self.sinks, "sinks")


def check_rel_bias(rel_bias: torch.Tensor, rows: Optional[int] = None, num_q_heads: Optional[int] = None,
                   name: str = "rel_bias") -> None:
    """A relative bias ``[query rows, Hq, rel_extent]`` with ``rel_extent >= 1`` (the bias of distances
    ``0 .. rel_extent - 1``; a model without one passes None), and, where given, the query's rows and heads. Every
    consumer reads it through here: ``AttentionParams`` at construction, the reference and the Triton launchers
    again per call (a dataclass's field can be replaced after construction)."""
    if rel_bias.dim() != 3:
        raise ValueError(f"{name} must be 3-D [query rows, Hq, rel_extent], got shape {tuple(rel_bias.shape)}")
    if rows is not None and tuple(rel_bias.shape[:2]) != (rows, num_q_heads):
        raise ValueError(f"{name} must have shape [{rows}, {num_q_heads}, rel_extent], got {tuple(rel_bias.shape)}")
    require_extents(rel_bias, name, (None, None, "rel_extent (the distances it biases)"))


def inkling_params(head_dim: int, rel_bias: Optional[torch.Tensor], window: Optional[int] = None) -> AttentionParams:
    """Inkling mode: softmax scale 1/D (not 1/sqrt(D)), relative bias, optional local window."""
    return AttentionParams(softmax_scale=1.0 / head_dim, window=window, rel_bias=rel_bias)



@dataclass(frozen=True, eq=False)
class SpecVerify:
    """A speculative verify step: the extend's request ``b`` has ``D_b`` draft tokens, which are its ``D_b`` query
    rows and the last ``D_b`` keys of its rail (their K/V stored like any extend's); the ``P_b`` keys before them
    are its cached prefix.

    - ``tree_mask`` (bool, 1-D ``[sum_b D_b * D_b]``): request b's ``[D_b, D_b]`` mask, row-major, at
      ``tree_mask[mask_indptr[b]:mask_indptr[b + 1]]``; draft i sees draft j where ``mask[i, j]`` (its ancestors
      and itself). Every draft sees every prefix key (subject to the window).
    - ``mask_indptr`` (int32/int64 ``[B + 1]``): from 0, non-decreasing, each request's entries a square ``D_b**2``.
    - ``depths`` (int32/int64 ``[sum_b D_b]``, request by request): draft i's depth in its tree, 0 for the first
      draft (the child of the last accepted token). Draft i's position is ``P_b + depth_i`` (SGLang's verify
      positions, ``seq_len + depth``): as a query and as a key, so distances (window, relative bias) are
      ``depth_i - depth_j`` between drafts and ``P_b + depth_i - j`` to prefix key j.

    A chain (lower-triangular mask, depths ``0..D_b-1``) is a plain extend of the same tokens. Everything is
    checked here, once per step (the values are read back to the host): a diagonal of True (a token sees itself),
    depths >= 0, and ``depth_j < depth_i`` for every masked-in ``j != i`` (a visible draft is strictly earlier).
    ``check_queries`` checks each ``D_b`` against an extend's query offsets.

    ``uniform`` builds one without reading anything (every request ``D`` drafts; a CUDA graph's buffers, whose values
    are written on the device before each replay): only shapes, dtypes and devices are checked."""

    tree_mask: torch.Tensor
    mask_indptr: torch.Tensor
    depths: torch.Tensor
    draft_lens: tuple = field(init=False, repr=False)  # D_b per request, host ints
    uniform_len: int = field(default=0, init=False, repr=False)  # D where built by ``uniform``, else 0

    def __post_init__(self):
        mask, indptr, depths = self.tree_mask, self.mask_indptr, self.depths
        for name, t, what in (("tree_mask", mask, "a bool tensor"), ("mask_indptr", indptr, "an int32/int64 tensor"),
                              ("depths", depths, "an int32/int64 tensor")):
            require_tensor(t, name, what)
        if mask.dtype != torch.bool:
            raise TypeError(f"tree_mask must be a bool tensor, got {_describe(mask)}")
        if mask.dim() != 1:
            raise ValueError(f"tree_mask must be 1-D (each request's [D, D] mask flattened, request after request), "
                             f"got shape {tuple(mask.shape)}")
        if not isinstance(indptr, torch.Tensor) or indptr.dtype not in INDEX_DTYPES:
            raise TypeError(f"mask_indptr must be an int32/int64 tensor, got {_describe(indptr)}")
        if indptr.dim() != 1 or indptr.numel() < 2:
            raise ValueError(f"mask_indptr must be 1-D with batch + 1 >= 2 entries, got shape {tuple(indptr.shape)}")
        starts = indptr.tolist()
        if starts[0] != 0 or any(a > b for a, b in zip(starts, starts[1:])) or starts[-1] != mask.numel():
            raise ValueError(f"mask_indptr must start at 0, be non-decreasing and end at tree_mask's {mask.numel()} "
                             f"entries, got {starts if len(starts) <= 8 else starts[:4] + ['...'] + starts[-2:]}")
        lens = []
        for b, (a, e) in enumerate(zip(starts, starts[1:])):
            n = math.isqrt(e - a)
            if n * n != e - a:
                raise ValueError(f"mask_indptr: request {b}'s mask has {e - a} entries, not a square D * D")
            lens.append(n)
        if not isinstance(depths, torch.Tensor) or depths.dtype not in INDEX_DTYPES:
            raise TypeError(f"depths must be an int32/int64 tensor, got {_describe(depths)}")
        if depths.dim() != 1 or depths.numel() != sum(lens):
            raise ValueError(f"depths must be 1-D with one entry per draft token, {sum(lens)} (from mask_indptr), "
                             f"got shape {tuple(depths.shape)}")
        host_mask, host_depths = mask.cpu(), depths.cpu().long()
        if host_depths.numel() and int(host_depths.min()) < 0:
            raise ValueError(f"depths must be >= 0, got {int(host_depths.min())}")
        first = 0
        for b, n in enumerate(lens):
            m = host_mask[starts[b]:starts[b + 1]].view(n, n)
            d = host_depths[first:first + n]
            first += n
            if not bool(m.diagonal().all()):
                i = int((~m.diagonal()).nonzero()[0])
                raise ValueError(f"tree_mask: request {b}'s draft {i} does not see itself (the diagonal must be True)")
            later = m & ~torch.eye(n, dtype=torch.bool) & (d.view(1, n) >= d.view(n, 1))
            if bool(later.any()):
                i, j = (int(x) for x in later.nonzero()[0])
                raise ValueError(f"tree_mask: request {b}'s draft {i} (depth {int(d[i])}) sees draft {j} (depth "
                                 f"{int(d[j])}); a visible draft must be strictly shallower (depths)")
        object.__setattr__(self, "draft_lens", tuple(lens))

    @classmethod
    def uniform(cls, tree_mask: torch.Tensor, mask_indptr: torch.Tensor, depths: torch.Tensor, draft_len: int,
                batch: int) -> "SpecVerify":
        """``batch`` requests of ``draft_len`` drafts each, their values not read (unchecked: the caller writes
        them, e.g. on the device before a CUDA-graph replay): ``tree_mask`` bool ``[batch * D * D]``,
        ``mask_indptr`` int64 ``[batch + 1]`` (``arange * D * D``), ``depths`` int64 ``[batch * D]``, all on one
        device. Their shapes, dtypes and devices are checked."""
        d, b = require_positive_int(draft_len, "draft_len"), require_positive_int(batch, "batch")
        want = (("tree_mask", tree_mask, torch.bool, b * d * d), ("mask_indptr", mask_indptr, torch.int64, b + 1),
                ("depths", depths, torch.int64, b * d))
        for name, t, dtype, n in want:
            if require_tensor(t, name, f"a {dtype} tensor").dtype != dtype:
                raise TypeError(f"{name} must be a {dtype} tensor, got {_describe(t)}")
            if t.dim() != 1 or t.numel() != n:
                raise ValueError(f"{name} must be 1-D with {n} entries ({b} requests of {d} drafts), got shape "
                                 f"{tuple(t.shape)}")
            if t.device != tree_mask.device:
                raise ValueError(f"{name} must be on {tree_mask.device} (tree_mask's device), got {t.device}")
        out = object.__new__(cls)
        for name, value in (("tree_mask", tree_mask), ("mask_indptr", mask_indptr), ("depths", depths),
                            ("draft_lens", (d,) * b), ("uniform_len", d)):
            object.__setattr__(out, name, value)
        return out

    @property
    def num_requests(self) -> int:
        return len(self.draft_lens)

    @classmethod
    def from_trees(cls, trees, device=None) -> "SpecVerify":
        """From each request's ``(mask [D_b, D_b] bool, depths [D_b])``, in request order (checked as always)."""
        trees = list(trees)
        if not trees:
            raise ValueError("from_trees needs at least one request's tree")
        if device is not None:
            device = require_device(device)
        masks, depths = zip(*trees)
        counts = torch.tensor([0] + [m.numel() for m in masks]).cumsum(0)
        parts = (torch.cat([m.reshape(-1) for m in masks]), counts, torch.cat(depths))
        return cls(*(t if device is None else t.to(device) for t in parts))

    def check_queries(self, qo_indptr: torch.Tensor) -> None:
        """ValueError unless the extend has one request per tree and request b ``D_b`` query rows. A ``uniform``
        verify checks the request count only (its offsets are ``arange * D`` by construction; nothing is read)."""
        require_tensor(qo_indptr, "qo_indptr", "a 1-D int32/int64 tensor of query offsets")
        if self.uniform_len:
            if qo_indptr.numel() != self.num_requests + 1:
                raise ValueError(f"verify has {self.num_requests} requests; qo_indptr must have "
                                 f"{self.num_requests + 1} entries, got {_describe(qo_indptr)}")
            return
        qlens = qo_indptr.diff().tolist()
        if len(qlens) != self.num_requests:
            raise ValueError(f"verify has {self.num_requests} requests (mask_indptr), the extend "
                             f"{len(qlens)} (qo_indptr)")
        wrong = [b for b, (n, d) in enumerate(zip(qlens, self.draft_lens)) if n != d]
        if wrong:
            b = wrong[0]
            raise ValueError(f"verify: request {b} has {self.draft_lens[b]} draft tokens (mask_indptr) but "
                             f"{qlens[b]} query rows (qo_indptr); each draft token is one query")

    def request(self, b: int, device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Request b's tree: its mask ``[D_b, D_b]`` bool and depths ``[D_b]`` int64, on ``device``."""
        n, first = self.draft_lens[b], sum(self.draft_lens[:b])
        start = sum(m * m for m in self.draft_lens[:b])  # mask_indptr[b], as checked: no device read
        mask = self.tree_mask[start:start + n * n].view(n, n)
        return mask.to(device=device), self.depths[first:first + n].to(device=device, dtype=torch.int64)

