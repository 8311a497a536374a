"""The paged KV pool with scale tiers: bf16 (fp16, fp32), per-tensor fp8 e4m3, and MXFP8.

Per attention layer: ``k``/``v`` data ``[size + page_size, Hkv, D]`` (slot 0 is the padding sink, as in SGLang) and,
in MXFP8 mode, zero-initialised scale buffers in the layout ``ScaleLayout`` gives. Full and windowed layers come
from the layer plan; windowed layers may live in a smaller sub-pool (``swa_size``), as SGLang's ``SWAKVPool`` does.
Accessors are named as SGLang's pools name them. Scales are a second tier of the pool: wherever a page goes (a
move, the host tier) its scale bytes go with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from . import kv_formats, kv_views, mxfp8
from .checks import (is_int, require_device, require_int_value, require_pin_memory, require_positive_int,
                     require_positive_real, require_slots, require_slots_once, require_tensor)
from .layer_plan import LayerPlan
from .attention_inputs import FLOAT_KV_DTYPES, PagedKV
from .scale_layout import ScaleLayout


def _layer_id(layer: Union[int, Any]) -> int:
    layer_id = layer if isinstance(layer, int) else getattr(layer, "layer_id", None)
    if not is_int(layer_id):
        raise TypeError(f"layer must be an int layer id or have an int .layer_id, got {type(layer).__name__}")
    return layer_id


@dataclass
class LayerKV:
    k: torch.Tensor
    v: torch.Tensor
    sfk: Optional[torch.Tensor] = None
    sfv: Optional[torch.Tensor] = None
    layout: Optional[ScaleLayout] = None

    @property
    def num_slots(self) -> int:
        return self.k.shape[0]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.sfk, self.sfv) if t is not None]


class InklingKVPool:
    def __init__(self, plan: LayerPlan, size: int, page_size: int,
                 kv_format: Union[kv_formats.KVFormat, str] = kv_formats.KVFormat.BF16,
                 device: Union[str, torch.device] = "cpu", swa_size: Optional[int] = None,
                 k_scale: float = 1.0, v_scale: float = 1.0):
        if not isinstance(plan, LayerPlan):
            raise TypeError(f"plan must be a LayerPlan, got {type(plan).__name__}")
        kv_format = kv_formats.as_kv_format(kv_format)
        require_positive_int(size, "size")
        require_positive_int(page_size, "page_size")
        if swa_size is not None:
            require_positive_int(swa_size, "swa_size")
        k_scale, v_scale = require_positive_real(k_scale, "k_scale"), require_positive_real(v_scale, "v_scale")
        if kv_format.block_scaled:
            if size % page_size or (swa_size or page_size) % page_size:
                raise ValueError(f"size and swa_size must be multiples of page_size={page_size} for mxfp8, "
                                 f"got size={size}, swa_size={swa_size}")
            for layer_id in plan.attention_layer_ids:
                mxfp8.require_head_dim(plan.spec(layer_id).head_dim, f"layer {layer_id}'s head_dim")
        self.plan, self.size, self.page_size, self.kv_format = plan, size, page_size, kv_format
        self.swa_size = swa_size if swa_size is not None else size
        self.device = require_device(device, "device")  # before the first allocation
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        self.store_dtype = kv_format.storage_dtype
        # A route's fused store (``fused_store(kv, loc, k, v, validate=False)``, e.g. the Triton ``store_kv``), given
        # by the host that serves this pool: MXFP8 and unquantized writes on its device go through it, one kernel for
        # K and V (MXFP8: the same bytes as the torch quantizer). None, and per-tensor fp8: torch.
        self.fused_store: Optional[Callable[..., None]] = None
        self.layers: dict[int, LayerKV] = {}
        for layer_id in plan.attention_layer_ids:
            spec = plan.spec(layer_id)
            slots = (self.size if spec.is_full else self.swa_size) + page_size
            shape = (slots, spec.num_kv_heads, spec.head_dim)
            k = torch.zeros(shape, dtype=self.store_dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.store_dtype, device=self.device)
            if kv_format.block_scaled:
                layout = ScaleLayout.for_pool(slots, spec.num_kv_heads, spec.head_dim, page_size)
                self.layers[layer_id] = LayerKV(k, v, layout.empty(self.device), layout.empty(self.device), layout)
            else:
                self.layers[layer_id] = LayerKV(k, v)

    # --- SGLang-named accessors ---------------------------------------------------------------------------------
    def _layer(self, layer: Union[int, Any]) -> LayerKV:
        layer_id = _layer_id(layer)
        if layer_id not in self.layers:
            raise ValueError(f"layer {layer_id} has no KV in this pool (attention layers: {sorted(self.layers)})")
        return self.layers[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id).k

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id).v

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self._layer(layer_id)
        return layer.k, layer.v

    def get_kv_scale_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """MXFP8 scale buffers ``(sfk, sfv)``, uint8 (view them as ``float8_e8m0fnu`` for SGLang's consumers)."""
        if not self.kv_format.block_scaled:
            raise ValueError(f"get_kv_scale_buffer needs kv_format='mxfp8', this pool is '{self.kv_format}'")
        layer = self._layer(layer_id)
        return layer.sfk, layer.sfv

    def scale_layout(self, layer_id: int) -> ScaleLayout:
        layout = self._layer(layer_id).layout
        if layout is None:
            raise ValueError(f"scale_layout needs kv_format='mxfp8', this pool is {self.kv_format!r}")
        return layout

    def paged_kv(self, layer_id: int) -> PagedKV:
        layer = self._layer(layer_id)
        return PagedKV(layer.k, layer.v, layer.sfk, layer.sfv, layer.layout, self.k_scale, self.v_scale)

    # --- writes -------------------------------------------------------------------------------------------------
    # Every write checks all its arguments (slots, shapes, dtypes, scales; for moves: every layer) before its first
    # store, so a refused call leaves every buffer byte-identical. Duplicate slots in one write are refused (slot 0,
    # the padding sink, excepted): which of two values lands in one slot would depend on the device.
    def _check_loc(self, loc, name: str, layer_id: Optional[int] = None, distinct: bool = True) -> torch.Tensor:
        if layer_id is None:  # a move touches every layer: the smallest sub-pool bounds the slots
            layer_id = min(self.layers, key=lambda i: self.layers[i].num_slots)
            where = f" (the smallest sub-pool: layer {layer_id})"
        else:
            where = f" for layer {layer_id}"
        # once per tensor: every layer of a step writes the same out_cache_loc
        return require_slots_once(loc, name, self.layers[layer_id].num_slots, distinct, where).to(self.device)

    def _check_values(self, layer: LayerKV, n: int, **values) -> None:
        hkv, d = layer.k.shape[1:]
        for name, t in values.items():
            require_tensor(t, name)
            if tuple(t.shape) not in ((n, hkv, d), (n, hkv * d)):
                raise ValueError(f"{name} must hold [{n}, Hkv={hkv}, D={d}] values (or [{n}, {hkv * d}]), "
                                 f"got shape {tuple(t.shape)}")

    def set_kv_buffer(self, layer: Union[int, Any], loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                      k_scale: Optional[float] = None, v_scale: Optional[float] = None, *, loc_name: str = "loc",
                      **_: Any) -> None:
        """Store ``cache_k``/``cache_v`` (``[N, Hkv, D]`` or ``[N, Hkv * D]``, float) at slots ``loc``,
        quantizing on the way in for fp8 and MXFP8 pools. ``k_scale``/``v_scale`` (fp8_e4m3 only; None: the
        pool's) must be finite and > 0; reads (``read_kv``, ``paged_kv``) dequantize with the pool's scales, so a
        per-call scale is for callers whose readers use the same one (SGLang passes the layer's). ``loc_name``: what
        a refusal of ``loc`` calls it (a host's name for its write slots)."""
        layer_id = _layer_id(layer)
        buf = self._layer(layer_id)
        loc = self._check_loc(loc, loc_name, layer_id)
        self._check_values(buf, loc.numel(), cache_k=cache_k, cache_v=cache_v)
        for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
            if t.dtype not in FLOAT_KV_DTYPES:  # float64 too: the kernels and the adapters take these three
                raise TypeError(f"{name} must be a bf16/fp16/fp32 tensor, got {t.dtype}")
        # named as the caller passed them (the store below checks the same, naming its own k and v)
        kv_views.refuse_views_of_pool(buf.tensors(), cache_k=cache_k, cache_v=cache_v)
        scales = {}
        for name, value, default in (("k_scale", k_scale, self.k_scale), ("v_scale", v_scale, self.v_scale)):
            scales[name] = default if value is None else require_positive_real(value, name)
        if not self.kv_format.tensor_scaled and any(value is not None and scales[name] != 1.0
                                               for name, value in (("k_scale", k_scale), ("v_scale", v_scale))):
            raise ValueError(f"k_scale/v_scale ({k_scale}, {v_scale}) apply to fp8_e4m3 pools only; this pool is "
                             f"'{self.kv_format}' (None or 1.0 expected)")
        shape = (loc.numel(), *buf.k.shape[1:])
        k, v = cache_k.reshape(shape).to(self.device), cache_v.reshape(shape).to(self.device)
        # the layer as a PagedKV with this call's per-tensor scales, stored as every other write is
        kv = PagedKV(buf.k, buf.v, buf.sfk, buf.sfv, buf.layout, scales["k_scale"], scales["v_scale"])
        kv_views.store_kv_unchecked(kv, loc, k, v, fused_store=self.fused_store)

    def set_mxfp8_kv_buffer(self, layer: Union[int, Any], loc: torch.Tensor, k_data: torch.Tensor,
                            k_scales: torch.Tensor, v_data: torch.Tensor, v_scales: torch.Tensor, *,
                            loc_name: str = "loc") -> None:
        """Store already-quantized MXFP8 K/V (what a fused prologue produces): data float8_e4m3fn (or its uint8
        bytes) ``[N, Hkv, D]`` or ``[N, Hkv * D]``, scales uint8 / float8_e8m0fnu ``[N, Hkv, D // 32]`` or
        ``[N, Hkv * D // 32]``."""
        layer_id = _layer_id(layer)
        buf = self._layer(layer_id)
        if not self.kv_format.block_scaled:
            raise ValueError(f"set_mxfp8_kv_buffer needs kv_format='mxfp8', this pool is '{self.kv_format}'")
        loc = self._check_loc(loc, loc_name, layer_id)
        n, hkv = loc.numel(), buf.k.shape[1]
        nb = buf.layout.blocks_per_head
        self._check_values(buf, n, k_data=k_data, v_data=v_data)
        for name, t in (("k_data", k_data), ("v_data", v_data)):
            if t.dtype not in (mxfp8.DATA_DTYPE, torch.uint8):
                raise TypeError(f"{name} must be float8_e4m3fn (or its uint8 bytes), got {t.dtype}")
        for name, t in (("k_scales", k_scales), ("v_scales", v_scales)):
            require_tensor(t, name, "a uint8 / float8_e8m0fnu tensor of UE8M0 bytes")
            if t.dtype not in mxfp8.SCALE_DTYPES:
                raise TypeError(f"{name} must be uint8 or float8_e8m0fnu (UE8M0 bytes), got {t.dtype}")
            if tuple(t.shape) not in ((n, hkv, nb), (n, hkv * nb)):
                raise ValueError(f"{name} must have shape [{n}, {hkv}, {nb}] (or [{n}, {hkv * nb}]), "
                                 f"got {tuple(t.shape)}")
        kv_views.refuse_views_of_pool((buf.k, buf.v, buf.sfk, buf.sfv), k_data=k_data, v_data=v_data,
                                      k_scales=k_scales, v_scales=v_scales)
        shape = (n, hkv, buf.k.shape[2])
        buf.k[loc] = k_data.view(mxfp8.DATA_DTYPE).reshape(shape).to(self.device)
        buf.v[loc] = v_data.view(mxfp8.DATA_DTYPE).reshape(shape).to(self.device)
        buf.layout.scatter(buf.sfk, loc, k_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)
        buf.layout.scatter(buf.sfv, loc, v_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy every layer's K/V (and scale bytes) from ``src_loc`` to ``tgt_loc`` (distinct targets; a source
        may be copied to several). Both are checked against every layer before the first layer is written."""
        tgt = self._check_loc(tgt_loc, "tgt_loc")
        src = self._check_loc(src_loc, "src_loc", distinct=False)
        if tgt.shape != src.shape:
            raise ValueError(f"tgt_loc and src_loc must have one shape, got {tuple(tgt_loc.shape)} and "
                             f"{tuple(src_loc.shape)}")
        for buf in self.layers.values():
            buf.k[tgt], buf.v[tgt] = buf.k[src], buf.v[src]
            if buf.layout is not None:
                buf.layout.scatter(buf.sfk, tgt, buf.layout.gather(buf.sfk, src, check=False), check=False)
                buf.layout.scatter(buf.sfv, tgt, buf.layout.gather(buf.sfv, src, check=False), check=False)

    # --- reads and sizes ----------------------------------------------------------------------------------------
    def read_kv(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype = torch.float32):
        """Dequantized ``(k, v)`` ``[N, Hkv, D]`` of ``slots`` (1-D int32/int64 in the layer's range), as ``dtype``
        (a floating dtype)."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize == 1:
            raise TypeError(f"dtype must be a bf16/fp16/fp32/fp64 torch.dtype, got {dtype!r}")
        kv = self.paged_kv(layer_id)
        slots = require_slots(slots, "slots", kv.num_slots, where=f" for layer {_layer_id(layer_id)}")
        k, v = kv.read(slots.to(self.device))
        return k.to(dtype), v.to(dtype)

    def bytes_per_token(self) -> int:
        return bytes_per_token(self.plan, self.kv_format)

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers.values() for t in layer.tensors())


def bytes_per_token(plan: LayerPlan, kv_format: str) -> int:
    """KV bytes one token costs across all attention layers of ``plan`` (data plus MXFP8 scale bytes)."""
    return sum(kv_formats.bytes_per_token_per_layer(plan.spec(i).num_kv_heads, plan.spec(i).head_dim, kv_format)
               for i in plan.attention_layer_ids)


def tokens_that_fit(byte_budget: int, plan: LayerPlan, kv_format: str) -> int:
    """How many tokens of KV (every attention layer) fit in ``byte_budget`` bytes."""
    require_int_value(byte_budget, "byte_budget", "a non-negative int", minimum=0)
    return byte_budget // bytes_per_token(plan, kv_format)


class HostKVTier:
    """Pages offloaded to CPU memory and restored, with their scale bytes: byte-exact both ways.

    Host page ``p`` holds, per layer, the data of ``page_size`` slots and (MXFP8) their scale bytes, gathered
    through the pool's scale layout, so an interleaved atom travels with its fp8 payload."""

    def __init__(self, pool: InklingKVPool, num_pages: int, layer_ids: Optional[Sequence[int]] = None,
                 pin_memory: bool = False):
        if not isinstance(pool, InklingKVPool):
            raise TypeError(f"pool must be an InklingKVPool, got {type(pool).__name__}")
        require_int_value(num_pages, "num_pages")
        require_pin_memory(pin_memory)
        self.pool, self.num_pages, self.page_size = pool, num_pages, pool.page_size
        self.layer_ids = list(layer_ids) if layer_ids is not None else list(pool.layers)
        P = pool.page_size
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer_id in self.layer_ids:
            buf = pool._layer(layer_id)
            shape = (num_pages, P, *buf.k.shape[1:])
            make = lambda s, dt: torch.zeros(s, dtype=dt, pin_memory=pin_memory)  # noqa: E731
            self.data[layer_id] = (make(shape, buf.k.dtype), make(shape, buf.v.dtype))
            if buf.layout is not None:
                sshape = (num_pages, P, buf.k.shape[1], buf.layout.blocks_per_head)
                self.scales[layer_id] = (make(sshape, torch.uint8), make(sshape, torch.uint8))

    def _pages(self, pages: torch.Tensor, limit: int, name: str, distinct: bool) -> torch.Tensor:
        require_tensor(pages, name, "a 1-D int32/int64 tensor of page ids")
        if pages.dtype not in (torch.int32, torch.int64) or pages.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32/int64 tensor of page ids, got {pages.dtype} "
                            f"{tuple(pages.shape)}")
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= limit):
            raise ValueError(f"{name} must be pages in [0, {limit}), got [{int(pages.min())}, {int(pages.max())}]")
        if distinct and torch.unique(pages).numel() != pages.numel():
            raise ValueError(f"{name} must not name a page twice (they are the copy's targets), got {pages.tolist()}")
        return pages.long()

    def _slots(self, device_pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size)
        return (device_pages.view(-1, 1).cpu() * self.page_size + offsets).reshape(-1)

    def backup(self, device_pages: torch.Tensor, host_pages: torch.Tensor) -> None:
        """Copy device pages (data and scales) into host pages."""
        self._copy(device_pages, host_pages, to_host=True)

    def restore(self, host_pages: torch.Tensor, device_pages: torch.Tensor) -> None:
        """Copy host pages back into device pages (data and scales)."""
        self._copy(device_pages, host_pages, to_host=False)

    def _copy(self, device_pages: torch.Tensor, host_pages: torch.Tensor, to_host: bool) -> None:
        for name, pages in (("device_pages", device_pages), ("host_pages", host_pages)):
            require_tensor(pages, name, "a 1-D int32/int64 tensor of page ids")
        if device_pages.shape != host_pages.shape:
            raise ValueError(f"device_pages and host_pages must have one shape, got {tuple(device_pages.shape)} "
                             f"and {tuple(host_pages.shape)}")
        host_pages = self._pages(host_pages, self.num_pages, "host_pages", distinct=to_host)
        for layer_id in self.layer_ids:  # validate every layer before touching any buffer
            buf = self.pool._layer(layer_id)
            self._pages(device_pages, buf.num_slots // self.page_size, "device_pages", distinct=not to_host)
        device_pages = device_pages.long()
        slots = self._slots(device_pages).to(self.pool.device)
        for layer_id in self.layer_ids:
            buf = self.pool._layer(layer_id)
            hk, hv = self.data[layer_id]
            shape = (device_pages.numel(), self.page_size, *buf.k.shape[1:])
            if to_host:
                hk[host_pages] = buf.k[slots].reshape(shape).cpu()
                hv[host_pages] = buf.v[slots].reshape(shape).cpu()
            else:
                buf.k[slots] = hk[host_pages].reshape(-1, *buf.k.shape[1:]).to(self.pool.device)
                buf.v[slots] = hv[host_pages].reshape(-1, *buf.v.shape[1:]).to(self.pool.device)
            if buf.layout is not None:
                hsk, hsv = self.scales[layer_id]
                nb = buf.layout.blocks_per_head
                if to_host:
                    hsk[host_pages] = buf.layout.gather(buf.sfk, slots, check=False).reshape(*shape[:3], nb).cpu()
                    hsv[host_pages] = buf.layout.gather(buf.sfv, slots, check=False).reshape(*shape[:3], nb).cpu()
                else:
                    buf.layout.scatter(buf.sfk, slots, hsk[host_pages].reshape(-1, shape[2], nb).to(self.pool.device),
                                       check=False)
                    buf.layout.scatter(buf.sfv, slots, hsv[host_pages].reshape(-1, shape[2], nb).to(self.pool.device),
                                       check=False)
