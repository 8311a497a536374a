"""Probe the backend's entry points with bad input, as a demanding user of the API would, and classify what each call
does.

Every case builds valid inputs, applies one defect, snapshots every output / cache buffer the call may write
(cloned), runs the call and classifies the outcome:

    clean          ValueError/TypeError whose message names the caller's argument, every buffer unchanged
    valid          valid input or documented behaviour (the controls; a control must also give the right result)
    internal_name  ValueError/TypeError, buffers unchanged, but the message does not name the caller's argument
                   (it names an internal one, or none)
    wrong_type     another exception type (RuntimeError, IndexError, KeyError, AttributeError, ...)
    partial_write  raised after a buffer was written
    silent_wrong   no error, and a result different from the torch reference / the valid call's result
    silent_nan     no error, and NaN/inf in the result from finite data (a non-finite sink, bias or scale)
    accepted       no error, bad input silently used (bools, strings, floats where ints go; unvalidated maps)
    deferred       accepted at construction, clean error only at first use
    crash          the process died (a signal) or the call hung

``define_tensor_kind_cases`` probes five classes at every public entry each reaches: a tensor
on the meta device and a device torch cannot reach (``checks.require_tensor`` / ``require_device``), a list where
a tensor goes, a value object built without its checking factory, an extent of 0 or K/V shapes that differ, and a
per-request array shorter than its count (also when set after construction). A buffer on the meta device is not
snapshotted (it has no bytes), and a call that returns meta tensors computed nothing (silent wrong).

Cases run in worker subprocesses: the core and the host-free vLLM parts in one, the SGLang adapter in another
(it needs SGLang's CPU import shims first), and every Triton-route case (under ``TRITON_INTERPRET=1``, tiny
shapes) in a process of its own, since a bad block id there used to kill the process. A worker that dies records
a crash for the case it was running and the rest of its cases go to a fresh worker.

    python tools/probe_bad_input.py --out bench/results/current/bad-input-probe/probe.json
    python tools/probe_bad_input.py --only vllm.forward --list      # select cases by id prefix, list them
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUTCOMES = {
    "clean": "clean ValueError/TypeError naming the argument, nothing written",
    "valid": "valid input, or documented behaviour",
    "internal_name": "right type, but the message names an internal argument (or none)",
    "wrong_type": "wrong exception type",
    "partial_write": "partial write: raised after a buffer was written",
    "silent_wrong": "silent wrong result",
    "silent_nan": "silent NaN from a non-finite sink, bias or scale",
    "accepted": "bad input silently accepted",
    "deferred": "accepted at construction, clean error only at first use",
    "crash": "process killed (signal) or hung",
}
# The issue's probe (about 290 cases, before the fixes): a different case set from this one.
BEFORE = {
    "clean": 119,
    "valid": 30,
    "internal_name": 18,
    "wrong_type": 28,
    "partial_write": 14,
    "silent_wrong": 27,
    "silent_nan": 4,
    "accepted": 42,
    "deferred": 9,
    "crash": 2
}
CASE_TIMEOUT_S = 60


# ---------------------------------------------------------------------------------------------------------------
# The case table
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What a case's build gives: the call, the buffers it may write, and how to judge a call that did not raise.

    ``expect``: a tensor (the right result: compared with ``atol``), a callable ``(result) -> (ok, detail)`` or
    ``(outcome, detail)``, or None (no result to judge: only NaN is looked for). ``use``: for construction cases,
    the first use of what was constructed (``use(obj) -> result``), judged by ``expect``."""
    run: Callable[[], Any]
    buffers: dict = field(default_factory=dict)
    expect: Any = None
    atol: float = 2e-2
    use: Optional[Callable[[Any], Any]] = None


@dataclass
class Case:
    id: str
    surface: str
    call: str  # file:function the case calls
    defect: str
    build: Callable[[], Setup]
    names: tuple = ()  # regexes: the caller's words for the bad argument (case-insensitive)
    kind: str = "bad"  # "bad" | "control" | "construct" | "activation"
    group: str = "core"  # worker group: core | sglang | triton


CASES: list[Case] = []
INTERNAL_WORDS = (r"req_to_token", r"\bkv_indptr\b", r"\bkv_indices\b", r"\bqo_indptr\b", r"\bslots must\b",
                  r"\bpage_table\b", r"kv lens", r"qlens", r"token_to_slot")


def case(id, surface, call, defect, build, names=(), kind="bad", group=None):
    if any(c.id == id for c in CASES):
        raise ValueError(f"duplicate case id {id}")
    if group is None:
        group = "sglang" if surface.startswith("sglang") else ("triton" if "triton" in surface else "core")
    if isinstance(names, str):
        names = (names, )
    if "rel_bias" in names:
        names = tuple(names) + ("relative bias", )
    if id.endswith((".rel_bias_nan", ".rel_bias_inf")):
        # rel_bias is an activation (the model computes it every step), like q, k and v: never read back for
        # finiteness, a NaN or inf in it gives NaN outputs (AttentionParams' documented contract)
        kind, defect = "activation", f"documented: {defect} (an activation: NaN outputs expected)"
    CASES.append(Case(id, surface, call, defect, build, tuple(names), kind, group))


def call_case(id, surface, call, defect, fn, names=(), kind="bad", expect=None, buffers=None, group=None, atol=2e-2):
    """A case whose inputs are built inside ``fn`` (a zero-argument call)."""
    case(id, surface, call, defect, lambda: Setup(fn, buffers() if buffers else {}, expect, atol), names, kind, group)


def construct_case(id, surface, call, defect, make, use, names=(), expect=None, group=None):
    """A construction: ``make()`` builds the object; if it is accepted, ``use(obj)`` is its first use."""
    case(id, surface, call, defect, lambda: Setup(make, {}, expect, use=use), names, "construct", group)


# ---------------------------------------------------------------------------------------------------------------
# Shared helpers (imported lazily: the parent process never imports torch)
# ---------------------------------------------------------------------------------------------------------------
def _torch():
    import torch
    return torch


def dense_attention(q, k, v, scale, window=None, sinks=None, rel_bias=None, logit_cap=0.0):
    """float32 attention of ``q [n, Hq, D]`` (the last n positions) over ``k, v [L, Hkv, D]`` (positions 0..L-1)."""
    torch = _torch()
    n, hq, _ = q.shape
    L = k.shape[0]
    group = hq // k.shape[1]
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    logits = torch.einsum("qhd,khd->qhk", q.float(), k) * scale
    dist = torch.arange(L - n, L).view(-1, 1) - torch.arange(L).view(1, -1)
    if rel_bias is not None:
        e = rel_bias.shape[-1]
        idx = dist.clamp(0, e - 1).unsqueeze(1).expand(n, hq, L)
        logits = logits + torch.where(((dist >= 0) & (dist < e)).unsqueeze(1), rel_bias.float().gather(2, idx), 0.0)
    if logit_cap > 0:
        logits = logit_cap * torch.tanh(logits / logit_cap)
    keep = dist >= 0
    if window is not None:
        keep &= dist <= window - 1
    logits = logits.masked_fill(~keep.unsqueeze(1), float("-inf"))
    if sinks is not None:
        logits = torch.cat([logits, sinks.float().view(1, hq, 1).expand(n, hq, 1)], -1)
        p = torch.softmax(logits, -1)[..., :-1]
    else:
        p = torch.softmax(logits, -1)
    return torch.einsum("qhk,khd->qhd", p, v)


def tensors_in(x):
    torch = _torch()
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors_in(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors_in(y)


def has_nonfinite(x) -> bool:
    torch = _torch()
    for t in tensors_in(x):
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t.float()).all()):
            return True
    return False


def compare(result, want, atol):
    """``(outcome, detail)`` of a result against the right one: None when they agree."""
    torch = _torch()
    if not isinstance(result, torch.Tensor):
        return "silent_wrong", f"returned {type(result).__name__}, expected a tensor"
    if tuple(result.shape) != tuple(want.shape):
        return "silent_wrong", f"shape {tuple(result.shape)}, expected {tuple(want.shape)}"
    r, w = result.float(), want.float()
    if not bool(torch.isfinite(r).all()) and bool(torch.isfinite(w).all()):
        return "silent_nan", f"{int((~torch.isfinite(r)).sum())} non-finite values where the reference is finite"
    diff = (r - w).abs()
    diff = torch.where(torch.isnan(r) & torch.isnan(w), torch.zeros_like(diff), diff)
    worst = float(diff.max()) if diff.numel() else 0.0
    if not worst <= atol:
        return "silent_wrong", f"max |difference| {worst:.4g} from the reference (tolerance {atol})"
    return None


def byte_equal(a, b) -> bool:
    torch = _torch()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ---------------------------------------------------------------------------------------------------------------
# vLLM adapter (host-free): LayerAttention.store / forward, VllmBatch, block_cache
# ---------------------------------------------------------------------------------------------------------------
HQ, HKV, D, BS = 4, 2, 32, 16


def vllm_layer(kv_format="bf16", window=None, sinks=None, block_size=BS, num_blocks=4, model_dtype=None):
    torch = _torch()
    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
    from sglang_inkling_backend.layer_plan import LayerSpec

    LayerAttention.new_step()  # the class-level once-per-step memo: no case sees another's
    spec = LayerSpec(window=window, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D**-0.5)
    att = LayerAttention(spec, kv_format, model_dtype or torch.bfloat16, sinks)
    layout = BlockCacheLayout(kv_format, HKV, D, block_size)
    cache = vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16 if kv_format == "bf16" else torch.uint8)
    return att, cache


def kv_rows(n, seed=0):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HKV, D, generator=g).bfloat16()


def store_case(id, defect, mutate, names=("slot_mapping", ), kind="bad", fmt="bf16", note_call="store"):
    """LayerAttention.store of 3 rows at slots [17, 18, 40] of a 4-block cache (64 slots at block 16), after
    ``mutate(S)`` changes one thing of S (att, cache, key, value, slot_mapping). The valid result: the rows at their
    slots (block 0, the null block, takes padding)."""

    def build():
        torch = _torch()
        block = 128 if fmt == "mxfp8" else BS
        att, cache = vllm_layer(fmt, block_size=block, num_blocks=4)
        if fmt == "fp8_e4m3":
            att.bind_fp8_scales(0.5, 0.5)
        S = SimpleNamespace(att=att, cache=cache, key=kv_rows(3, 1), value=kv_rows(3, 2),
                            slot_mapping=torch.tensor([17, 18, 40]), fused_store=None, pre=None)
        if fmt == "mxfp8":
            S.slot_mapping = torch.tensor([130, 131, 300])
        mutate(S)
        if S.pre is not None:
            S.pre(S)

        def run():
            S.att.store(S.key, S.value, S.cache, S.slot_mapping, fused_store=S.fused_store)
            return S.cache

        def expect(_):
            # the mapped rows at their slots (padding -1: the null block), everything else past block 0 as before
            if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in (S.key, S.value)):
                return "accepted", "no error, and K/V on the meta device hold nothing to store (a silent no-op)"
            kv = S.att.paged_kv(S.cache)
            m = S.slot_mapping
            if not isinstance(m, torch.Tensor) or m.dtype not in (torch.int32, torch.int64):
                return "accepted", f"stored with slot_mapping {m!r}"
            block = S.cache.shape[2] if isinstance(S.cache, torch.Tensor) and S.cache.dim() == 4 else BS
            real = [x for x in m.tolist() if x >= block]
            if len(set(real)) != len(real):
                return "accepted", f"slot_mapping {m.tolist()} stored, a slot written twice (the last row wins)"
            ok_rows = []
            for row, slot in enumerate(m.tolist()):
                if block <= slot < kv.num_slots:
                    got_k = kv.read(torch.tensor([slot]))[0][0]
                    want = S.key[row].float().reshape(HKV, D)
                    if fmt == "fp8_e4m3":
                        want = (want / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.5
                    elif fmt == "mxfp8":
                        from sglang_inkling_backend import mxfp8
                        want = mxfp8.dequantize(*mxfp8.quantize(want), torch.float32)
                    ok_rows.append(bool(torch.equal(got_k, want)))
            if not all(ok_rows):
                return "silent_wrong", f"rows at their slots match: {ok_rows}"
            return None

        return Setup(run, {"kv_cache": S.cache}, expect)

    case(f"vllm.store.{fmt}.{id}" if fmt != "bf16" else f"vllm.store.{id}", "vllm.store",
         "hosts/vllm/attention.py:LayerAttention.store", defect, build, names, kind)


def setattr_(name, value):

    def mutate(S):
        setattr(S, name, value() if callable(value) and not isinstance(value, type) else value)

    return mutate


def _t(*args, **kw):
    return lambda: _torch().tensor(*args, **kw)


def define_vllm_store_cases():
    store_case("valid", "valid: three rows at three slots", lambda S: None, kind="control")
    store_case("valid_int32", "valid: int32 slot_mapping",
               setattr_("slot_mapping", lambda: _torch().tensor([17, 18, 40], dtype=_torch().int32)), kind="control")
    store_case("padding_-1", "documented: -1 is padding, sent to the null block",
               setattr_("slot_mapping", _t([17, -1, 40])), kind="control")
    store_case("more_kv_rows", "documented: K/V with more rows than slot_mapping (vLLM's padding), extra rows not "
               "written", lambda S: (setattr(S, "key", kv_rows(5, 1)), setattr(S, "value", kv_rows(5, 2))),
               kind="control")
    store_case("twice_in_null_block", "documented: a slot of the null block twice (padding sink)",
               setattr_("slot_mapping", _t([3, 3, 40])), kind="control")
    store_case(
        "empty", "valid: an empty step (no slots, no rows)", lambda S:
        (setattr(S, "slot_mapping",
                 _torch().zeros(0, dtype=_torch().int64)), setattr(S, "key", kv_rows(0)), setattr(
                     S, "value", kv_rows(0))), kind="control")
    store_case("flat_kv", "valid: K/V flat [tokens, Hkv*D]", lambda S:
               (setattr(S, "key", S.key.reshape(3, -1)), setattr(S, "value", S.value.reshape(3, -1))), kind="control")
    store_case("below_-1", "slot_mapping entry -2 (below the padding value -1)",
               setattr_("slot_mapping", _t([17, -2, 40])))
    store_case("far_below_-1", "slot_mapping entry -100", setattr_("slot_mapping", _t([17, 18, -100])))
    store_case("past_cache", "slot_mapping entry 64 = num_slots (past the cache)",
               setattr_("slot_mapping", _t([17, 64, 40])))
    store_case("far_past_cache", "slot_mapping entry 10**9", setattr_("slot_mapping", _t([17, 10**9, 40])))
    store_case("slot_twice", "a slot named twice", setattr_("slot_mapping", _t([17, 17, 40])))
    store_case("float_mapping", "float slot_mapping", setattr_("slot_mapping", _t([17.0, 18.0, 40.0])))
    store_case("bool_mapping", "bool slot_mapping", setattr_("slot_mapping", _t([True, False, True])))
    store_case("int16_mapping", "int16 slot_mapping",
               setattr_("slot_mapping", lambda: _torch().tensor([17, 18, 40], dtype=_torch().int16)))
    store_case("uint8_mapping", "uint8 slot_mapping",
               setattr_("slot_mapping", lambda: _torch().tensor([17, 18, 40], dtype=_torch().uint8)))
    store_case("2d_mapping", "2-D slot_mapping", setattr_("slot_mapping", _t([[17, 18, 40]])))
    store_case("list_mapping", "slot_mapping a Python list", setattr_("slot_mapping", [17, 18, 40]))
    store_case("none_mapping", "slot_mapping None", setattr_("slot_mapping", None))
    store_case("key_short", "key with fewer rows (2) than slot_mapping (3)", setattr_("key", lambda: kv_rows(2, 1)),
               names=("key", ))
    store_case("value_short", "value with fewer rows (2) than slot_mapping (3)",
               setattr_("value", lambda: kv_rows(2, 2)), names=("value", ))
    store_case("key_heads", "key with 3 KV heads (layer has 2)",
               setattr_("key", lambda: _torch().zeros(3, 3, D).bfloat16()), names=("key", ))
    store_case("value_width", "value [3, 48] (layer needs 2*32)",
               setattr_("value", lambda: _torch().zeros(3, 48).bfloat16()), names=("value", ))
    store_case("key_int", "int32 key", setattr_("key", lambda: _torch().ones(3, HKV, D, dtype=_torch().int32)),
               names=("key", ))
    store_case("key_4d", "key [3, 2, 32, 1] (4-D)", setattr_("key", lambda: kv_rows(3).unsqueeze(-1)), names=("key", ))
    store_case("key_list", "key a Python list", setattr_("key", [[0.0] * D]), names=("key", ))
    store_case("cache_3d", "kv_cache 3-D", lambda S: setattr(S, "cache", S.cache[0]), names=("kv_cache", ))
    store_case("cache_heads", "kv_cache of a layer with 1 KV head (pages of the wrong size)",
               lambda S: setattr(S, "cache", vllm_layer_view_for(1, BS, 4)), names=("kv_cache", ))
    store_case("cache_strided", "kv_cache whose blocks are not dense pages (a transposed view)",
               lambda S: setattr(S, "cache", S.cache.transpose(1, 2)), names=("kv_cache", ))
    store_case("cache_list", "kv_cache a Python list", setattr_("cache", [0]), names=("kv_cache", ))

    def stale(value):

        def mutate(S):
            torch = _torch()
            m = torch.tensor([17, 18, 40])
            S.att.store(S.key, S.value, S.cache, m)  # step 1, valid: the mapping is checked and memoised
            m.numpy()[1] = value  # the host refills the same tensor in place through numpy: no version bump
            type(S.att).new_step()  # step 2 starts as vLLM's metadata builder starts every step
            S.slot_mapping = m

        return mutate

    store_case(
        "stale_memo_past_cache", "step 2 (begun by the builder's new_step) refills step 1's slot_mapping tensor "
        "through its numpy view (no torch version bump) with a slot past the cache (64): the step's memo is empty",
        stale(64))
    store_case("stale_memo_below_-1", "as above, with -5", stale(-5))
    store_case("stale_memo_twice", "as above, with slot 17 twice", stale(17))

    store_case("valid", "valid: three rows at three slots (per-tensor fp8, scale 0.5)", lambda S: None, kind="control",
               fmt="fp8_e4m3")
    store_case("below_-1", "slot_mapping entry -2", setattr_("slot_mapping", _t([17, -2, 40])), fmt="fp8_e4m3")
    store_case("slot_twice", "a slot named twice", setattr_("slot_mapping", _t([17, 17, 40])), fmt="fp8_e4m3")
    store_case("valid", "valid: three rows at three slots (MXFP8, block 128)", lambda S: None, kind="control",
               fmt="mxfp8")
    store_case("past_cache", "slot_mapping entry 512 = num_slots", setattr_("slot_mapping", _t([130, 512, 300])),
               fmt="mxfp8")
    store_case("slot_twice", "a slot named twice", setattr_("slot_mapping", _t([130, 130, 300])), fmt="mxfp8")
    store_case("value_short", "value with 2 rows for 3 slots", setattr_("value", lambda: kv_rows(2, 2)),
               names=("value", ), fmt="mxfp8")
    store_case("block_16", "an MXFP8 kv_cache of block 16 (MXFP8 needs 128)",
               lambda S: setattr(S, "cache",
                                 _torch().zeros(4, HKV, 16, mxfp8_cell(), dtype=_torch().uint8)), names=("block", ),
               fmt="mxfp8")

    # bind_fp8_scales: the checkpoint's per-tensor scales
    def bind(value):

        def fn():
            att, cache = vllm_layer("fp8_e4m3")
            att.bind_fp8_scales(value, 0.5)
            att.store(kv_rows(1), kv_rows(1), cache, _torch().tensor([17]))
            return att.spec.k_scale

        return fn

    for tag, value, kind in (("valid", 0.5, "control"), ("tensor", "tensor", "control"), ("string", "2.0", "bad"),
                             ("bool", True, "bad"), ("zero", 0.0, "bad"), ("nan", float("nan"), "bad"),
                             ("huge", 1e300, "bad"), ("negative", -0.5, "bad")):
        fn = bind(value) if value != "tensor" else (lambda: bind(_torch().tensor(0.5))())
        call_case(
            f"vllm.bind_fp8_scales.{tag}", "vllm.store", "hosts/vllm/attention.py:LayerAttention.bind_fp8_scales",
            f"k_scale={value!r}" if value != "tensor" else "valid: k_scale a one-element tensor", fn,
            names=("k_scale", ), kind=kind, expect=(lambda r: None if r == 0.5 else
                                                    ("silent_wrong", f"k_scale {r}")) if kind == "control" else None)


def mxfp8_cell():
    from sglang_inkling_backend.hosts.vllm.block_cache import cell_bytes
    return cell_bytes("mxfp8", D)


def vllm_layer_view_for(hkv, block, num_blocks, fmt="bf16"):
    torch = _torch()
    from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
    layout = BlockCacheLayout(fmt, hkv, D, block)
    return vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16 if fmt == "bf16" else torch.uint8)


# --- vLLM forward: a mixed batch (2 decodes + a 4-token prefill) ------------------------------------------------
def vllm_batch_setup(route="torch", fmt="bf16", window=None, sinks=None, seq_lens=(20, 9, 12), query_lens=(1, 1, 4),
                     seed=3):
    """A LayerAttention over vLLM's block layout with every request's K/V stored, a batch's tensors (kw: VllmBatch's
    arguments), the query, a padded output filled with 0.5, and the dense reference of the valid call."""
    torch = _torch()
    from sglang_inkling_backend.routes import TorchRoute
    block = 128 if fmt == "mxfp8" else BS
    nreq = len(seq_lens)
    bpr = -(-max(seq_lens) // block)
    num_blocks = nreq * bpr + 2  # block 0 null, one spare
    att, cache = vllm_layer(fmt, window=window, sinks=sinks, block_size=block, num_blocks=num_blocks)
    g = torch.Generator().manual_seed(seed)
    table = (torch.randperm(num_blocks - 1, generator=g)[:nreq * bpr] + 1).view(nreq, bpr).to(torch.int32)
    slots = [
        table[r, torch.arange(n) // block].long() * block + torch.arange(n) % block for r, n in enumerate(seq_lens)
    ]
    all_slots = torch.cat(slots)
    att.store(
        torch.randn(all_slots.numel(), HKV, D, generator=g).bfloat16(),
        torch.randn(all_slots.numel(), HKV, D, generator=g).bfloat16(), cache, all_slots)
    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    LayerAttention.new_step()
    T = sum(query_lens)
    qsl = torch.zeros(nreq + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    q = torch.randn(T, HQ * D, generator=g).bfloat16()
    output = torch.full((T + 2, HQ * D), 0.5, dtype=torch.bfloat16)  # vLLM pads output rows past the tokens
    kv = att.paged_kv(cache)
    want = []
    for r, (n, ql) in enumerate(zip(seq_lens, query_lens)):
        k, v = kv.read(slots[r])
        qr = q[int(qsl[r]):int(qsl[r + 1])].float().view(ql, HQ, D).bfloat16().float()
        want.append(dense_attention(qr, k, v, D**-0.5, window=window, sinks=sinks).reshape(ql, HQ * D))
    want = torch.cat(want)
    nd = sum(1 for ql in query_lens if ql == 1 and True)
    nd = next((i for i, ql in enumerate(query_lens) if ql != 1), nreq)
    if route == "torch":
        r = TorchRoute()
    else:
        from sglang_inkling_backend.gpu.route import GpuRoute
        r = GpuRoute()
    workspace = r.make_workspace(max_batch=nreq, geometries={(HQ, HKV, D)}, max_seq_len=max(seq_lens) + 64,
                                 device=torch.device("cpu"))
    kw = dict(num_reqs=nreq, num_actual_tokens=T, num_decodes=nd, num_decode_tokens=nd, query_start_loc=qsl,
              seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table=table, slot_mapping=torch.zeros(
                  T, dtype=torch.int64), block_size=block, max_seq_len=max(seq_lens), workspace=workspace, route=r)
    return SimpleNamespace(att=att, cache=cache, kw=kw, q=q, output=output, want=want, T=T, table=table, slots=slots,
                           block=block, num_blocks=num_blocks)


def forward_case(id, defect, mutate, names, kind="bad", route="torch", fmt="bf16", window=None, sinks=None,
                 seq_lens=(20, 9, 12), query_lens=(1, 1, 4), no_error=None):
    """``no_error``: the outcome of a call that does not raise and gives finite output, where the valid call's result
    is not the right comparison (the defect changes the input's values, e.g. an int query cast to the model's
    dtype)."""
    surface = "vllm.forward.triton" if route == "triton" else "vllm.forward"

    def build():
        torch = _torch()
        sk = sinks() if callable(sinks) else sinks
        S = vllm_batch_setup(route, fmt, window, sk, seq_lens, query_lens)
        S.ignore_rows = []
        if sk is not None and kind != "control":  # a bad sink: the right result is refusing it; compare to no sink
            S.want = vllm_batch_setup(route, fmt, window, None, seq_lens, query_lens).want
        mutate(S)
        from sglang_inkling_backend.hosts.vllm.batch import VllmBatch

        def run():
            batch = VllmBatch(**S.kw)
            return S.att.forward(S.q, S.cache, batch, S.output)

        def expect(result):
            if not isinstance(result, torch.Tensor) or result.dim() != 2:
                return "silent_wrong", f"returned {type(result).__name__}"
            if no_error and not has_nonfinite(result[:S.T]):
                return no_error, "no error; output computed from the converted input"
            keep = [i for i in range(S.T) if i not in S.ignore_rows]
            bad = compare(result[keep], S.want[keep], 2e-2)
            if bad:
                return bad
            if result.shape[0] > S.T and not bool((result[S.T:].float() == 0.5).all()):
                return "silent_wrong", "wrote output rows past num_actual_tokens"
            return None

        return Setup(run, {"output": S.output, "kv_cache": S.cache}, expect)

    case(
        f"{surface}.{fmt}.{id}" if fmt != "bf16" else f"{surface}.{id}", surface,
        "hosts/vllm/attention.py:LayerAttention.forward" + (" (GpuRoute)" if route == "triton" else " (TorchRoute)"),
        defect, build, names, kind, "triton" if route == "triton" else "core")


def kw_set(name, value):

    def mutate(S):
        S.kw[name] = value(S) if callable(value) else value

    return mutate


def table_set(row, col, value):

    def mutate(S):
        S.kw["block_table"] = S.kw["block_table"].clone()
        S.kw["block_table"][row, col] = value(S) if callable(value) else value

    return mutate


def seq_set(row, value):

    def mutate(S):
        S.kw["seq_lens"] = S.kw["seq_lens"].clone()
        S.kw["seq_lens"][row] = value

    return mutate


def qsl_set(values):

    def mutate(S):
        S.kw["query_start_loc"] = _torch().tensor(values, dtype=_torch().int32)

    return mutate


def define_vllm_forward_cases(route):
    torch = _torch()
    # Defects refused before the route is reached (VllmBatch's construction, LayerAttention.forward's own checks)
    # are probed on the torch route only.
    before_route = {
        "qsl_float", "num_actual_-1", "num_actual_float", "num_actual_bool", "num_decode_tokens", "block_size_mismatch",
        "block_table_float", "block_table_1d", "block_table_short", "seq_lens_float", "max_seq_len_zero",
        "max_seq_len_float", "query_width", "output_short", "output_width", "output_row_strided", "kv_cache_3d",
        "kv_cache_list", "num_actual_long", "query_short"
    }

    def F(id, *a, **k):
        if route == "triton" and id in before_route and k.get("fmt", "bf16") == "bf16":
            return
        forward_case(id, *a, route=route, **k)

    F("valid", "valid: 2 decodes + a 4-token prefill", lambda S: None, (), kind="control")
    F("valid_window", "valid: window 8", lambda S: None, (), kind="control", window=8)
    F("valid_sinks", "valid: attention sinks", lambda S: None, (), kind="control",
      sinks=lambda: torch.tensor([0.5, -1.0, 2.0, 0.0]))
    F("valid_decode_only", "valid: 3 decodes", lambda S: None, (), kind="control", query_lens=(1, 1, 1))
    F("valid_prefill_only", "valid: one 5-token prefill over 12 keys", lambda S: None, (), kind="control",
      seq_lens=(12, ), query_lens=(5, ))
    F("table_past_rows_unread", "documented: block_table entries past a request's length are not read "
      "(set to 9999)", table_set(1, 1, 9999), (), kind="control")
    F(
        "window_null_block_unread", "documented: a windowed layer's block before its window is not read "
        "(decode row 0's first block 9999, window 4)", table_set(0, 0, 9999), (), kind="control", window=4)
    F("shared_block", "documented: two requests share a block (prefix sharing): decode 1 reads decode 0's block",
      lambda S: (table_set(1, 0, int(S.table[0, 0]))(S), setattr(S, "want", recompute_want(S))), (), kind="control")
    F("decode_block_past_cache", "decode block id past the cache (block_table[0,1] = num_blocks)",
      table_set(0, 1, lambda S: S.num_blocks), ("block_table", ))
    F("decode_block_far_past", "decode block id 10**6", table_set(0, 0, 10**6), ("block_table", ))
    F("decode_block_negative", "decode block id -1", table_set(0, 0, -1), ("block_table", ))
    F("prefill_block_past_cache", "prefill block id past the cache", table_set(2, 0, lambda S: S.num_blocks),
      ("block_table", ))
    F("prefill_block_negative", "prefill block id -3", table_set(2, 0, -3), ("block_table", ))
    F("decode_seq_past_table", "decode seq_lens longer than its block_table row covers (20 -> 40 with 2 blocks of 16)",
      seq_set(0, 40), ("seq_lens", ))
    F("prefill_seq_past_table", "prefill seq_lens longer than its row covers", seq_set(2, 40), ("seq_lens", ))
    F(
        "decode_seq_zero",
        "documented: decode seq_lens 0 is vLLM's CUDA-graph padding row, read as one key, its output discarded",
        lambda S: (seq_set(1, 0)
                   (S), S.ignore_rows.append(1)), ("seq_lens", ), kind="control")
    F("decode_seq_negative", "decode seq_lens -3", seq_set(1, -3), ("seq_lens", ))
    F("prefill_seq_below_query", "a 4-token prefill whose seq_len is 2 (the issue's partial-write example)",
      seq_set(2, 2), ("seq_lens", "query_start_loc"))
    F("prefill_seq_zero", "a 4-token prefill whose seq_len is 0", seq_set(2, 0), ("seq_lens", "query_start_loc"))
    F("qsl_decode_inconsistent", "query_start_loc [0, 2, 2, 6]: decode 0 claims 2 tokens, decode 1 none",
      qsl_set([0, 2, 2, 6]), ("query_start_loc", ))
    F("qsl_not_from_0", "query_start_loc [1, 2, 3, 7] (not from 0)", qsl_set([1, 2, 3, 7]), ("query_start_loc", ))
    F("qsl_decreasing", "query_start_loc [0, 1, 2, 1]", qsl_set([0, 1, 2, 1]), ("query_start_loc", ))
    F("qsl_end_short", "query_start_loc ends at 5, num_actual_tokens 6", qsl_set([0, 1, 2, 5]),
      ("query_start_loc", "num_actual_tokens"))
    F("qsl_end_long", "query_start_loc ends at 7, num_actual_tokens 6", qsl_set([0, 1, 2, 7]),
      ("query_start_loc", "num_actual_tokens"))
    F("qsl_float", "float query_start_loc",
      lambda S: S.kw.__setitem__("query_start_loc", S.kw["query_start_loc"].float()), ("query_start_loc", ))
    F("num_actual_-1", "num_actual_tokens = -1", kw_set("num_actual_tokens", -1), ("num_actual_tokens", ))
    F("num_actual_short", "num_actual_tokens 5 of 6 tokens", kw_set("num_actual_tokens", 5),
      ("num_actual_tokens", "query_start_loc"))
    F("num_actual_long", "num_actual_tokens 8, query has 6 rows (slot_mapping padded to 8)", lambda S:
      (kw_set("num_actual_tokens", 8)(S), kw_set("slot_mapping", torch.zeros(8, dtype=torch.int64))
       (S)), ("num_actual_tokens", ))
    F("num_actual_float", "num_actual_tokens 6.0", kw_set("num_actual_tokens", 6.0), ("num_actual_tokens", ))
    F("num_actual_bool", "num_actual_tokens True", kw_set("num_actual_tokens", True), ("num_actual_tokens", ))
    F("num_decodes_3", "num_decodes 3 (the prefill counted as a decode)", lambda S:
      (kw_set("num_decodes", 3)(S), kw_set("num_decode_tokens", 3)(S)), ("num_decodes", ))
    F("num_decodes_1", "documented: num_decodes 1 (decode 1 served as a one-token prefill: same result)", lambda S:
      (kw_set("num_decodes", 1)(S), kw_set("num_decode_tokens", 1)(S)), (), kind="control")
    F("num_decode_tokens", "num_decode_tokens 3 != num_decodes 2", kw_set("num_decode_tokens", 3),
      ("num_decode_tokens", ))
    F("num_reqs_short", "num_reqs 2 (3 requests' tokens)", kw_set("num_reqs", 2), ("num_reqs", "query_start_loc"))
    F("block_size_mismatch", "batch block_size 32, kv_cache blocks of 16", kw_set("block_size", 32), ("block_size", ))
    F("block_table_float", "float block_table", lambda S: S.kw.__setitem__("block_table", S.kw["block_table"].float()),
      ("block_table", ))
    F("block_table_1d", "1-D block_table", lambda S: S.kw.__setitem__("block_table", S.kw["block_table"][0]),
      ("block_table", ))
    F("block_table_short", "block_table with 2 rows for 3 requests",
      lambda S: S.kw.__setitem__("block_table", S.kw["block_table"][:2]), ("block_table", ))
    F("seq_lens_float", "float seq_lens", lambda S: S.kw.__setitem__("seq_lens", S.kw["seq_lens"].float()),
      ("seq_lens", ))
    F("max_seq_len_below", "max_seq_len 10 below a request's 20 keys", kw_set("max_seq_len", 10), ("max_seq_len", ),
      kind="control" if route == "torch" else "bad")
    F("max_seq_len_zero", "max_seq_len 0", kw_set("max_seq_len", 0), ("max_seq_len", ))
    F("max_seq_len_float", "max_seq_len 20.0", kw_set("max_seq_len", 20.0), ("max_seq_len", ))
    F("query_width", "query [6, 100] (layer needs 4*32)", lambda S: setattr(S, "q",
                                                                            torch.zeros(6, 100).bfloat16()),
      ("query", ))
    F("query_short", "query with 5 rows for 6 tokens", lambda S: setattr(S, "q", S.q[:5]),
      (r"\bquery (has|must)", "num_actual_tokens"))
    F("query_int", "int32 query", lambda S: setattr(S, "q", torch.ones(6, HQ * D, dtype=torch.int32)),
      (r"\bq\b", "query"), no_error="accepted")
    F("query_nan", "documented: a NaN query row gives a NaN output row", lambda S:
      (S.q.__setitem__(0, float("nan")), setattr(S, "want", nan_row(S.want, 0))), (), kind="control")
    F("output_short", "output with 4 rows for 6 tokens", lambda S: setattr(S, "output",
                                                                           torch.zeros(4, HQ * D).bfloat16()),
      ("output", ))
    F("output_width", "output [8, 64]", lambda S: setattr(S, "output", torch.zeros(8, 64).bfloat16()), ("output", ))
    F("output_int", "int32 output", lambda S: setattr(S, "output", torch.zeros(8, HQ * D, dtype=torch.int32)),
      ("output", ))
    F("output_row_strided", "valid: output a column slice of a wider buffer (rows strided, each row contiguous)",
      lambda S: setattr(S, "output",
                        torch.full((8, 2 * HQ * D), 0.5).bfloat16()[:, :HQ * D]), (), kind="control")
    F("kv_cache_3d", "kv_cache 3-D", lambda S: setattr(S, "cache", S.cache[0]), ("kv_cache", ))
    F("kv_cache_list", "kv_cache a list", lambda S: setattr(S, "cache", [S.cache]), ("kv_cache", ))
    F("sinks_nan", "a NaN attention sink", lambda S: None, ("sinks", ),
      sinks=lambda: torch.tensor([float("nan"), 0, 0, 0]))
    F("sinks_inf", "a +inf attention sink", lambda S: None, ("sinks", ),
      sinks=lambda: torch.tensor([float("inf"), 0, 0, 0]))
    if route == "triton":
        F("valid_mxfp8", "valid: MXFP8 cache (block 128)", lambda S: None, (), kind="control", fmt="mxfp8",
          seq_lens=(150, 9, 40), query_lens=(1, 1, 5))
        F("decode_block_past_cache", "MXFP8: decode block id past the cache", table_set(0, 1, lambda S: S.num_blocks),
          ("block_table", ), fmt="mxfp8", seq_lens=(150, 9, 40), query_lens=(1, 1, 5))
        F("decode_block_negative", "MXFP8: decode block id -1", table_set(0, 0, -1), ("block_table", ), fmt="mxfp8",
          seq_lens=(150, 9, 40), query_lens=(1, 1, 5))
        F("max_seq_len_below", "MXFP8: max_seq_len 100 below a request's 150 keys", kw_set("max_seq_len", 100),
          ("max_seq_len", ), fmt="mxfp8", seq_lens=(150, 9, 40), query_lens=(1, 1, 5))


def nan_row(want, row):
    want = want.clone()
    want[row] = float("nan")
    return want


def recompute_want(S):
    """The dense reference after the block table changed (the valid result of a documented change)."""
    torch = _torch()
    kv = S.att.paged_kv(S.cache)
    qsl = S.kw["query_start_loc"]
    out = []
    for r in range(S.kw["num_reqs"]):
        n = int(S.kw["seq_lens"][r])
        pos = torch.arange(n)
        slots = S.kw["block_table"][r, pos // S.block].long() * S.block + pos % S.block
        k, v = kv.read(slots)
        ql = int(qsl[r + 1] - qsl[r])
        qr = S.q[int(qsl[r]):int(qsl[r + 1])].float().view(ql, HQ, D)
        out.append(dense_attention(qr, k, v, D**-0.5, window=S.att.spec.window).reshape(ql, HQ * D))
    return torch.cat(out)


def define_vllm_batch_cases():
    """VllmBatch at construction (structure only: values are the route's to check, once per step)."""
    torch = _torch()
    import numpy as np

    def good():
        return dict(num_reqs=2, num_actual_tokens=4, num_decodes=1, num_decode_tokens=1,
                    query_start_loc=torch.tensor([0, 1, 4],
                                                 dtype=torch.int32), seq_lens=torch.tensor([5, 3], dtype=torch.int32),
                    block_table=torch.tensor([[1], [2]], dtype=torch.int32), slot_mapping=torch.zeros(
                        4, dtype=torch.int64), block_size=BS, max_seq_len=5)

    def B(id, defect, change, names, kind="bad"):

        def fn():
            from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
            kw = good()
            kw.update(change() if callable(change) else change)
            return VllmBatch(**kw)

        call_case(f"vllm.batch.{id}", "vllm.batch", "hosts/vllm/batch.py:VllmBatch.__post_init__", defect, fn, names,
                  kind, expect=None)

    B("valid", "valid batch", {}, (), kind="control")
    B("numpy_counts", "documented: numpy integer counts (vLLM's host arrays)",
      lambda: dict(num_reqs=np.int64(2), num_actual_tokens=np.int32(4), max_seq_len=np.int64(5)), (), kind="control")
    B("num_reqs_bool", "num_reqs True", dict(num_reqs=True), "num_reqs")
    B("num_reqs_float", "num_reqs 2.0", dict(num_reqs=2.0), "num_reqs")
    B("num_reqs_str", "num_reqs '2'", dict(num_reqs="2"), "num_reqs")
    B("num_reqs_negative", "num_reqs -1", dict(num_reqs=-1), "num_reqs")
    B("num_decodes_negative", "num_decodes -1", dict(num_decodes=-1, num_decode_tokens=-1), "num_decodes")
    B("numpy_bool", "num_reqs numpy.bool_(True)", lambda: dict(num_reqs=np.bool_(True)), "num_reqs")
    B("numpy_float", "max_seq_len numpy.float64(5.0)", lambda: dict(max_seq_len=np.float64(5.0)), "max_seq_len")
    B("block_size_zero", "block_size 0", dict(block_size=0), "block_size")
    B("block_size_bool", "block_size True", dict(block_size=True), "block_size")
    B("max_seq_len_none", "max_seq_len None", dict(max_seq_len=None), "max_seq_len")
    B("qsl_list", "query_start_loc a Python list", dict(query_start_loc=[0, 1, 4]), "query_start_loc")
    B("qsl_2d", "2-D query_start_loc", lambda: dict(query_start_loc=torch.tensor([[0, 1, 4]], dtype=torch.int32)),
      "query_start_loc")
    B("seq_lens_bool", "bool seq_lens", lambda: dict(seq_lens=torch.tensor([True, True])), "seq_lens")
    B("seq_lens_short", "seq_lens with 1 entry for 2 requests",
      lambda: dict(seq_lens=torch.tensor([5], dtype=torch.int32)), "seq_lens")
    B("block_table_int16", "int16 block_table", lambda: dict(block_table=torch.tensor([[1], [2]], dtype=torch.int16)),
      "block_table")
    B("slot_mapping_short", "slot_mapping with 3 entries for 4 tokens",
      lambda: dict(slot_mapping=torch.zeros(3, dtype=torch.int64)), "slot_mapping")
    B("slot_mapping_float", "float slot_mapping", lambda: dict(slot_mapping=torch.zeros(4)), "slot_mapping")
    B("prefills_without_tokens", "num_actual_tokens 0 with a prefill", dict(num_actual_tokens=0, num_decodes=1),
      "num_actual_tokens")


def define_vllm_layer_cases():
    """LayerAttention and BlockCacheLayout at construction, used by a store or forward."""
    torch = _torch()

    def use_forward(att):
        S = vllm_batch_setup()
        from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
        att._layouts = {}
        return att.forward(S.q, S.cache, VllmBatch(**S.kw), S.output)

    def make_layer(**over):

        def make():
            from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
            from sglang_inkling_backend.layer_plan import LayerSpec
            args = dict(spec=LayerSpec(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D**-0.5),
                        kv_format="bf16", model_dtype=torch.bfloat16, sinks=None)
            args.update({
                k: (v() if callable(v) and not isinstance(v, (type, torch.dtype)) else v)
                for k, v in over.items()
            })
            return LayerAttention(**args)

        return make

    construct_case("vllm.layer.sinks_shape", "vllm.layer",
                   "hosts/vllm/attention.py:LayerAttention.__init__", "sinks of shape [3] for 4 query heads",
                   make_layer(sinks=lambda: torch.zeros(3)), use_forward, "sinks")
    construct_case("vllm.layer.sinks_list", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__",
                   "sinks a Python list", make_layer(sinks=[0.0] * HQ), use_forward, "sinks")
    construct_case("vllm.layer.sinks_2d", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__",
                   "sinks [1, 4]", make_layer(sinks=lambda: torch.zeros(1, HQ)), use_forward, "sinks")
    construct_case("vllm.layer.kv_format", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__",
                   "kv_format 'fp4'", make_layer(kv_format="fp4"), use_forward, "kv_format")
    construct_case("vllm.layer.spec_none", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__", "spec None",
                   make_layer(spec=None), use_forward, "spec")
    construct_case("vllm.layer.model_dtype", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__",
                   "model_dtype 'bfloat16' (a string)", make_layer(model_dtype="bfloat16"), use_forward, "model_dtype")
    for tag, kw, names in (("kv_format", dict(kv_format="mxfp4"),
                            "kv_format"), ("heads_zero", dict(num_kv_heads=0),
                                           "num_kv_heads"), ("heads_bool", dict(num_kv_heads=True), "num_kv_heads"),
                           ("block_float", dict(block_size=16.0), "block_size"),
                           ("mxfp8_head_dim", dict(kv_format="mxfp8", head_dim=48, block_size=128),
                            "head_dim"), ("mxfp8_block", dict(kv_format="mxfp8", block_size=16), "block_size")):

        def fn(kw=kw):
            from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout
            args = dict(kv_format="bf16", num_kv_heads=HKV, head_dim=D, block_size=BS)
            args.update(kw)
            return BlockCacheLayout(**args)

        call_case(f"vllm.block_cache.{tag}", "vllm.layer", "hosts/vllm/block_cache.py:BlockCacheLayout", str(kw), fn,
                  names)


# ---------------------------------------------------------------------------------------------------------------
# The GPU route directly (GpuRoute.decode / extend over rails, under the interpreter, one process per case)
# ---------------------------------------------------------------------------------------------------------------
def route_setup(route="triton", fmt="bf16", seq_lens=(20, 9), qlens=None, seed=5):
    """A PagedKV pool (bf16, slot 0 the padding sink), requests' rails over shuffled slots, a query, params, and the
    dense reference."""
    torch = _torch()
    from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
    from sglang_inkling_backend.rails import KVRails
    from sglang_inkling_backend.step_plans import DecodePlanCache
    g = torch.Generator().manual_seed(seed)
    num_slots = 64
    k = torch.randn(num_slots, HKV, D, generator=g).bfloat16()
    v = torch.randn(num_slots, HKV, D, generator=g).bfloat16()
    kv = PagedKV(k, v)
    perm = torch.randperm(num_slots - 1, generator=g) + 1
    lens = list(seq_lens)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.tensor(lens), 0)
    indices = perm[:int(indptr[-1])].long()
    qlens = qlens or [1] * len(lens)
    rows = sum(qlens)
    q = torch.randn(rows, HQ, D, generator=g).bfloat16()
    qo = torch.zeros(len(lens) + 1, dtype=torch.int64)
    qo[1:] = torch.cumsum(torch.tensor(qlens), 0)
    params = AttentionParams(softmax_scale=D**-0.5)
    want = torch.cat([
        dense_attention(q[int(qo[b]):int(qo[b + 1])].float(), kv.k_buffer[indices[indptr[b]:indptr[b + 1]]],
                        kv.v_buffer[indices[indptr[b]:indptr[b + 1]]], D**-0.5) for b in range(len(lens))
    ])
    if route == "triton":
        from sglang_inkling_backend.gpu.route import GpuRoute
        r = GpuRoute()
    else:
        from sglang_inkling_backend.routes import TorchRoute
        r = TorchRoute()
    ws = r.make_workspace(max_batch=len(lens), geometries={(HQ, HKV, D)}, max_seq_len=128, device=torch.device("cpu"))
    return SimpleNamespace(kv=kv, rails=KVRails(indptr, indices), q=q, qo=qo, params=params, want=want, route=r, ws=ws,
                           plans=DecodePlanCache(), max_seq_len=max(lens), num_slots=num_slots)


def route_case(id, defect, mutate, names, kind="bad", route="triton", op="decode", seq_lens=(20, 9), qlens=None):
    surface = "triton.route" if route == "triton" else "core.routes"

    def build():
        S = route_setup(route, seq_lens=seq_lens, qlens=qlens)
        mutate(S)

        def run():
            params = S.params() if callable(S.params) else S.params  # a callable: the params are built in the call
            if op == "decode":
                return S.route.decode(S.q, S.kv, S.rails, params, max_seq_len=S.max_seq_len, plans=S.plans,
                                      workspace=S.ws)
            return S.route.extend(S.q, S.kv, S.rails, S.qo, params, plans=S.plans)

        return Setup(run, {"k_buffer": S.kv.k_buffer, "v_buffer": S.kv.v_buffer}, S.want)

    cls = "gpu/route.py:GpuRoute" if route == "triton" else "routes.py:TorchRoute"
    case(f"{surface}.{op}.{id}", surface, f"{cls}.{op}", defect, build, names, kind,
         "triton" if route == "triton" else "core")


def rails_set(indptr=None, indices=None):

    def mutate(S):
        torch = _torch()
        from sglang_inkling_backend.rails import KVRails
        ip = S.rails.indptr if indptr is None else (indptr(S) if callable(indptr) else torch.tensor(indptr))
        ix = S.rails.indices if indices is None else (indices(S) if callable(indices) else torch.tensor(indices))
        S.rails = KVRails(ip, ix)

    return mutate


def idx_set(pos, value):

    def f(S):
        ix = S.rails.indices.clone()
        ix[pos] = value
        return ix

    return f


def define_route_cases(route):
    torch = _torch()
    # The torch route's own checks are the reference's (core.reference.*): only what the route adds is probed there.
    reference_checks = {
        "q_int", "q_head_dim", "params_none", "indptr_wrong_length", "qo_float", "qo_2d", "qo_end_short",
        "index_negative", "rel_bias_inf"
    }

    def R(id, *a, op="decode", **k):
        if route == "torch" and id in reference_checks:
            return
        route_case(id, *a, route=route, op=op, **k)

    R("valid", "valid: 2 decodes over rails", lambda S: None, (), kind="control")
    R("index_past_pool", "a rail index = num_slots", rails_set(indices=idx_set(3, 64)), ("indices", "rails"))
    R("index_negative", "a rail index -1", rails_set(indices=idx_set(3, -1)), ("indices", "rails"))
    R("indices_float", "float rail indices", rails_set(indices=lambda S: S.rails.indices.float()), ("indices", "rails"))
    R("indptr_not_from_0", "rails indptr [1, 20, 29]", rails_set(indptr=[1, 20, 29]), ("indptr", ))
    R("indptr_past_indices", "rails indptr ends at 35, past its 29 indices", rails_set(indptr=[0, 20, 35]),
      (r"\bindptr\b", r"\bindptr ends"))
    R("indptr_decreasing", "rails indptr [0, 20, 10]", rails_set(indptr=[0, 20, 10]), ("indptr", ))
    R("empty_request", "a decode request with no key (indptr [0, 20, 20])", rails_set(indptr=[0, 20, 20]), ("indptr", ))
    R("indptr_wrong_length", "indptr with 2 entries for 2 requests", rails_set(indptr=[0, 29]), ("indptr", ))
    R("keys_pages", "KVPages keys for the torch route" if route == "torch" else "keys None",
      (lambda S: setattr(S, "rails", None)) if route == "triton" else (lambda S: setattr(
          S, "rails",
          __import__("sglang_inkling_backend.rails", fromlist=["KVPages"]).KVPages(torch.zeros(
              2, 2, dtype=torch.int32), torch.tensor([20, 9]), 16))), ("keys", "rails"))
    R("q_int", "int32 q", lambda S: setattr(S, "q", S.q.to(torch.int32)), (r"\bq\b", ))
    R("q_head_dim", "q head_dim 64 on a head_dim-32 pool", lambda S: setattr(S, "q",
                                                                             torch.zeros(2, HQ, 64).bfloat16()),
      (r"\bq\b", "head_dim"))
    R("q_rows", "q with 3 rows for 2 requests", lambda S: setattr(S, "q",
                                                                  torch.zeros(3, HQ, D).bfloat16()),
      (r"\bq\b", "indptr"))
    R("params_none", "params None", lambda S: setattr(S, "params", None), ("params", ))
    R("sinks_nan", "a NaN sink",
      lambda S: setattr(S, "params", lambda: params_with(sinks=torch.tensor([float("nan"), 0, 0, 0]))), ("sinks", ))
    R(
        "rel_bias_nan", "a NaN relative bias entry", lambda S: setattr(
            S, "params", params_with(rel_bias=torch.zeros(2, HQ, 4).index_fill_(2, torch.tensor([0]), float("nan")))),
        ("rel_bias", ))
    R(
        "rel_bias_inf", "a +inf relative bias entry", lambda S: setattr(
            S, "params", params_with(rel_bias=torch.zeros(2, HQ, 4).index_fill_(2, torch.tensor([1]), float("inf")))),
        ("rel_bias", ))
    R("max_seq_len_below", "max_seq_len 10 below a request's 20 keys", lambda S: setattr(S, "max_seq_len", 10),
      ("max_seq_len", ), kind="control" if route == "torch" else "bad")
    R("max_seq_len_none", "max_seq_len None", lambda S: setattr(S, "max_seq_len", None), ("max_seq_len", ),
      kind="control" if route == "torch" else "bad")
    R("max_seq_len_bool", "max_seq_len True", lambda S: setattr(S, "max_seq_len", True), ("max_seq_len", ),
      kind="control" if route == "torch" else "bad")
    R("max_seq_len_float", "max_seq_len 20.0", lambda S: setattr(S, "max_seq_len", 20.0), ("max_seq_len", ),
      kind="control" if route == "torch" else "bad")
    E = lambda *a, **k: R(*a, op="extend", seq_lens=(12, 6), qlens=[4, 2], **k)  # noqa: E731
    E("valid", "valid: 2 extends over rails", lambda S: None, (), kind="control")
    E("qo_not_from_0", "qo_indptr [1, 5, 6]", lambda S: setattr(S, "qo", torch.tensor([1, 5, 6])), ("qo_indptr", ))
    E("qo_end_short", "qo_indptr ends at 5 with 6 query rows", lambda S: setattr(S, "qo", torch.tensor([0, 4, 5])),
      ("qo_indptr", ))
    E("qo_float", "float qo_indptr", lambda S: setattr(S, "qo", torch.tensor([0.0, 4.0, 6.0])), ("qo_indptr", ))
    E("qo_more_than_keys", "qo_indptr [0, 4, 6] with request 1's keys 1 (indptr [0, 12, 13])",
      rails_set(indptr=[0, 12, 13]), ("qo_indptr", "indptr"))
    E("index_past_pool", "an extend rail index past the pool", rails_set(indices=idx_set(2, 64)), ("indices", "rails"))
    E("index_negative", "an extend rail index -2", rails_set(indices=idx_set(2, -2)), ("indices", "rails"))
    E("plans_none", "documented: plans=None (the keys are checked on this call)", lambda S: setattr(S, "plans", None),
      (), kind="control")
    E("qo_2d", "2-D qo_indptr", lambda S: setattr(S, "qo", torch.tensor([[0, 4, 6]])), ("qo_indptr", ))


def params_with(**kw):
    from sglang_inkling_backend.attention_inputs import AttentionParams
    return AttentionParams(softmax_scale=D**-0.5, **kw)


# Core, SGLang and the rest: defined in the second half of this file.


# ---------------------------------------------------------------------------------------------------------------
# The core
# ---------------------------------------------------------------------------------------------------------------
def define_checks_cases():
    torch = _torch()
    from sglang_inkling_backend import checks
    S = "core.checks"
    for tag, value, kind in (("valid_int", 3, "control"), ("bool", True, "bad"), ("float", 3.0, "bad"),
                             ("string", "3", "bad"), ("below_min", -1, "bad")):
        call_case(f"core.checks.require_int.{tag}", S, "checks.py:require_int", f"count={value!r}",
                  lambda value=value: checks.require_int(value, "count", 0), "count", kind,
                  expect=(lambda r: None if r == 3 else ("silent_wrong", r)) if kind == "control" else None)
    for tag, value, kind in (("valid", 2.0, "control"), ("valid_tensor", "tensor", "control"), ("string", "2.0", "bad"),
                             ("bool", True, "bad"), ("nan", float("nan"), "bad"), ("inf", float("inf"), "bad"),
                             ("past_float32", 1e300, "bad"), ("int_tensor", "int_tensor", "bad"), ("two_element_tensor",
                                                                                                   "two", "bad")):

        def fn(value=value):
            v = {"tensor": lambda: torch.tensor(2.0), "int_tensor": lambda: torch.tensor(2),
                 "two": lambda: torch.tensor([2.0, 3.0])}.get(value, lambda: value)() if isinstance(value, str) and \
                value in ("tensor", "int_tensor", "two") else value
            return checks.require_real(v, "k_scale")

        call_case(f"core.checks.require_real.{tag}", S, "checks.py:require_real", f"k_scale={value!r}", fn, "k_scale",
                  kind, expect=(lambda r: None if r == 2.0 else ("silent_wrong", r)) if kind == "control" else None)
    for tag, value in (("zero", 0.0), ("negative_zero", -0.0), ("negative", -1.0)):
        call_case(f"core.checks.require_positive_real.{tag}", S, "checks.py:require_positive_real", f"scale={value!r}",
                  lambda value=value: checks.require_positive_real(value, "scale"), "scale")
    call_case("core.checks.require_positive_real.underflows_float32", S, "checks.py:require_positive_real",
              "scale=1e-50 (> 0 in float64, 0 in float32, the kernels' precision)",
              lambda: checks.require_positive_real(1e-50, "scale"), "scale")
    for tag, make, kind, distinct in (("valid", lambda: torch.tensor([1, 2]), "control",
                                       False), ("padding_twice", lambda: torch.tensor([0, 0, 5]), "control",
                                                True), ("float", lambda: torch.tensor([1.0]), "bad",
                                                        False), ("bool", lambda: torch.tensor([True]), "bad", False),
                                      ("past", lambda: torch.tensor([10]), "bad",
                                       False), ("twice", lambda: torch.tensor([3, 3]), "bad", True)):
        call_case(f"core.checks.require_slots.{tag}", S, "checks.py:require_slots", f"slots={tag}",
                  lambda make=make, distinct=distinct: checks.require_slots(make(), "loc", 10, distinct=distinct),
                  "loc", kind)


def define_mxfp8_cases():
    torch = _torch()
    from sglang_inkling_backend import kv_formats, mxfp8
    S = "core.mxfp8"

    def round_trip(x):
        return mxfp8.dequantize(*mxfp8.quantize(x), torch.float32)

    call_case(
        "core.mxfp8.quantize.valid", S, "mxfp8.py:quantize", "valid: a bf16 [2, 64] tensor",
        lambda: round_trip(torch.linspace(-3, 3, 128).view(2, 64).bfloat16()), kind="control", expect=lambda r: None
        if float((r - torch.linspace(-3, 3, 128).view(2, 64).bfloat16().float()).abs().max()) < 0.2 else
        ("silent_wrong", "round trip"))
    call_case(
        "core.mxfp8.quantize.nan_block", S, "mxfp8.py:quantize",
        "documented: a block holding NaN becomes the NaN scale and NaN bytes",
        lambda: mxfp8.quantize(torch.tensor([float("nan")] + [1.0] * 63))[1].tolist(), kind="control",
        expect=lambda r: None if r == [255, mxfp8.scale_exponent(torch.tensor(1.0)).item()] else ("silent_wrong", r))
    saturated = lambda r: None if float(r[0]) == mxfp8.LARGEST_ROUND_TRIP else (  # noqa: E731
        "silent_wrong", f"round trip gives {float(r[0])}, not LARGEST_ROUND_TRIP")
    call_case("core.mxfp8.quantize.finite_float64_past_float32", S, "mxfp8.py:quantize",
              "documented: 1e300 in a float64 tensor (finite) saturates to LARGEST_ROUND_TRIP",
              lambda: round_trip(torch.full((32, ), 1e300, dtype=torch.float64)), "x", kind="control",
              expect=saturated)
    call_case("core.mxfp8.quantize.float32_near_max", S, "mxfp8.py:quantize",
              "documented: 3.3e38 in float32 (finite) saturates to LARGEST_ROUND_TRIP (not 2**128, inf)",
              lambda: round_trip(torch.full((32, ), 3.3e38)), "x", kind="control", expect=saturated)
    for tag, make, names in (("int", lambda: torch.ones(32, dtype=torch.int32),
                              "x"), ("bool", lambda: torch.ones(32, dtype=torch.bool),
                                     "x"), ("list", lambda: [1.0] * 32, "x"), ("d48", lambda: torch.ones(2, 48), "x"),
                             ("scalar", lambda: torch.tensor(1.0), "x"), ("numpy", lambda: __import__("numpy").ones(32),
                                                                          "x")):
        call_case(f"core.mxfp8.quantize.{tag}", S, "mxfp8.py:quantize", f"x={tag}",
                  lambda make=make: mxfp8.quantize(make()), names)
    for tag, scale, kind in (("valid", 0.5, "control"), ("string", "2.0", "bad"), ("bool", True, "bad"),
                             ("zero", 0, "bad"), ("negative", -1.0, "bad"), ("nan", float("nan"), "bad"),
                             ("inf", float("inf"), "bad"), ("past_float32", 1e300, "bad"), ("underflows_float32", 1e-50,
                                                                                            "bad")):
        x = lambda: torch.tensor([0.0, 1.0, -2.0, 3.0])  # noqa: E731
        call_case(
            f"core.mxfp8.quantize_per_tensor.{tag}", S, "mxfp8.py:quantize_per_tensor", f"scale={scale!r}",
            lambda scale=scale: mxfp8.quantize_per_tensor(x(), scale).float() * (scale
                                                                                 if isinstance(scale, float) else 1.0),
            "scale", kind, expect=(lambda r: compare(r, x(), 0.2)) if kind == "control" else
            (lambda r: ("silent_nan", f"bytes of [0, 1, -2, 3] read {r.tolist()}") if has_nonfinite(r) else
             ("accepted", r.tolist())))
    call_case("core.mxfp8.quantize_per_tensor.x_int", S, "mxfp8.py:quantize_per_tensor", "int x",
              lambda: mxfp8.quantize_per_tensor(torch.ones(4, dtype=torch.int32), 1.0), "x")
    call_case("core.mxfp8.quantize_per_tensor.saturates", S, "mxfp8.py:quantize_per_tensor",
              "documented: 1e6 saturates at 448", lambda: mxfp8.quantize_per_tensor(torch.tensor([1e6]), 1.0).float(),
              kind="control", expect=lambda r: None if float(r[0]) == 448 else ("silent_wrong", r))
    for tag, fn, names in (
        ("data_bf16", lambda: mxfp8.dequantize(torch.zeros(32).bfloat16(), torch.zeros(1, dtype=torch.uint8)), "data"),
        ("scales_shape",
         lambda: mxfp8.dequantize(torch.zeros(2, 32, dtype=torch.float8_e4m3fn), torch.zeros(2, 2, dtype=torch.uint8)),
         "scales"), ("dtype_int", lambda: mxfp8.dequantize(torch.zeros(32, dtype=torch.float8_e4m3fn),
                                                           torch.zeros(1, dtype=torch.uint8), torch.int32), "dtype")):
        call_case(f"core.mxfp8.dequantize.{tag}", S, "mxfp8.py:dequantize", tag, fn, names)
    for tag, args, names in ((("format_fp4"), (2, 32, "fp4"), "kv_format"),
                             ("heads_bool", (True, 32, "bf16"), "num_kv_heads"), ("head_dim_48", (2, 48, "mxfp8"),
                                                                                  "head_dim")):
        call_case(f"core.mxfp8.bytes_per_token.{tag}", S, "kv_formats.py:bytes_per_token_per_layer",
                  repr(args), lambda args=args: kv_formats.bytes_per_token_per_layer(*args), names)


def define_attention_inputs_cases():
    torch = _torch()
    from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
    from sglang_inkling_backend.scale_layout import ScaleLayout
    S = "core.attention_inputs"
    fp8 = lambda: torch.full((8, 1, 32), 1.0).to(torch.float8_e4m3fn)  # noqa: E731

    def pk(**kw):
        return lambda: PagedKV(**kw)

    def read_all(kv):
        return kv.read(torch.arange(8))[0]

    for tag, make, names in (
        ("k_2d", lambda: PagedKV(torch.zeros(8, 32), torch.zeros(8, 32)),
         "k_buffer"), ("kv_shape", lambda: PagedKV(torch.zeros(8, 1, 32), torch.zeros(8, 2, 32)),
                       ("k_buffer", "v_buffer")), ("kv_dtype", lambda: PagedKV(torch.zeros(8, 1, 32),
                                                                               torch.zeros(8, 1, 32).bfloat16()),
                                                   ("k_buffer", "v_buffer")),
        ("int_buffers",
         lambda: PagedKV(torch.zeros(8, 1, 32, dtype=torch.int32), torch.zeros(8, 1, 32, dtype=torch.int32)),
         "k_buffer"), ("list_buffer", lambda: PagedKV([0.0], [0.0]), "k_buffer"), ("scales_no_layout", lambda: PagedKV(
             fp8(), fp8(), torch.zeros(8, 1, 1, dtype=torch.uint8), torch.zeros(8, 1, 1, dtype=torch.uint8)), "layout"),
        ("scales_bf16_data", lambda: PagedKV(
            torch.zeros(8, 1, 32).bfloat16(),
            torch.zeros(8, 1, 32).bfloat16(), torch.zeros(8, 1, 1, dtype=torch.uint8),
            torch.zeros(8, 1, 1, dtype=torch.uint8), ScaleLayout.for_pool(8, 1, 32, 1)),
         ("k_buffer", "float8")), ("scales_int32", lambda: PagedKV(fp8(), fp8(), torch.zeros(
             8, 1, 1, dtype=torch.int32), torch.zeros(8, 1, 1, dtype=torch.int32), ScaleLayout.for_pool(8, 1, 32, 1)),
                                   "k_scales"),
        ("layout_slots", lambda: PagedKV(fp8(), fp8(), torch.zeros(16, 1, 1, dtype=torch.uint8),
                                         torch.zeros(16, 1, 1, dtype=torch.uint8), ScaleLayout.for_pool(16, 1, 32, 1)),
         ("k_buffer", "layout"))):
        call_case(f"core.PagedKV.{tag}", S, "attention_inputs.py:PagedKV.__post_init__", tag, make, names)
    for tag, value, expect in (("k_scale_nan", float("nan"), None), ("k_scale_inf", float("inf"), None),
                               ("k_scale_past_float32", 1e300, None), ("k_scale_string", "2.0", None),
                               ("k_scale_bool", True, None), ("k_scale_zero", 0.0, lambda r:
                                                              ("silent_wrong", "every K read as 0")
                                                              if float(r.abs().max()) == 0 else None),
                               ("k_scale_negative", -1.0, lambda r: ("silent_wrong", "every K read negated")
                                if float(r.max()) < 0 else None), ("k_scale_underflows", 1e-50, lambda r:
                                                                   ("silent_wrong", "every K read as 0")
                                                                   if float(r.abs().max()) == 0 else None)):
        construct_case(f"core.PagedKV.{tag}", S, "attention_inputs.py:PagedKV (fp8 per-tensor k_scale)",
                       f"k_scale={value!r} on an fp8_e4m3 PagedKV, then read", pk_lambda(fp8, value), read_all,
                       "k_scale", expect=expect)
    construct_case("core.PagedKV.k_scale_on_bf16", S, "attention_inputs.py:PagedKV",
                   "documented: k_scale on a bf16 pool is ignored",
                   lambda: PagedKV(torch.ones(8, 1, 32), torch.ones(8, 1, 32), k_scale=2.0), read_all,
                   expect=lambda r: None if float(r.max()) == 1.0 else ("silent_wrong", "scaled"))
    CASES[-1].kind = "control"
    for tag, slots, names in (("past", lambda: torch.tensor([8]), "slots"), ):
        call_case(f"core.PagedKV.read.{tag}", S, "attention_inputs.py:PagedKV.read", f"slots {tag}",
                  lambda slots=slots: PagedKV(torch.ones(8, 1, 32), torch.ones(8, 1, 32)).read(slots()), names)
    for tag, kw, names in (("scale_string", dict(softmax_scale="0.1"),
                            "softmax_scale"), ("scale_bool", dict(softmax_scale=True),
                                               "softmax_scale"), ("scale_zero", dict(softmax_scale=0), "softmax_scale"),
                           ("scale_nan", dict(softmax_scale=float("nan")),
                            "softmax_scale"), ("window_zero", dict(softmax_scale=0.1, window=0), "window"),
                           ("window_float", dict(softmax_scale=0.1, window=2.5),
                            "window"), ("window_bool", dict(softmax_scale=0.1, window=True),
                                        "window"), ("window_negative", dict(softmax_scale=0.1, window=-1), "window"),
                           ("cap_negative", dict(softmax_scale=0.1, logit_cap=-1.0),
                            "logit_cap"), ("cap_nan", dict(softmax_scale=0.1, logit_cap=float("nan")),
                                           "logit_cap"), ("rel_bias_int", dict(softmax_scale=0.1, rel_bias="int"),
                                                          "rel_bias"), ("sinks_list",
                                                                        dict(softmax_scale=0.1, sinks=[0.0]), "sinks")):

        def make(kw=kw):
            kw = dict(kw)
            if kw.get("rel_bias") == "int":
                kw["rel_bias"] = torch.zeros(1, 1, 4, dtype=torch.int32)
            return AttentionParams(**kw)

        call_case(f"core.AttentionParams.{tag}", S, "attention_inputs.py:AttentionParams.__post_init__", str(kw), make,
                  names)

    def decode_use(params):
        from sglang_inkling_backend.reference.attention import paged_decode_attention
        kv = PagedKV(torch.randn(8, 1, 32, generator=torch.Generator().manual_seed(1)),
                     torch.randn(8, 1, 32, generator=torch.Generator().manual_seed(2)))
        return paged_decode_attention(torch.randn(2, 2, 32, generator=torch.Generator().manual_seed(3)), kv,
                                      torch.tensor([0, 3, 6]), torch.arange(6), params)

    for tag, kw, names in (("sinks_nan", dict(sinks="nan"), "sinks"), ("sinks_inf", dict(sinks="inf"), "sinks"),
                           ("rel_bias_nan", dict(rel_bias="nan"), "rel_bias"), ("rel_bias_inf", dict(rel_bias="inf"),
                                                                                "rel_bias"),
                           ("sinks_2d", dict(sinks="2d"), "sinks"), ("rel_bias_2d", dict(rel_bias="2d"), "rel_bias")):

        def make(kw=kw):
            v = {
                "sinks": {
                    "nan": lambda: torch.tensor([float("nan"), 0.0]),
                    "inf": lambda: torch.tensor([float("inf"), 0.0]),
                    "2d": lambda: torch.zeros(1, 2)
                },
                "rel_bias": {
                    "nan": lambda: torch.zeros(2, 2, 4).index_fill_(2, torch.tensor([0]), float("nan")),
                    "inf": lambda: torch.zeros(2, 2, 4).index_fill_(2, torch.tensor([1]), float("inf")),
                    "2d": lambda: torch.zeros(2, 8)
                }
            }
            name, which = next(iter(kw.items()))
            return AttentionParams(softmax_scale=0.2, **{name: v[name][which]()})

        construct_case(f"core.AttentionParams.{tag}", S, "attention_inputs.py:AttentionParams (then the reference "
                       "decode)", f"{tag}", make, decode_use, names)


def pk_lambda(fp8, value):
    from sglang_inkling_backend.attention_inputs import PagedKV
    return lambda: PagedKV(fp8(), fp8(), k_scale=value)


def define_layer_plan_cases():
    torch = _torch()
    from sglang_inkling_backend.hosts.sglang.layers import record_window
    from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec, attention_params
    S = "core.layer_plan"
    base = dict(num_q_heads=4, num_kv_heads=2, head_dim=64)
    for tag, kw, names in (("heads_zero", dict(num_q_heads=0),
                            "num_q_heads"), ("heads_bool", dict(num_kv_heads=True),
                                             "num_kv_heads"), ("heads_float", dict(num_q_heads=4.0), "num_q_heads"),
                           ("gqa", dict(num_kv_heads=3), "num_kv_heads"), ("window_zero", dict(window=0), "window"),
                           ("window_float", dict(window=2.5), "window"), ("window_bool", dict(window=True),
                                                                          "window"), ("rel_extent_zero",
                                                                                      dict(rel_extent=0), "rel_extent"),
                           ("rel_extent_bool", dict(rel_extent=True),
                            "rel_extent"), ("softmax_string", dict(softmax_scale="0.1"), "softmax_scale"),
                           ("softmax_complex", dict(softmax_scale=0.1j),
                            "softmax_scale"), ("k_scale_bool", dict(k_scale=True),
                                               "k_scale"), ("k_scale_huge", dict(k_scale=1e300),
                                                            "k_scale"), ("v_scale_string", dict(v_scale="2"),
                                                                         "v_scale"), ("cap_negative",
                                                                                      dict(logit_cap=-1), "logit_cap"),
                           ("cap_string", dict(logit_cap="30"),
                            "logit_cap"), ("rope_theta_string", dict(rope_theta="1e4"),
                                           "rope_theta"), ("rope_theta_negative", dict(rope_theta=-1.0),
                                                           "rope_theta"), ("log_scaling_int", dict(log_scaling=5),
                                                                           "log_scaling"), ("has_attention_string",
                                                                                            dict(has_attention="no"),
                                                                                            "has_attention")):
        call_case(f"core.LayerSpec.{tag}", S, "layer_plan.py:LayerSpec.__post_init__", str(kw),
                  lambda kw=kw: LayerSpec(**{
                      **base,
                      **kw
                  }), names)
    call_case("core.LayerSpec.head_dim_48", S, "layer_plan.py:LayerSpec",
              "documented: head_dim 48 (any size; a pool or "
              "route that needs more refuses it)", lambda: LayerSpec(**{
                  **base, "head_dim": 48
              }), kind="control")
    for tag, fn, names in (("empty", lambda: LayerPlan([]),
                            ("specs", "attention layer")), ("not_specs", lambda: LayerPlan([1, 2]),
                                                            "specs"), ("none", lambda: LayerPlan(None), "specs"),
                           ("from_windows_empty", lambda: LayerPlan.from_windows({}),
                            "windows"), ("from_windows_outside",
                                         lambda: LayerPlan.from_windows({5: None}, num_layers=3), "windows"),
                           ("from_windows_negative", lambda: LayerPlan.from_windows({-1: None}),
                            "windows"), ("from_windows_str_key", lambda: LayerPlan.from_windows({"0": None}),
                                         "windows"), ("from_windows_float_key",
                                                      lambda: LayerPlan.from_windows({0.0: None}), "windows"),
                           ("from_windows_num_layers_float", lambda: LayerPlan.from_windows({0: None}, num_layers=2.5),
                            "num_layers"), ("from_windows_num_layers_bool",
                                            lambda: LayerPlan.from_windows({0: None}, num_layers=True),
                                            "num_layers"), ("with_tp_zero", lambda: LayerPlan.from_windows({
                                                0: None
                                            }, num_q_heads=4, num_kv_heads=2).with_tp(0), "tp_size"),
                           ("with_tp_bool", lambda: LayerPlan.from_windows({
                               0: None
                           }, num_q_heads=4, num_kv_heads=2).with_tp(True),
                            "tp_size"), ("with_tp_3", lambda: LayerPlan.from_windows({
                                0: None
                            }, num_q_heads=4, num_kv_heads=2).with_tp(3),
                                         "tp_size"), ("spec_bool", lambda: LayerPlan.from_windows({
                                             0: None,
                                             1: 4
                                         }).spec(True), "layer_id"), ("spec_negative", lambda: LayerPlan.from_windows({
                                             0: None
                                         }).spec(-1), "layer_id"),
                           ("attention_params_sinks",
                            lambda: attention_params(LayerSpec(**base), rows=2, sinks=torch.zeros(3)),
                            "sinks"), ("attention_params_rel_bias",
                                       lambda: attention_params(LayerSpec(**base), rows=2, rel_bias=torch.zeros(2, 4)),
                                       "rel_bias"), ("attention_params_no_attention",
                                                     lambda: attention_params(LayerSpec(has_attention=False), rows=2),
                                                     "spec")):
        call_case(f"core.LayerPlan.{tag}", S,
                  "layer_plan.py:" + ("attention_params" if "attention_params" in tag else "LayerPlan"), tag, fn, names)
    for tag, value, kind, want in (("none", None, "control", None), ("minus_1", -1, "control", None),
                                   ("zero", 0, "control", 1), ("float", 2.5, "bad", None), ("minus_5", -5, "bad", None),
                                   ("bool", True, "bad", None), ("string", "4", "bad", None),
                                   ("minus_2", -2, "bad", None), ("float_whole", 4.0, "bad", None)):
        call_case(
            f"core.record_window.{tag}", S, "hosts/sglang/layers.py:record_window", f"sliding_window_size={value!r}",
            lambda value=value: record_window(value), "sliding_window_size", kind,
            expect=(lambda r, want=want: None if r == want else ("silent_wrong", r)) if kind == "control" else None)

    def config(**kw):
        base_cfg = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        sliding_window=128)
        return SimpleNamespace(**{**base_cfg, **kw})

    def plan_summary(p):
        return [(p.spec(i).window, p.spec(i).num_kv_heads, p.spec(i).head_dim, p.spec(i).softmax_scale,
                 p.spec(i).logit_cap) if p.spec(i).has_attention else None for i in range(p.num_layers)]

    inkling = dict(model_type="inkling", local_layer_ids=[0, 2], rel_extent=64, swa_head_dim=64)
    for tag, kw, names, kind in (
        ("valid_layer_types", dict(layer_types=["sliding_attention", "sliding_attention", "full_attention"]), (),
         "control"), ("valid_inkling", inkling, (), "control"), ("sliding_without_window",
                                                                 dict(layer_types=["sliding_attention"] * 3,
                                                                      sliding_window=None), "sliding_window", "bad"),
        ("layer_types_long", dict(layer_types=["full_attention"] * 4), "layer_types",
         "bad"), ("layer_types_short", dict(layer_types=["full_attention"] * 2), "layer_types",
                  "bad"), ("layer_types_unknown",
                           dict(layer_types=["full_attention", "chunked_attention", "full_attention"]), "layer_types",
                           "bad"), ("heads_zero", dict(num_attention_heads=0), "num_attention_heads",
                                    "bad"), ("heads_none", dict(num_attention_heads=None), "num_attention_heads",
                                             "bad"), ("layers_zero", dict(num_hidden_layers=0), "num_hidden_layers",
                                                      "bad"),
        ("layers_bool", dict(num_hidden_layers=True), "num_hidden_layers",
         "bad"), ("kv_heads_zero", dict(num_key_value_heads=0), "num_key_value_heads",
                  "bad"), ("kv_heads_3", dict(num_key_value_heads=3), "num_key_value_heads",
                           "bad"), ("kv_heads_string", dict(num_key_value_heads="2"), "num_key_value_heads",
                                    "bad"), ("head_dim_missing", dict(head_dim=None), ("head_dim", "hidden_size"),
                                             "bad"), ("head_dim_zero", dict(head_dim=0, hidden_size=256), "head_dim",
                                                      "bad"), ("head_dim_float", dict(head_dim=2.5), "head_dim", "bad"),
        ("hidden_not_divisible", dict(head_dim=None, hidden_size=250), ("hidden_size", "num_attention_heads"),
         "bad"), ("window_negative", dict(layer_types=["sliding_attention"] * 3, sliding_window=-1), "sliding_window",
                  "bad"), ("window_float", dict(layer_types=["sliding_attention"] * 3,
                                                sliding_window=2.5), "sliding_window",
                           "bad"), ("window_zero_use_sliding", dict(sliding_window=0,
                                                                    use_sliding_window=True), "sliding_window",
                                    "bad"), ("use_sliding_string", dict(use_sliding_window="false"),
                                             "use_sliding_window", "bad"), ("pattern_zero",
                                                                            dict(sliding_window_pattern=0),
                                                                            "sliding_window_pattern", "bad"),
        ("softcap_string", dict(attn_logit_softcapping="30"), "attn_logit_softcapping",
         "bad"), ("softcap_negative", dict(attn_logit_softcapping=-5.0), "attn_logit_softcapping",
                  "bad"), ("pre_attn_zero", dict(query_pre_attn_scalar=0), "query_pre_attn_scalar",
                           "bad"), ("pre_attn_negative", dict(query_pre_attn_scalar=-4), "query_pre_attn_scalar",
                                    "bad"), ("pre_attn_string", dict(query_pre_attn_scalar="256"),
                                             "query_pre_attn_scalar", "bad"), ("inkling_local_id_past", {
                                                 **inkling, "local_layer_ids": [0, 5]
                                             }, "local_layer_ids", "bad"), ("inkling_local_id_negative", {
                                                 **inkling, "local_layer_ids": [-1]
                                             }, "local_layer_ids", "bad"), ("inkling_no_window", {
                                                 **inkling, "sliding_window": None
                                             }, "sliding_window", "bad"), ("inkling_n_floor_zero", {
                                                 **inkling, "log_scaling_n_floor": 0
                                             }, "log_scaling_n_floor", "bad"), ("inkling_rel_extent_zero", {
                                                 **inkling, "rel_extent": 0
                                             }, "rel_extent", "bad")):
        call_case(f"core.from_hf_config.{tag}", S, "layer_plan.py:LayerPlan.from_hf_config", str(kw),
                  lambda kw=kw: plan_summary(LayerPlan.from_hf_config(config(**kw))), names, kind,
                  expect=(lambda r: None) if kind == "control" else (lambda r: ("accepted", f"plan {r}")))
    call_case("core.from_hf_config.dict_config", S, "layer_plan.py:LayerPlan.from_hf_config",
              "a dict instead of a config object",
              lambda: LayerPlan.from_hf_config(dict(num_hidden_layers=2, num_attention_heads=4, head_dim=64)),
              ("config", "num_hidden_layers"))


def define_decode_context_cases():
    torch = _torch()
    from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext, make_decode_context
    from sglang_inkling_backend.layer_plan import LayerPlan
    S = "core.decode_context"
    caches = lambda n=1: [[None] * n for _ in range(3)]  # noqa: E731  [attention layer][request]

    def ctx(**kw):  # three attention layers' caches, one per request of seq_lens
        seq = kw.get("seq_lens", [4])
        return BatchedDecodeContext(**{"seq_lens": [4], "attention_layer_caches": caches(len(seq)), **kw})

    for tag, fn, names, kind in (
        ("valid", lambda: ctx(full_kv_pool_index_by_layer={
            0: 0,
            2: 1
        }), (),
         "control"), ("full_dup", lambda: ctx(full_kv_pool_index_by_layer={
             0: 0,
             2: 0
         }), "full_kv_pool_index_by_layer", "bad"), ("full_out_of_range", lambda: ctx(full_kv_pool_index_by_layer={
             0: 0,
             2: 5
         }), "full_kv_pool_index_by_layer", "bad"),
        ("full_negative", lambda: ctx(full_kv_pool_index_by_layer={0: -1}), "full_kv_pool_index_by_layer",
         "bad"), ("full_windowed_index", lambda: ctx(full_kv_pool_index_by_layer={
             0: 0,
             2: 2
         }), "full_kv_pool_index_by_layer", "bad"), ("full_stray_layer", lambda: ctx(full_kv_pool_index_by_layer={
             0: 0,
             7: 1
         }), "full_kv_pool_index_by_layer", "bad"),
        ("full_bool_key", lambda: ctx(full_kv_pool_index_by_layer={True: 0}), "full_kv_pool_index_by_layer",
         "bad"), ("full_float_index", lambda: ctx(full_kv_pool_index_by_layer={0: 0.0}), "full_kv_pool_index_by_layer",
                  "bad"), ("full_list", lambda: ctx(full_kv_pool_index_by_layer=[0, 1]), "full_kv_pool_index_by_layer",
                           "bad"), ("attention_out_of_range", lambda: ctx(attention_pool_index_by_layer={
                               0: 0,
                               1: 3
                           }), "attention_pool_index_by_layer", "bad"), ("attention_dup",
                                                                         lambda: ctx(attention_pool_index_by_layer={
                                                                             0: 0,
                                                                             1: 0
                                                                         }), "attention_pool_index_by_layer", "bad"),
        ("fused_without_full_map", lambda: ctx(fused_rope_scatter=object()), "full_kv_pool_index_by_layer",
         "bad"), ("seq_lens_empty", lambda: ctx(seq_lens=[]), "seq_lens",
                  "bad"), ("seq_lens_negative", lambda: ctx(seq_lens=[-1]), "seq_lens",
                           "bad"), ("seq_lens_float", lambda: ctx(seq_lens=[2.5]), "seq_lens",
                                    "bad"), ("seq_lens_bool", lambda: ctx(seq_lens=[True]), "seq_lens", "bad"),
        ("seq_lens_tensor", lambda: ctx(seq_lens=torch.tensor([3, 4])).seq_lens, (),
         "control"), ("caches_none", lambda: ctx(attention_layer_caches=None), "attention_layer_caches",
                      "bad"), ("make_not_plan", lambda: make_decode_context(None, [4], caches()), "plan", "bad"),
        ("make_caches_count", lambda: make_decode_context(LayerPlan.from_windows({
            0: None,
            1: 4
        }), [4], caches()), "attention_layer_caches",
         "bad"), ("padding_window_zero", lambda: ctx().decode_padding(0), "window",
                  "bad"), ("padding_window_bool", lambda: ctx(seq_lens=[1, 5]).decode_padding(True), "window",
                           "bad"), ("padding_window_float", lambda: ctx().decode_padding(2.5), "window",
                                    "bad"), ("cache_for_unknown_layer", lambda: ctx().cache_for(9, 0), "layer_id",
                                             "bad"), ("cache_for_request_past", lambda: ctx().cache_for(0, 3),
                                                      "request", "bad")):
        call_case(f"core.BatchedDecodeContext.{tag}", S, "mlx/decode_context.py:BatchedDecodeContext", tag, fn, names,
                  kind, expect=(lambda r: None) if kind == "control" else None)
    construct_case("core.BatchedDecodeContext.mask_factory_none", S, "mlx/decode_context.py:BatchedDecodeContext",
                   "mask_factory None, then decode_padding of a ragged batch",
                   lambda: ctx(seq_lens=[1, 5], mask_factory=None), lambda c: c.decode_padding(None), "mask_factory")


def define_reference_cases():
    torch = _torch()
    from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
    from sglang_inkling_backend.reference.attention import paged_decode_attention, paged_extend_attention
    S = "core.reference"
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    kv = lambda: PagedKV(torch.randn(16, 1, 32, generator=g(1)), torch.randn(16, 1, 32, generator=g(2)))  # noqa: E731
    q2 = lambda: torch.randn(2, 2, 32, generator=g(3))  # noqa: E731
    P = lambda **kw: AttentionParams(softmax_scale=0.2, **kw)  # noqa: E731
    ip, ix = lambda: torch.tensor([0, 3, 8]), lambda: torch.arange(1, 9)  # noqa: E731

    def dec(q=None, kv_=None, indptr=None, indices=None, params=None):
        return lambda: paged_decode_attention(q() if q else q2(),
                                              kv_() if kv_ else kv(),
                                              indptr() if indptr else ip(),
                                              indices() if indices else ix(),
                                              params() if params else P())

    for tag, fn, names, kind in (
        ("valid", dec(), (), "control"), ("indices_longer", dec(indices=lambda: torch.arange(1, 12)), (), "control"),
        ("indptr_not_from_0", dec(indptr=lambda: torch.tensor([1, 3, 8])), "kv_indptr",
         "bad"), ("indptr_decreasing", dec(indptr=lambda: torch.tensor([0, 5, 3])), "kv_indptr",
                  "bad"), ("indptr_past", dec(indptr=lambda: torch.tensor([0, 3, 9])), ("kv_indptr", "kv_indices"),
                           "bad"), ("indptr_length", dec(indptr=lambda: torch.tensor([0, 8])), "kv_indptr", "bad"),
        ("index_past", dec(indices=lambda: torch.tensor([1, 2, 3, 4, 5, 6, 7, 16])), "kv_indices",
         "bad"), ("index_negative", dec(indices=lambda: torch.tensor([1, 2, 3, 4, 5, 6, 7, -1])), "kv_indices",
                  "bad"), ("indices_float", dec(indices=lambda: torch.arange(1, 9).float()), "kv_indices", "bad"),
        ("indices_int16", dec(indices=lambda: torch.arange(1, 9).to(torch.int16)), "kv_indices",
         "bad"), ("empty_request", dec(indptr=lambda: torch.tensor([0, 0, 8])), "kv_indptr",
                  "bad"), ("q_int", dec(q=lambda: torch.ones(2, 2, 32, dtype=torch.int32)), r"\bq\b",
                           "bad"), ("q_2d", dec(q=lambda: torch.zeros(2, 64)), r"\bq\b",
                                    "bad"), ("q_head_dim", dec(q=lambda: torch.zeros(2, 2, 64)), r"\bq\b", "bad"),
        ("kv_none", lambda: paged_decode_attention(q2(), None, ip(), ix(), P()), r"\bkv\b",
         "bad"), ("params_none", lambda: paged_decode_attention(q2(), kv(), ip(), ix(), None), "params",
                  "bad"), ("rel_bias_rows", dec(params=lambda: P(rel_bias=torch.zeros(3, 2, 4))), "rel_bias",
                           "bad"), ("sinks_shape", dec(params=lambda: P(sinks=torch.zeros(3))), "sinks", "bad")):
        call_case(
            f"core.reference.decode.{tag}", S, "reference/attention.py:paged_decode_attention", tag, fn, names, kind,
            expect=(lambda r: None if not has_nonfinite(r) else ("silent_nan", "NaN")) if kind == "control" else None)
    q6 = lambda: torch.randn(6, 2, 32, generator=g(4))  # noqa: E731
    qo = lambda: torch.tensor([0, 4, 6])  # noqa: E731

    def ext(qo_=None, indptr=None, indices=None, q=None):
        return lambda: paged_extend_attention(q() if q else q6(), kv(),
                                              indptr() if indptr else torch.tensor([0, 5, 8]),
                                              indices() if indices else ix(),
                                              qo_() if qo_ else qo(), P())

    for tag, fn, names, kind in (("valid", ext(), (), "control"), ("qo_not_from_0",
                                                                   ext(qo_=lambda: torch.tensor([1, 4, 6])),
                                                                   "qo_indptr", "bad"),
                                 ("qo_decreasing", ext(qo_=lambda: torch.tensor([0, 4, 3])), "qo_indptr",
                                  "bad"), ("qo_end", ext(qo_=lambda: torch.tensor([0, 4, 5])), "qo_indptr", "bad"),
                                 ("qo_float", ext(qo_=lambda: torch.tensor([0.0, 4.0, 6.0])), "qo_indptr",
                                  "bad"), ("qo_single", ext(qo_=lambda: torch.tensor([0])), "qo_indptr",
                                           "bad"), ("qo_2d", ext(qo_=lambda: torch.tensor([[0, 4, 6]])), "qo_indptr",
                                                    "bad"), ("more_queries_than_keys",
                                                             ext(indptr=lambda: torch.tensor([0, 3, 8])),
                                                             ("qo_indptr", "kv_indptr"), "bad"),
                                 ("index_past", ext(indices=lambda: torch.tensor([1, 2, 3, 4, 5, 6, 7, 99])),
                                  "kv_indices", "bad")):
        call_case(
            f"core.reference.extend.{tag}", S, "reference/attention.py:paged_extend_attention", tag, fn, names, kind,
            expect=(lambda r: None if not has_nonfinite(r) else ("silent_nan", "NaN")) if kind == "control" else None)


def define_kv_pool_cases():
    torch = _torch()
    from sglang_inkling_backend.kv_pool import HostKVTier, InklingKVPool, tokens_that_fit
    from sglang_inkling_backend.layer_plan import LayerPlan
    S = "core.kv_pool"
    plan = lambda: LayerPlan.from_windows({0: None, 1: 4, 2: None}, num_q_heads=2, num_kv_heads=1, head_dim=32)  # noqa
    for tag, kw, names in (("size_zero", dict(size=0), "size"), ("size_bool", dict(size=True),
                                                                 "size"), ("size_float", dict(size=64.0), "size"),
                           ("page_zero", dict(page_size=0), "page_size"), ("format", dict(kv_format="mxfp4"),
                                                                           "kv_format"), ("k_scale_string",
                                                                                          dict(k_scale="2"), "k_scale"),
                           ("k_scale_huge", dict(k_scale=1e300), "k_scale"), ("k_scale_nan", dict(k_scale=float("nan")),
                                                                              "k_scale"), ("swa_zero", dict(swa_size=0),
                                                                                           "swa_size"),
                           ("mxfp8_size", dict(kv_format="mxfp8", size=100, page_size=128),
                            ("size", "page_size")), ("device_bogus", dict(device="bogus"),
                                                     "device"), ("plan_none", dict(plan=None), "plan")):
        call_case(f"core.InklingKVPool.init.{tag}", S, "kv_pool.py:InklingKVPool.__init__", str(kw),
                  lambda kw=kw: InklingKVPool(**{
                      "plan": plan(),
                      "size": 64,
                      "page_size": 1,
                      **kw
                  }), names)

    def pool_case(tag, defect, call, names, kind="bad", fmt="bf16", expect=None, swa_size=None):

        def build():
            page = 128 if fmt == "mxfp8" else 1
            p = InklingKVPool(plan(), size=256 if fmt == "mxfp8" else 64, page_size=page, kv_format=fmt,
                              swa_size=swa_size if fmt != "mxfp8" else None)
            k = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
            p.set_kv_buffer(0, torch.tensor([3, 4]), k, k)
            bufs = {f"L{i}.{n}": t for i, layer in p.layers.items() for n, t in zip("kvsS", layer.tensors())}
            return Setup(lambda: call(p, k), bufs, expect)

        case(
            f"core.InklingKVPool.{fmt}.{tag}" if fmt != "bf16" else f"core.InklingKVPool.{tag}", S,
            "kv_pool.py:InklingKVPool." +
            call.__name__ if hasattr(call, "__name__") and call.__name__ != "<lambda>" else "kv_pool.py:InklingKVPool",
            defect, build, names, kind)

    T = torch.tensor
    for fmt in ("bf16", "mxfp8"):
        pool_case("set.valid", "valid set_kv_buffer", lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, k), (), "control",
                  fmt, expect=lambda r: None)
        pool_case("set.loc_dup", "loc names slot 5 twice", lambda p, k: p.set_kv_buffer(0, T([5, 5]), k, k), "loc",
                  fmt=fmt)
        pool_case("set.loc_past", "loc past the layer", lambda p, k: p.set_kv_buffer(0, T([5, 10**4]), k, k), "loc",
                  fmt=fmt)
        if fmt == "bf16":
            pool_case("set.cache_v_short", "cache_v with 1 row for 2 slots",
                      lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, k[:1]), "cache_v", fmt=fmt)
        pool_case("set.layer_bool", "layer True (read as layer 1)", lambda p, k: p.set_kv_buffer(True, T([5, 6]), k, k),
                  "layer", fmt=fmt)
    pool_case("set.loc_float", "float loc", lambda p, k: p.set_kv_buffer(0, T([5.0, 6.0]), k, k), "loc")
    pool_case("set.cache_k_int", "int cache_k", lambda p, k: p.set_kv_buffer(0, T([5, 6]), k.int(), k), "cache_k")
    pool_case("set.cache_k_fp8", "float8 cache_k",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), k.to(torch.float8_e4m3fn), k), "cache_k")
    pool_case("set.k_scale_on_bf16", "k_scale 2.0 on a bf16 pool",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, k, 2.0), "k_scale")
    pool_case("set.layer_missing", "layer 7 (not in the plan)", lambda p, k: p.set_kv_buffer(7, T([5, 6]), k, k),
              "layer")
    pool_case("set.layer_string", "layer '0'", lambda p, k: p.set_kv_buffer("0", T([5, 6]), k, k), "layer")
    pool_case("set.swa_past", "loc past a windowed layer's smaller sub-pool (swa_size 16)",
              lambda p, k: p.set_kv_buffer(1, T([5, 40]), k, k), "loc", swa_size=16)
    pool_case(
        "mxfp8_set.scales_shape", "k_scales [2, 2] for [2, 1, 1]",
        lambda p, k: p.set_mxfp8_kv_buffer(0, T([5, 6]), k.to(torch.float8_e4m3fn), torch.zeros(
            2, 2, dtype=torch.uint8), k.to(torch.float8_e4m3fn), torch.zeros(2, 1, dtype=torch.uint8)), "k_scales",
        fmt="mxfp8")
    pool_case(
        "mxfp8_set.data_bf16", "bf16 k_data",
        lambda p, k: p.set_mxfp8_kv_buffer(0, T([5, 6]), k, torch.zeros(2, 1, dtype=torch.uint8),
                                           k.to(torch.float8_e4m3fn), torch.zeros(2, 1, dtype=torch.uint8)), "k_data",
        fmt="mxfp8")
    pool_case(
        "mxfp8_set.scales_list", "v_scales a list",
        lambda p, k: p.set_mxfp8_kv_buffer(0, T([5, 6]), k.to(torch.float8_e4m3fn), torch.zeros(
            2, 1, dtype=torch.uint8), k.to(torch.float8_e4m3fn), [0, 0]), "v_scales", fmt="mxfp8")
    pool_case(
        "mxfp8_set.on_bf16", "set_mxfp8_kv_buffer on a bf16 pool",
        lambda p, k: p.set_mxfp8_kv_buffer(0, T([5, 6]), k.to(torch.float8_e4m3fn), torch.zeros(
            2, 1, dtype=torch.uint8), k.to(torch.float8_e4m3fn), torch.zeros(2, 1, dtype=torch.uint8)), "kv_format")
    for fmt in ("bf16", ):
        pool_case("move.tgt_dup", "tgt_loc names slot 9 twice", lambda p, k: p.move_kv_cache(T([9, 9]), T([3, 4])),
                  "tgt_loc", fmt=fmt)
        pool_case("move.src_past", "src_loc past the pool", lambda p, k: p.move_kv_cache(T([9, 10]), T([3, 10**4])),
                  "src_loc", fmt=fmt)
        pool_case("move.shapes", "tgt_loc 2 slots, src_loc 1", lambda p, k: p.move_kv_cache(T([9, 10]), T([3])),
                  ("tgt_loc", "src_loc"), fmt=fmt)
    pool_case("move.tgt_float", "float tgt_loc", lambda p, k: p.move_kv_cache(T([9.0]), T([3])), "tgt_loc")
    pool_case("read.dtype_int", "read_kv dtype int32", lambda p, k: p.read_kv(0, T([3]), torch.int32), "dtype")
    pool_case("read.slots_past", "read_kv slots past", lambda p, k: p.read_kv(0, T([99])), "slots")
    pool_case("host.num_pages_bool", "HostKVTier num_pages True", lambda p, k: HostKVTier(p, True).num_pages,
              "num_pages")
    pool_case("host.num_pages_zero", "HostKVTier num_pages 0", lambda p, k: HostKVTier(p, 0), "num_pages")
    pool_case("host.layer_missing", "HostKVTier layer_ids [7]", lambda p, k: HostKVTier(p, 2, layer_ids=[7]), "layer")
    pool_case("host.backup_device_past", "backup device_pages past the pool",
              lambda p, k: HostKVTier(p, 2).backup(T([99]), T([0])), "device_pages")
    pool_case("host.backup_host_dup", "backup host_pages [0, 0]",
              lambda p, k: HostKVTier(p, 2).backup(T([1, 2]), T([0, 0])), "host_pages")
    pool_case("host.restore_device_dup", "restore device_pages [1, 1]",
              lambda p, k: HostKVTier(p, 2).restore(T([0, 1]), T([1, 1])), "device_pages")
    pool_case("host.restore_host_past", "restore host_pages past the tier",
              lambda p, k: HostKVTier(p, 2).restore(T([5]), T([1])), "host_pages")
    pool_case("host.float_pages", "float device_pages", lambda p, k: HostKVTier(p, 2).backup(T([1.0]), T([0])),
              "device_pages")
    pool_case("host.shapes", "device_pages 2, host_pages 1", lambda p, k: HostKVTier(p, 2).backup(T([1, 2]), T([0])),
              ("device_pages", "host_pages"))
    for tag, value in (("bool", True), ("negative", -1), ("float", 2.5)):
        call_case(f"core.tokens_that_fit.{tag}", S, "kv_pool.py:tokens_that_fit", f"byte_budget={value!r}",
                  lambda value=value: tokens_that_fit(value, plan(), "bf16"), "byte_budget")


def define_rails_cases():
    torch = _torch()
    from sglang_inkling_backend import kv_views, rails
    S = "core.rails"
    r2t = lambda: torch.arange(40).view(4, 10)  # noqa: E731
    T = torch.tensor
    for tag, fn, names, kind in (
        ("valid", lambda: rails.gather_rails(r2t(), T([1, 2]), T([3, 5])).indices.tolist(), (),
         "control"), ("r2t_1d", lambda: rails.gather_rails(T([1, 2]), T([0]), T([1])), "req_to_token",
                      "bad"), ("seq_past_width", lambda: rails.gather_rails(r2t(), T([1]), T([11])), "seq_lens", "bad"),
        ("seq_negative", lambda: rails.gather_rails(r2t(), T([1]), T([-1])), "seq_lens",
         "bad"), ("row_past", lambda: rails.gather_rails(r2t(), T([4]), T([2])), "req_pool_indices", "bad"),
        ("lengths_differ", lambda: rails.gather_rails(r2t(), T([1, 2]), T([2])), ("req_pool_indices", "seq_lens"),
         "bad"), ("seq_float", lambda: rails.gather_rails(r2t(), T([1]), T([3.5])).indices.tolist(), "seq_lens", "bad"),
        ("rows_float", lambda: rails.gather_rails(r2t(), T([1.7]), T([3])).indices.tolist(), "req_pool_indices",
         "bad"), ("start_past_seq", lambda: rails.gather_rails(r2t(), T([1]), T([3]), T([5])), "start", "bad"),
        ("start_negative", lambda: rails.gather_rails(r2t(), T([1]), T([3]), T([-2])).indices.tolist(), "start",
         "bad"), ("out_buffers_small", lambda: rails.gather_rails(r2t(), T([1]), T([3]), out_indptr=torch.zeros(
             1, dtype=torch.int64), out_indices=torch.zeros(8, dtype=torch.int64)), "out_indptr",
                  "bad"), ("window_zero", lambda: rails.window_start(T([5]), T([1]), 0), "window",
                           "bad"), ("window_bool", lambda: rails.window_start(T([5]), T([1]), True).tolist(), "window",
                                    "bad"), ("window_float", lambda: rails.window_start(T([5]), T([1]), 2.5).tolist(),
                                             "window", "bad"),
        ("translate_short_map", lambda: rails.translate_rails(rails.KVRails(T([0, 2]), T([3, 30])), torch.arange(10)),
         "full_to_swa", "bad"), ("page_table_rows_past", lambda: rails.page_table(r2t(), T([9]), 2), "rows",
                                 "bad"), ("page_table_rows_float",
                                          lambda: rails.page_table(r2t(), T([1.5]), 2).tolist(), "rows", "bad"),
        ("page_table_page_zero", lambda: rails.page_table(r2t(), T([1]), 0), "page_size",
         "bad"), ("page_table_max_pages", lambda: rails.page_table(r2t(), T([1]), 2, 9), "max_pages",
                  "bad"), ("block_table_float", lambda: rails.block_table_token_table(T([[1.0]]), 4), "block_table",
                           "bad"), ("block_size_bool", lambda: rails.block_table_token_table(T([[1]]), True),
                                    "block_size", "bad")):
        fname = ("window_start" if tag.startswith("window") else
                 "translate_rails" if tag.startswith("translate") else "page_table" if tag.startswith(
                     "page_table") else "block_table_token_table" if tag.startswith("block") else "gather_rails")
        call_case(f"core.rails.{tag}", S, f"rails.py:{fname}", tag, fn, names, kind,
                  expect=(lambda r: None) if kind == "control" else (lambda r: ("accepted", str(r))))
    fp8 = lambda: torch.zeros(8, 1, 32, dtype=torch.float8_e4m3fn)  # noqa: E731
    call_case("core.kv_views.paged_kv_format", S, "kv_views.py:paged_kv",
              "kv_format 'mxfp4' (unknown) for e4m3 buffers",
              lambda: kv_views.paged_kv("mxfp4", fp8(), fp8(), page_size=1).kv_format, "kv_format", expect=lambda r:
              ("accepted", f"served as {r}"))
    call_case("core.kv_views.dequantize_query_width", S, "kv_views.py:dequantize_query", "q [2, 100] for 2 heads of 32",
              lambda: kv_views.dequantize_query(torch.zeros(2, 100), 2, 32, None), r"\bq\b")
    call_case(
        "core.kv_views.dequantize_query_descale", S, "kv_views.py:dequantize_query", "q_descale with 3 bytes for 4",
        lambda: kv_views.dequantize_query(torch.zeros(2, 64, dtype=torch.float8_e4m3fn), 2, 32,
                                          torch.zeros(3, dtype=torch.uint8)), "q_descale")
    call_case("core.kv_views.dequantize_query_no_descale", S, "kv_views.py:dequantize_query", "fp8 q without q_descale",
              lambda: kv_views.dequantize_query(torch.zeros(2, 64, dtype=torch.float8_e4m3fn), 2, 32, None),
              "q_descale")


def define_routes_misc_cases():
    torch = _torch()
    from sglang_inkling_backend import layer_step
    from sglang_inkling_backend.routes import choose_route
    from sglang_inkling_backend.scale_layout import ScaleLayout
    S = "core.routes"
    call_case("core.routes.choose_route.string_device", S, "routes.py:choose_route",
              "documented: a device name ('cpu') is a device", lambda: choose_route("cpu").name, kind="control",
              expect=lambda r: None if r == "torch" else ("silent_wrong", r))
    call_case("core.routes.choose_route.valid", S, "routes.py:choose_route", "valid: torch.device('cpu')",
              lambda: choose_route(torch.device("cpu")).name, kind="control", expect=lambda r: None
              if r == "torch" else ("silent_wrong", r))

    def attend(nd=None, out=None):

        def fn():
            Sx = route_setup("torch")
            keys = SimpleNamespace(num_decode_rows=2 if nd is None else nd, max_seq_len=20, plans=Sx.plans,
                                   decode_keys=lambda w, p: Sx.rails, extend_keys=lambda w: (Sx.rails, Sx.qo))
            from sglang_inkling_backend.layer_plan import LayerSpec
            spec = LayerSpec(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D**-0.5)
            return layer_step.attend(Sx.route, spec, Sx.q, Sx.kv, keys, lambda a, b: Sx.params, None,
                                     out() if out else None)

        return fn

    call_case("core.layer_step.attend.num_decode_rows", S, "layer_step.py:attend", "num_decode_rows 3 for 2 query rows",
              attend(nd=3), "num_decode_rows")
    call_case("core.layer_step.attend.out_shape", S, "layer_step.py:attend", "out [3, 4, 32] for 2 rows",
              attend(out=lambda: torch.zeros(3, HQ, D)), "out")
    call_case("core.layer_step.attend.out_int", S, "layer_step.py:attend", "out int32",
              attend(out=lambda: torch.zeros(2, HQ, D, dtype=torch.int32)), "out", expect=lambda r:
              ("silent_wrong", "attention truncated to ints") if r.dtype == torch.int32 else None)
    for tag, fn, names in (
        ("slots_zero", lambda: ScaleLayout.for_pool(0, 1, 32, 1),
         "num_slots"), ("head_dim_48", lambda: ScaleLayout.for_pool(8, 1, 48, 1), "head_dim"),
        ("gather_past",
         lambda: ScaleLayout.for_pool(8, 1, 32, 1).gather(torch.zeros(8, 1, 1, dtype=torch.uint8), torch.tensor([8])),
         "slots"), ("scatter_shape", lambda: ScaleLayout.for_pool(8, 1, 32, 1).scatter(
             torch.zeros(8, 1, 1, dtype=torch.uint8), torch.tensor([1]), torch.zeros(1, 1, 2, dtype=torch.uint8)),
                    "scales"),
        ("scatter_dup", lambda: ScaleLayout.for_pool(8, 1, 32, 1).scatter(torch.zeros(
            8, 1, 1, dtype=torch.uint8), torch.tensor([1, 1]), torch.zeros(2, 1, 1, dtype=torch.uint8)),
         "slots"), ("buffer_noncontig", lambda: ScaleLayout.for_pool(8, 1, 32, 1).gather(
             torch.zeros(8, 1, 2, dtype=torch.uint8)[:, :, :1], torch.tensor([1])), ("sf", "buffer"))):
        call_case(f"core.scale_layout.{tag}", "core.scale_layout", "scale_layout.py:ScaleLayout", tag, fn, names)


# ---------------------------------------------------------------------------------------------------------------
# The SGLang adapter: the pool (load_cpu_copy, get_cpu_copy, set_kv_buffer, move_kv_cache) and the backend's
# forward with a fake ForwardBatch (as tests/hosts/sglang/test_sglang_backend.py builds them)
# ---------------------------------------------------------------------------------------------------------------
def sglang_pool(fmt="mxfp8", layers=2):
    torch = _torch()
    from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class
    page = 128 if fmt == "mxfp8" else 1
    dtype = torch.bfloat16 if fmt == "bf16" else torch.float8_e4m3fn
    return inkling_pool_class(fmt)(256, page, dtype, HKV, D, layers, "cpu", False)


def radix_layer(layer_id, window=-1, head_dim=D):
    from sglang.srt.layers.radix_attention import RadixAttention
    return RadixAttention(HQ, head_dim, 1.0 / math.sqrt(head_dim), HKV, layer_id=layer_id, sliding_window_size=window)


def pool_buffers(pool):
    bufs = {}
    for i in range(pool.layer_num):
        bufs[f"k{i}"], bufs[f"v{i}"] = pool.k_buffer[i], pool.v_buffer[i]
        if pool.KV_FORMAT == "mxfp8":
            sk, sv = pool.core.get_kv_scale_buffer(i)
            bufs[f"sk{i}"], bufs[f"sv{i}"] = sk, sv
    return bufs


def sglang_pool_case(id, defect, mutate, names, kind="bad", fmt="mxfp8", op="load"):
    """load_cpu_copy(saved, indices) after saving slots [3, 130] (layer 1's K written, then zeroed), with one thing of
    S (saved, indices) changed; or get_cpu_copy / set_kv_buffer / move_kv_cache (op)."""

    def build():
        torch = _torch()
        pool = sglang_pool(fmt)
        layer = radix_layer(1)
        src = torch.tensor([3, 130])
        k = torch.randn(2, HKV, D, generator=torch.Generator().manual_seed(8)).bfloat16()
        pool.set_kv_buffer(layer, src, k, k)
        saved = pool.get_cpu_copy(src)
        pool.set_kv_buffer(layer, src, torch.zeros_like(k), torch.zeros_like(k))
        S = SimpleNamespace(pool=pool, layer=layer, saved=saved, indices=src, k=k, loc=torch.tensor([5, 6]),
                            k_scale=None, v_scale=None, tgt=torch.tensor([9, 10]), src=src, kwargs={})
        mutate(S)

        def run():
            if op == "load":
                return pool.load_cpu_copy(S.saved, S.indices)
            if op == "get":
                return pool.get_cpu_copy(S.indices)
            if op == "set":
                return pool.set_kv_buffer(S.layer, S.loc, S.k, S.k, S.k_scale, S.v_scale, **S.kwargs)
            if op == "move":
                return pool.move_kv_cache(S.tgt, S.src)

        def expect(result):
            if op == "load" and kind == "control":
                idx = S.indices.long()
                ok = all(byte_equal(pool.k_buffer[i][idx], S.saved[i][0]) for i in range(pool.layer_num))
                return None if ok else ("silent_wrong", "not restored")
            if op == "get" and kind == "control":
                return None
            return None if kind == "control" else ("accepted", "no error")

        return Setup(run, pool_buffers(pool), expect)

    case(
        f"sglang.pool.{fmt}.{op}.{id}", "sglang.pool", f"hosts/sglang/pool.py:InklingMHATokenToKVPool."
        f"{dict(load='load_cpu_copy', get='get_cpu_copy', set='set_kv_buffer', move='move_kv_cache')[op]}", defect,
        build, names, kind, "sglang")


def define_sglang_pool_cases():
    torch = _torch()
    T = torch.tensor
    L = lambda *a, **k: sglang_pool_case(*a, op="load", **k)  # noqa: E731
    for fmt in ("mxfp8", "bf16"):
        L("valid", "valid: get_cpu_copy's output loaded back", lambda S: None, (), "control", fmt)
        L("duplicate_index", "indices [3, 3]", lambda S: setattr(S, "indices", T([3, 3])), "indices", fmt=fmt)
        L("index_past", "indices [3, 384] (past the pool)", lambda S: setattr(S, "indices", T([3, 384])), "indices",
          fmt=fmt)
        L("one_layer_of_two", "one layer of data for a two-layer pool", lambda S: setattr(S, "saved", S.saved[:1]),
          "kv_cache_cpu", fmt=fmt)
    L("v_short_layer_1", "layer 1's v with 1 row of 2", lambda S: S.saved[1].__setitem__(1, S.saved[1][1][:1]),
      "kv_cache_cpu")
    L("negative_index", "indices [3, -1]", lambda S: setattr(S, "indices", T([3, -1])), "indices")
    L("float_indices", "float indices", lambda S: setattr(S, "indices", T([3.0, 130.0])), "indices")
    L("bool_indices", "bool indices", lambda S: setattr(S, "indices", T([True, False])), "indices")
    L("2d_indices", "2-D indices", lambda S: setattr(S, "indices", T([[3, 130]])), "indices")
    L("list_indices", "indices a list", lambda S: setattr(S, "indices", [3, 130]), "indices")
    L("indices_int32", "valid: int32 indices", lambda S: setattr(S, "indices", T([3, 130], dtype=torch.int32)), (),
      "control")
    L("three_layers", "three layers of data for two", lambda S: setattr(S, "saved", S.saved + S.saved[:1]),
      "kv_cache_cpu")
    L("dict_copy", "kv_cache_cpu a dict", lambda S: setattr(S, "saved", dict(enumerate(S.saved))), "kv_cache_cpu")
    L("entry_of_3", "an entry of 3 tensors", lambda S: S.saved.__setitem__(1, S.saved[1][:3]), "kv_cache_cpu")
    L("k_dtype", "layer 1's k as bf16 (pool is e4m3)",
      lambda S: S.saved[1].__setitem__(0, S.saved[1][0].float().bfloat16()), "kv_cache_cpu")
    L("scales_of_one_slot", "layer 1's k scale bytes for one slot of two",
      lambda S: S.saved[1].__setitem__(2, S.saved[1][2][:1]), "kv_cache_cpu")
    L("scales_e8m0", "layer 0's scale bytes as float8_e8m0fnu (the dtype get_kv_scale_buffer returns)",
      lambda S: S.saved[0].__setitem__(2, S.saved[0][2].view(torch.float8_e8m0fnu)), "kv_cache_cpu")
    L("scales_none", "layer 0's scales None on an MXFP8 pool", lambda S: S.saved[0].__setitem__(2, None),
      "kv_cache_cpu")
    L("k_list", "layer 0's k a list", lambda S: S.saved[0].__setitem__(0, [0]), "kv_cache_cpu")
    L(
        "empty", "valid: no indices, no rows", lambda S:
        (setattr(S, "indices", T([], dtype=torch.int64)),
         setattr(S, "saved", [[t[:0] if t is not None else None for t in e] for e in S.saved])), (), "control")
    sglang_pool_case("bf16_scales_given", "k/v scale tensors in a bf16 pool's copy (ignored)",
                     lambda S: S.saved[0].__setitem__(2, torch.zeros(2, HKV, 1, dtype=torch.uint8)), "kv_cache_cpu",
                     fmt="bf16")
    G = lambda *a, **k: sglang_pool_case(*a, op="get", **k)  # noqa: E731
    G("valid", "valid", lambda S: None, (), "control")
    G("past", "indices [9999]", lambda S: setattr(S, "indices", T([9999])), "indices")
    G("negative", "indices [-1]", lambda S: setattr(S, "indices", T([-1])), "indices")
    G("float", "float indices", lambda S: setattr(S, "indices", T([3.0])), "indices")
    G("list", "indices a list", lambda S: setattr(S, "indices", [3]), "indices")
    G("duplicates", "documented: a slot read twice", lambda S: setattr(S, "indices", T([3, 3])), (), "control")
    Z = lambda *a, **k: sglang_pool_case(*a, op="set", **k)  # noqa: E731
    for fmt in ("mxfp8", "bf16", "fp8_e4m3"):
        Z("valid", "valid set_kv_buffer", lambda S: None, (), "control", fmt)
        Z("loc_past", "loc past the pool", lambda S: setattr(S, "loc", T([5, 10**4])), ("loc", ), fmt=fmt)
        Z("layer_id_override_bool", "layer_id_override=True (read as layer 1)",
          lambda S: S.kwargs.__setitem__("layer_id_override", True), "layer_id_override", fmt=fmt)
    Z("loc_dup", "loc [5, 5]", lambda S: setattr(S, "loc", T([5, 5])), ("loc", ))
    Z("layer_past", "a layer with layer_id 5 (pool holds 0..1)", lambda S: setattr(S, "layer", radix_layer(5)), "layer")
    Z("cache_k_short", "cache_k with 1 row for 2 slots", lambda S: setattr(S, "k", S.k[:1]), ("cache_k", "loc"))
    Z("k_scale_on_mxfp8", "k_scale=2.0 on an MXFP8 pool", lambda S:
      (setattr(S, "k_scale", 2.0), setattr(S, "v_scale", 2.0)), "k_scale")
    Z("k_scale_string", "k_scale='2.0'", lambda S: (setattr(S, "k_scale", "2.0"), setattr(S, "v_scale", 1.0)),
      "k_scale", fmt="fp8_e4m3")
    Z("k_scale_bool", "k_scale=True", lambda S: (setattr(S, "k_scale", True), setattr(S, "v_scale", 1.0)), "k_scale",
      fmt="fp8_e4m3")
    Z("k_scale_huge", "k_scale=1e300", lambda S: (setattr(S, "k_scale", 1e300), setattr(S, "v_scale", 1.0)), "k_scale",
      fmt="fp8_e4m3")
    Z("k_scale_nan", "k_scale=nan", lambda S: (setattr(S, "k_scale", float("nan")), setattr(S, "v_scale", 1.0)),
      "k_scale", fmt="fp8_e4m3")
    Z("k_scale_tensor", "valid: k_scale a one-element tensor", lambda S:
      (setattr(S, "k_scale", T([0.5])), setattr(S, "v_scale", T([0.5]))), (), "control", fmt="fp8_e4m3")
    Z("k_scale_two", "k_scale a 2-element tensor", lambda S:
      (setattr(S, "k_scale", T([0.5, 0.5])), setattr(S, "v_scale", 1.0)), "k_scale", fmt="fp8_e4m3")
    Z(
        "block_scales_bf16", "block-scale tensors for a bf16 pool", lambda S:
        (setattr(S, "k_scale", torch.zeros(2, HKV, 1, dtype=torch.uint8)),
         setattr(S, "v_scale", torch.zeros(2, HKV, 1, dtype=torch.uint8))), ("k_scale", "block"), fmt="bf16")
    Z(
        "block_scales_shape", "pre-quantized K/V with block scales [2, 2, 2] (needs [2, 2, 1])", lambda S:
        (setattr(S, "k", S.k.to(torch.float8_e4m3fn)), setattr(S, "k_scale", torch.zeros(2, HKV, 2, dtype=torch.uint8)),
         setattr(S, "v_scale", torch.zeros(2, HKV, 2, dtype=torch.uint8))), "k_scales")
    Z(
        "block_scales_one", "block scales for K only",
        lambda S: (setattr(S, "k", S.k.to(torch.float8_e4m3fn)),
                   setattr(S, "k_scale", torch.zeros(2, HKV, 1, dtype=torch.uint8))), ("k_scale", "v_scale"))
    Z("layer_int", "layer an int (0), not a layer object", lambda S: setattr(S, "layer", 0), "layer")
    M = lambda *a, **k: sglang_pool_case(*a, op="move", **k)  # noqa: E731
    M("valid", "valid move", lambda S: None, (), "control")
    M("tgt_dup", "tgt_loc [9, 9]", lambda S: setattr(S, "tgt", T([9, 9])), "tgt_loc")
    M("src_past", "src_loc past the pool", lambda S: setattr(S, "src", T([3, 10**4])), "src_loc")
    M("shapes", "tgt_loc 2, src_loc 1", lambda S: setattr(S, "src", T([3])), ("tgt_loc", "src_loc"))


class SGLangHarness:
    """An InklingAttnBackend on a bf16 pool (2 layers: window 3 i.e. 4 visible keys, and full), a ReqToTokenPool
    and a scripted allocator; requests 0 and 1 prefilled with 9 and 5 tokens; history kept for the dense reference."""

    def __init__(self, fmt="bf16", route="torch"):
        torch = _torch()
        from types import SimpleNamespace as NS
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend
        self.layers = torch.nn.ModuleList([radix_layer(0, 3), radix_layer(1, -1)])
        self.r2t = ReqToTokenPool(8, 64, "cpu", False)
        self.pool = sglang_pool(fmt)
        self.runner = NS(device="cpu", req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, dtype=torch.bfloat16,
                         page_size=1, kv_cache_dtype=torch.bfloat16, model=self.layers,
                         model_config=NS(is_encoder_decoder=False, head_dim=D, context_len=64))
        self.backend = InklingAttnBackend(self.runner)
        if route == "triton":  # the CPU picks torch; the tests serve SGLang through the Triton route this way
            from sglang_inkling_backend.gpu.route import GpuRoute
            self.backend.use_route(GpuRoute())
        self.gen = torch.Generator().manual_seed(11)
        self.free = list(range(1, 256))
        self.history = {}
        fb = self.batch([0, 1], [9, 5], decode=False)
        self.step(fb)

    def batch(self, rows, new_lens, decode):
        torch = _torch()
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        prefix = torch.tensor([len(self.history.get((r, 0), [])) for r in rows], dtype=torch.int64)
        new = torch.tensor(new_lens, dtype=torch.int64)
        seq = prefix + new
        locs = []
        for r, p, n in zip(rows, prefix.tolist(), new_lens):
            slots = torch.tensor(self.free[:n], dtype=torch.int64)
            self.free = self.free[n:]
            self.r2t.req_to_token[r, p:p + n] = slots.to(torch.int32)
            locs.append(slots)
        return SimpleNamespace(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(rows),
            req_pool_indices=torch.tensor(rows), seq_lens=seq, seq_lens_cpu=seq.clone(), seq_lens_sum=int(
                seq.sum()), out_cache_loc=torch.cat(locs), out_cache_loc_is_physical=False,
            extend_seq_lens=None if decode else new, extend_seq_lens_cpu=None if decode else new.tolist(),
            extend_prefix_lens=None if decode else prefix, extend_prefix_lens_cpu=None if decode else prefix.tolist(),
            encoder_lens=None, encoder_out_cache_loc=None, spec_info=None)

    def qkv(self, fb):
        torch = _torch()
        t = int(fb.out_cache_loc.numel())
        rnd = lambda *s: torch.randn(*s, generator=self.gen).bfloat16()  # noqa: E731
        return rnd(t, HQ * D), rnd(t, HKV, D), rnd(t, HKV, D)

    def record(self, fb, layer_id, k, v):
        qlens = fb.extend_seq_lens.tolist() if fb.extend_seq_lens is not None else [1] * fb.batch_size
        start = 0
        for r, n in zip(fb.req_pool_indices.tolist(), qlens):
            self.history.setdefault((r, layer_id), []).extend(zip(k[start:start + n], v[start:start + n]))
            start += n

    def step(self, fb):
        self.backend.init_forward_metadata(fb)
        for layer in self.layers:
            q, k, v = self.qkv(fb)
            self.record(fb, layer.layer_id, k, v)
            self.backend.forward(q, k, v, layer, fb)

    def dense(self, fb, layer_id, q, sinks=None, rel_bias=None):
        torch = _torch()
        qlens = fb.extend_seq_lens.tolist() if fb.extend_seq_lens is not None else [1] * fb.batch_size
        window = 4 if layer_id == 0 else None
        out, start = [], 0
        for r, n in zip(fb.req_pool_indices.tolist(), qlens):
            hist = self.history[(r, layer_id)]
            k = torch.stack([h[0] for h in hist])
            v = torch.stack([h[1] for h in hist])
            qq = q[start:start + n].float().view(n, HQ, D)
            rb = rel_bias[start:start + n] if rel_bias is not None else None
            out.append(dense_attention(qq, k, v, 1.0 / math.sqrt(D), window, sinks, rb).reshape(n, HQ * D))
            start += n
        return torch.cat(out)


def sglang_forward_case(id, defect, mutate, names, kind="bad", decode=True, layer_id=0, init_in_call=False,
                        route="torch"):
    """A decode (or extend) step of requests 0 and 1 through InklingAttnBackend.forward (layer 0, window 4),
    after ``mutate(S)`` changes one thing (S.fb, S.q, S.k, S.v, S.kwargs, S.layer, S.r2t). With ``init_in_call``
    the call is init_forward_metadata + forward, else only forward."""

    def build():
        H = SGLangHarness(route=route)
        fb = H.batch([0, 1], [1, 1] if decode else [3, 2], decode=decode)
        q, k, v = H.qkv(fb)
        H.record(fb, layer_id, k, v)
        S = SimpleNamespace(H=H, fb=fb, q=q, k=k, v=v, kwargs={}, layer=H.layers[layer_id], sinks=None, rel_bias=None,
                            save_kv_cache=True)
        want = H.dense(fb, layer_id, q)
        if not init_in_call:
            H.backend.init_forward_metadata(fb)
        mutate(S)
        if S.sinks is not None or S.rel_bias is not None:
            want = H.dense(fb, layer_id, q, S.sinks, S.rel_bias)

        def run():
            if init_in_call:
                H.backend.init_forward_metadata(S.fb)
            return H.backend.forward(S.q, S.k, S.v, S.layer, S.fb, save_kv_cache=S.save_kv_cache, **S.kwargs)

        bufs = pool_buffers(H.pool)
        bufs["req_to_token"] = H.r2t.req_to_token
        return Setup(run, bufs, want, atol=2**-6)

    triton = route == "triton"
    case(
        f"sglang.forward{'.triton' if triton else ''}.{id}", "sglang.forward" + (".triton" if triton else ""),
        "hosts/sglang/backend.py:InklingAttnBackend." +
        ("init_forward_metadata + forward" if init_in_call else "forward") + (" (decode" if decode else " (extend") +
        (", GpuRoute)" if triton else ", TorchRoute)"), defect, build, names, kind,
        "sglang-triton" if triton else "sglang")


def define_sglang_forward_cases():
    torch = _torch()
    T = torch.tensor
    F = sglang_forward_case
    F("valid_decode", "valid decode step", lambda S: None, (), "control")
    F("valid_extend", "valid extend step", lambda S: None, (), "control", decode=False)
    F("valid_full_layer", "valid decode, full layer", lambda S: None, (), "control", layer_id=1)
    F(
        "valid_sinks_bias", "valid: sinks and a relative bias", lambda S:
        (setattr(S, "sinks", T([0.5, -1.0, 2.0, 0.0])), setattr(S, "rel_bias", torch.randn(2, HQ, 6)),
         S.kwargs.update(sinks=S.sinks, rel_bias=S.rel_bias)), (), "control")

    def fbset(name, value):

        def mutate(S):
            setattr(S.fb, name, value(S) if callable(value) else value)
            if name == "seq_lens":
                S.fb.seq_lens_cpu = S.fb.seq_lens.clone()

        return mutate

    # features the backend does not implement: refused by name as checks.UnsupportedFeature (a ValueError, and a
    # NotImplementedError as SGLang's own backends raise there)
    def softcap_score_mod(score, *args):
        return score

    F("unsupported_return_lse", "return_lse=True (not implemented)", lambda S: S.kwargs.update(return_lse=True),
      "return_lse")
    F("unsupported_score_mod", "a score_mod other than the relative bias", lambda S: S.kwargs.update(
        score_mod=softcap_score_mod, aux_tensors=[torch.zeros(2, HQ, 6)]), "score_mod")
    F("req_index_past", "req_pool_indices [0, 9] (req_to_token has 9 rows)", fbset("req_pool_indices", T([0, 9])),
      "req_pool_indices", init_in_call=True)
    F("seq_past_context", "seq_lens past the context (65 > 64)", fbset("seq_lens", T([65, 6])), "seq_lens",
      init_in_call=True)
    F("seq_zero", "decode seq_lens 0", fbset("seq_lens", T([0, 6])), "seq_lens", init_in_call=True)
    F("seq_negative", "decode seq_lens -2", fbset("seq_lens", T([-2, 6])), "seq_lens", init_in_call=True)
    F("seq_float", "float seq_lens", fbset("seq_lens", T([10.0, 6.0])), "seq_lens", init_in_call=True)
    F("extend_lens_past_seq", "extend_seq_lens [13, 2] past seq_lens [12, 7]", fbset("extend_seq_lens", T([13, 2])),
      "extend_seq_lens", decode=False, init_in_call=True)
    F("extend_lens_count", "extend_seq_lens with 1 entry for 2 requests", fbset("extend_seq_lens", T([3])),
      "extend_seq_lens", decode=False, init_in_call=True)
    F("r2t_slot_past_pool", "req_to_token names a slot past the pool for a key of request 0",
      lambda S: S.H.r2t.req_to_token.__setitem__((0, 8), 9999), ("req_to_token", ), init_in_call=True)
    F("r2t_slot_negative", "req_to_token names slot -1 for a key of request 0",
      lambda S: S.H.r2t.req_to_token.__setitem__((0, 8), -1), ("req_to_token", ), init_in_call=True)
    F("out_cache_loc_past", "out_cache_loc past the pool", fbset("out_cache_loc", T([5, 9999])), "out_cache_loc")
    F("out_cache_loc_dup", "out_cache_loc names one slot twice",
      fbset("out_cache_loc", lambda S: S.fb.out_cache_loc[:1].repeat(2)), "out_cache_loc")
    F("out_cache_loc_short", "out_cache_loc with 1 slot for 2 tokens",
      fbset("out_cache_loc", lambda S: S.fb.out_cache_loc[:1]), "out_cache_loc")
    F("out_cache_loc_float", "float out_cache_loc", fbset("out_cache_loc", lambda S: S.fb.out_cache_loc.float()),
      "out_cache_loc")
    F("q_width", "q [2, 100] (layer needs 4*32)", lambda S: setattr(S, "q",
                                                                    torch.zeros(2, 100).bfloat16()), (r"\bq\b", ))
    F("q_rows", "q with 3 rows for 2 tokens", lambda S: setattr(S, "q",
                                                                torch.zeros(3, HQ * D).bfloat16()), (r"\bq\b", ))
    F("q_int", "int32 q", lambda S: setattr(S, "q", torch.ones(2, HQ * D, dtype=torch.int32)), (r"\bq\b", ))
    F("k_width", "k [2, 3, 32] (layer has 2 KV heads)", lambda S: setattr(S, "k",
                                                                          torch.zeros(2, 3, D).bfloat16()),
      (r"\bk\b", "cache_k"))
    F("k_int", "int k", lambda S: setattr(S, "k", torch.ones(2, HKV, D, dtype=torch.int32)), (r"\bk\b", "cache_k"))
    F("v_none_save", "v None with save_kv_cache (k given)", lambda S: setattr(S, "v", None), (r"\bv\b", ))
    F(
        "no_save", "documented: save_kv_cache=False, k/v None (the model stored K/V itself)", lambda S:
        (S.H.pool.set_kv_buffer(S.layer, S.fb.out_cache_loc, S.k, S.v), setattr(S, "save_kv_cache", False),
         setattr(S, "k", None), setattr(S, "v", None)), (), "control")
    F("sinks_shape", "sinks [3] for 4 heads", lambda S: S.kwargs.update(sinks=torch.zeros(3)), "sinks")
    F("sinks_nan", "a NaN sink", lambda S: S.kwargs.update(sinks=T([float("nan"), 0.0, 0.0, 0.0])), "sinks")
    F("sinks_inf", "a +inf sink", lambda S: S.kwargs.update(sinks=T([float("inf"), 0.0, 0.0, 0.0])), "sinks")
    F("rel_bias_nan", "a NaN relative bias entry",
      lambda S: S.kwargs.update(rel_bias=torch.zeros(2, HQ, 6).index_fill_(2, T([0]), float("nan"))), "rel_bias")
    F("rel_bias_inf", "a +inf relative bias entry",
      lambda S: S.kwargs.update(rel_bias=torch.zeros(2, HQ, 6).index_fill_(2, T([1]), float("inf"))), "rel_bias")
    F("rel_bias_rows", "rel_bias [3, 4, 6] for 2 rows", lambda S: S.kwargs.update(rel_bias=torch.zeros(3, HQ, 6)),
      "rel_bias")
    F("rel_bias_int", "int rel_bias", lambda S: S.kwargs.update(rel_bias=torch.zeros(2, HQ, 6, dtype=torch.int32)),
      "rel_bias")
    F("q_descale_bf16", "q_descale with a bf16 q (ignored)",
      lambda S: S.kwargs.update(q_descale=torch.zeros(2, HQ, 1, dtype=torch.uint8)), "q_descale")
    F("q_fp8_no_descale", "float8 q without q_descale", lambda S: setattr(S, "q", S.q.to(torch.float8_e4m3fn)),
      "q_descale")
    F("k_descale_only", "k_descale without v_descale",
      lambda S: S.kwargs.update(k_descale=torch.zeros(2, HKV, 1, dtype=torch.uint8)), ("k_descale", "v_descale"))
    F("layer_unknown", "a layer with layer_id 7", lambda S: setattr(S, "layer", radix_layer(7)), ("layer", ))

    # the same backend on the Triton route (kernels under the interpreter; one process per case)
    for route in ("triton", ):
        F("valid_decode", "valid decode step", lambda S: None, (), "control", route=route)
        F("valid_extend", "valid extend step", lambda S: None, (), "control", decode=False, route=route)
        F("r2t_slot_past_pool", "req_to_token names a slot past the pool for a key of request 0",
          lambda S: S.H.r2t.req_to_token.__setitem__((0, 8), 9999), ("req_to_token", ), init_in_call=True, route=route)
        F("r2t_slot_negative", "req_to_token names slot -1 for a key of request 0",
          lambda S: S.H.r2t.req_to_token.__setitem__((0, 8), -1), ("req_to_token", ), init_in_call=True, route=route)
        F("extend_r2t_slot_past_pool", "extend: req_to_token names a slot past the pool",
          lambda S: S.H.r2t.req_to_token.__setitem__(
              (0, 10), 9999), ("req_to_token", ), decode=False, init_in_call=True, route=route)
        F("q_width", "q [2, 100] (layer needs 4*32)", lambda S: setattr(S, "q",
                                                                        torch.zeros(2, 100).bfloat16()), (r"\bq\b", ),
          route=route)
        F("sinks_nan", "a NaN sink", lambda S: S.kwargs.update(sinks=T([float("nan"), 0.0, 0.0, 0.0])), "sinks",
          route=route)


# ---------------------------------------------------------------------------------------------------------------
# Running and classifying
# ---------------------------------------------------------------------------------------------------------------
def define_verify_graph_cases():
    """A verify step's graph metadata (``SpecVerify.uniform``, ``VerifyGraphBuffers``) and the Triton extend's
    step grid (``extend_blocks``): bad input refused naming it, the graph buffers untouched."""
    torch = _torch()
    from sglang_inkling_backend.attention_inputs import SpecVerify
    from sglang_inkling_backend.hosts.sglang.metadata import VerifyGraphBuffers
    S = "core.attention_inputs"
    d, b = 3, 2
    T = torch.tensor

    def uniform(mask=None, ptr=None, depths=None, draft=d, batch=b):
        return lambda: SpecVerify.uniform(torch.ones(b * d * d, dtype=torch.bool) if mask is None else mask(),
                                          torch.arange(b + 1) * d * d if ptr is None else ptr(),
                                          torch.zeros(b * d, dtype=torch.int64) if depths is None else depths(),
                                          draft, batch).draft_lens

    for tag, fn, names, kind in (
            ("valid", uniform(), (), "control"),
            ("mask_uint8", uniform(mask=lambda: torch.ones(b * d * d, dtype=torch.uint8)), "tree_mask", "bad"),
            ("mask_short", uniform(mask=lambda: torch.ones(b * d * d - 1, dtype=torch.bool)), "tree_mask", "bad"),
            ("ptr_int32", uniform(ptr=lambda: (torch.arange(b + 1) * d * d).int()), "mask_indptr", "bad"),
            ("depths_2d", uniform(depths=lambda: torch.zeros(b, d, dtype=torch.int64)), "depths", "bad"),
            ("depths_meta", uniform(depths=lambda: torch.zeros(b * d, dtype=torch.int64, device="meta")), "depths",
             "bad"),
            ("draft_zero", uniform(draft=0), "draft_len", "bad"),
            ("draft_bool", uniform(draft=True), "draft_len", "bad"),
            ("batch_float", uniform(batch=2.0), "batch", "bad")):
        call_case(f"core.attention_inputs.spec_verify_uniform.{tag}", S, "attention_inputs.py:SpecVerify.uniform",
                  tag, fn, names, kind, expect=(lambda r: None) if kind == "control" else
                  (lambda r: ("accepted", str(r))))

    S = "sglang.verify_graph_buffers"
    for tag, args, names in (("max_bs_zero", (0, d, 40), "max_bs"), ("draft_past_context", (4, 40, 40), "draft_len"),
                             ("draft_bool", (4, True, 40), "draft_len")):
        call_case(f"sglang.verify_graph_buffers.init_{tag}", S, "hosts/sglang/metadata.py:VerifyGraphBuffers",
                  tag, lambda a=args: VerifyGraphBuffers(*a, [6], "cpu", swa=False), names,
                  expect=lambda r: ("accepted", "constructed"))

    def refill_setup(mutate, swa=False):
        def build():
            r2t = (torch.randperm(8 * 40, generator=torch.Generator().manual_seed(3)) + 1).view(8, 40).int()
            buffers = VerifyGraphBuffers(4, d, 40, [6], "cpu", swa=swa)
            rows, prefix = T([3, 1, 0, 0]), T([20, 5, 1, 1])
            positions = T([20, 21, 21, 5, 6, 7] + [0] * 6)
            mask = torch.cat([torch.cat([torch.ones(d, p, dtype=torch.bool), torch.eye(d, dtype=torch.bool)],
                                        1).reshape(-1) for p in (20, 5)])
            args = dict(req_to_token=r2t, req_pool_indices=rows, seq_lens=prefix, positions=positions, mask=mask,
                        num_real=2, seq_lens_host=prefix.clone(),
                        full_to_swa=torch.arange(400) if swa else None,
                        out_cache_loc=torch.arange(6) + 100 if swa else None)
            mutate(args)
            snap = {f"buffer{i}": t for i, t in enumerate(buffers.tensors())}
            return Setup(lambda: buffers.refill(**args).verify.draft_lens, snap,
                         (lambda r: None) if mutate is _keep else (lambda r: ("accepted", str(r))))
        return build

    for tag, mutate, names in (
            ("valid", _keep, ()),
            ("mask_short", lambda a: a.update(mask=a["mask"][:-1]), "mask"),
            ("mask_int", lambda a: a.update(mask=a["mask"].int()), "mask"),
            ("positions_short", lambda a: a.update(positions=a["positions"][:-1]), "positions"),
            ("positions_float", lambda a: a.update(positions=a["positions"].float()), "positions"),
            ("num_real_past", lambda a: a.update(num_real=5), "num_real"),
            ("num_real_bool", lambda a: a.update(num_real=True), "num_real"),
            ("host_past_context", lambda a: a.update(seq_lens_host=T([38, 5, 1, 1])), "seq_lens_host"),
            ("host_on_wrong_count", lambda a: a.update(seq_lens_host=T([20, 5])), "seq_lens_host"),
            ("batch_past_max_bs", lambda a: a.update(req_pool_indices=T([3, 1, 0, 0, 0]), seq_lens=T([20, 5, 1, 1, 1]),
                                                     seq_lens_host=None), "max_bs"),
            ("map_without_swa", lambda a: a.update(full_to_swa=torch.arange(400)), "full_to_swa")):
        case(f"sglang.verify_graph_buffers.refill_{tag}", S, "hosts/sglang/metadata.py:VerifyGraphBuffers.refill",
             tag, refill_setup(mutate), names, "control" if tag == "valid" else "bad")
    case("sglang.verify_graph_buffers.refill_swa_loc_count", S,
         "hosts/sglang/metadata.py:VerifyGraphBuffers.refill", "5 write slots for 2 real requests of 3 drafts",
         refill_setup(lambda a: a.update(out_cache_loc=torch.arange(5) + 100), swa=True), "out_cache_loc")

    from sglang_inkling_backend import triton as kernels
    S = "core.triton.extend_blocks"
    for tag, fn, names in (("qo_float", lambda: kernels.extend_blocks(T([0.0, 4.0]), 8, 2), "qo_indptr"),
                           ("heads_not_multiple", lambda: kernels.extend_blocks(T([0, 4]), 6, 4), "num_q_heads"),
                           ("block_rows_odd", lambda: kernels.extend_blocks(T([0, 4]), 8, 2, block_rows=24),
                            "block_rows")):
        call_case(f"core.triton.extend_blocks.{tag}", S, "triton/extend_attention.py:extend_blocks", tag, fn, names,
                  expect=lambda r: ("accepted", str(r)))

    # A split verify launch's partials in the caller's workspace (uniform_verify_attention's workspace=) and the
    # workspace's size (verify_workspace_shape): refused by name before the output is written.
    S = "core.triton.verify_workspace"

    def split_verify(workspace):
        def build():
            from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
            g = torch.Generator().manual_seed(5)
            kv = PagedKV(torch.randn(64, 2, 32, generator=g).bfloat16(), torch.randn(64, 2, 32, generator=g).bfloat16())
            lens = [10 + d, 5 + d]
            indptr, indices = T([0, *lens]).cumsum(0), torch.arange(sum(lens))
            tree = SpecVerify.uniform(torch.ones(d, d, dtype=torch.bool).tril().repeat(b, 1, 1).reshape(-1),
                                      torch.arange(b + 1) * d * d, torch.arange(d).repeat(b), d, b)
            q = torch.randn(b * d, 4, 32, generator=g).bfloat16()
            out = torch.full(q.shape, 7.0)
            return Setup(lambda: kernels.uniform_verify_attention(q, kv, indptr, indices, torch.arange(b + 1) * d,
                                                                  AttentionParams(32 ** -0.5), tree, d, out=out,
                                                                  num_splits=2, workspace=workspace()),
                         {"out": out})
        return build

    for tag, workspace, names, kind in (
            ("valid", lambda: kernels.DecodeWorkspace(b * d, 4, 32, 2, "cpu"), (), "control"),
            ("too_small", lambda: kernels.DecodeWorkspace(b * d, 4, 32, 1, "cpu"), "workspace", "bad"),
            ("not_a_workspace", lambda: "scratch", "workspace", "bad"),
            ("meta_device", lambda: kernels.DecodeWorkspace(b * d, 4, 32, 2, "meta"), "workspace", "bad")):
        case(f"core.triton.verify_workspace.launch_{tag}", S, "triton/extend_attention.py:uniform_verify_attention",
             tag, split_verify(workspace), names, kind)
    for tag, args, names in (("max_batch_zero", (0, d, 4, 2), "max_batch"), ("draft_bool", (4, True, 4, 2),
                                                                              "draft_len")):
        call_case(f"core.triton.verify_workspace.shape_{tag}", S, "triton/extend_attention.py:verify_workspace_shape",
                  tag, lambda a=args: kernels.verify_workspace_shape(*a, "cpu"), names,
                  expect=lambda r: ("accepted", str(r)))


# ---------------------------------------------------------------------------------------------------------------
# Arguments of the wrong kind: the classes behind wrong exception types and a silent no-op. Each class is probed
# at every public entry it reaches, not only where the issue met it:
#   device   a tensor on the meta device (shapes, no data), a device torch cannot reach here (a constructor's
#            device, pinned memory without an accelerator): checks.require_tensor / checks.require_device
#   list     a Python list (or None) where a tensor goes: checks.require_tensor
#   bypass   a value object built without its checking factory (ScaleLayout(...) rather than for_pool, a layout
#            that is not a ScaleLayout, rails of lists): the checks live in the constructor itself
#   extent   a dimension of 0 where one is needed (a relative bias reaching no distance, no heads) and tensors read
#            together whose shapes differ (K and V head dims): checks.require_extents / require_same_shape
#   count    a per-request array shorter than its count (also when set after construction): checks.require_entries
# ---------------------------------------------------------------------------------------------------------------
def _unreachable_cuda() -> str:
    """A CUDA device torch cannot reach on any machine: the index past this machine's count (cuda:0 without CUDA)."""
    torch = _torch()
    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


def define_tensor_kind_cases():
    torch = _torch()
    from sglang_inkling_backend import checks, kv_views, layer_step, mxfp8, rails
    from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
    from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext
    from sglang_inkling_backend.kv_pool import HostKVTier, InklingKVPool
    from sglang_inkling_backend.layer_plan import LayerPlan
    from sglang_inkling_backend.reference.attention import paged_decode_attention, paged_extend_attention
    from sglang_inkling_backend.scale_layout import ScaleLayout
    T = torch.tensor
    meta = lambda t: t.to("meta")  # noqa: E731
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    plan = lambda: LayerPlan.from_windows({0: None, 1: 4, 2: None}, num_q_heads=2, num_kv_heads=1, head_dim=32)  # noqa

    # --- the core pool and its host tier: every buffer snapshotted, so a write before the error shows ----------
    def pool_case(tag, defect, call, names, kind="bad", fmt="bf16"):
        def build():
            page = 128 if fmt == "mxfp8" else 1
            p = InklingKVPool(plan(), size=256 if fmt == "mxfp8" else 64, page_size=page, kv_format=fmt)
            k = torch.randn(2, 1, 32, generator=g(1)).bfloat16()
            p.set_kv_buffer(0, T([3, 4]), k, k)
            bufs = {f"L{i}.{n}": t for i, layer in p.layers.items() for n, t in zip("kvsS", layer.tensors())}
            return Setup(lambda: call(p, k), bufs, (lambda r: None) if kind == "control" else None)

        case(f"core.InklingKVPool.{fmt}.{tag}" if fmt != "bf16" else f"core.InklingKVPool.{tag}", "core.kv_pool",
             "kv_pool.py:InklingKVPool / HostKVTier", defect, build, names, kind)

    fp8 = lambda x: x.to(torch.float8_e4m3fn)  # noqa: E731
    scales = lambda: torch.zeros(2, 1, 1, dtype=torch.uint8)  # noqa: E731
    pool_case("set.meta_cache_k", "set_kv_buffer: cache_k on the meta device (issue #58)",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), meta(k), k), "cache_k")
    pool_case("set.meta_cache_v", "set_kv_buffer: cache_v on the meta device",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, meta(k)), "cache_v")
    pool_case("set.meta_loc", "set_kv_buffer: loc on the meta device (issue #58)",
              lambda p, k: p.set_kv_buffer(0, meta(T([5, 6])), k, k), "loc")
    pool_case("set.meta_loc", "set_kv_buffer: loc on the meta device", lambda p, k: p.set_kv_buffer(
        0, meta(T([130, 131])), k, k), "loc", fmt="mxfp8")
    pool_case("set_mxfp8.meta_k_scales", "set_mxfp8_kv_buffer: k_scales on the meta device",
              lambda p, k: p.set_mxfp8_kv_buffer(0, T([130, 131]), fp8(k), meta(scales()), fp8(k), scales()),
              "k_scales", fmt="mxfp8")
    pool_case("set_mxfp8.meta_v_data", "set_mxfp8_kv_buffer: v_data on the meta device",
              lambda p, k: p.set_mxfp8_kv_buffer(0, T([130, 131]), fp8(k), scales(), meta(fp8(k)), scales()),
              "v_data", fmt="mxfp8")
    pool_case("move.meta_src_loc", "move_kv_cache: src_loc on the meta device",
              lambda p, k: p.move_kv_cache(T([9, 10]), meta(T([3, 4]))), "src_loc")
    pool_case("read.meta_slots", "read_kv: slots on the meta device", lambda p, k: p.read_kv(0, meta(T([3]))),
              "slots")
    pool_case("host.backup_meta_device_pages", "HostKVTier.backup: device_pages on the meta device",
              lambda p, k: HostKVTier(p, 2).backup(meta(T([3])), T([0])), "device_pages")
    pool_case("host.restore_meta_host_pages", "HostKVTier.restore: host_pages on the meta device",
              lambda p, k: HostKVTier(p, 2).restore(meta(T([0])), T([3])), "host_pages")
    pool_case("host.backup_list_device_pages", "HostKVTier.backup: device_pages a Python list (issue #58)",
              lambda p, k: HostKVTier(p, 2).backup([3], T([0])), "device_pages")
    pool_case("host.backup_list_host_pages", "HostKVTier.backup: host_pages a Python list",
              lambda p, k: HostKVTier(p, 2).backup(T([3]), [0]), "host_pages")
    pool_case("host.restore_list_device_pages", "HostKVTier.restore: device_pages a Python list",
              lambda p, k: HostKVTier(p, 2).restore(T([0]), [3]), "device_pages")
    pool_case("host.backup_none", "HostKVTier.backup: device_pages None", lambda p, k: HostKVTier(p, 2).backup(
        None, T([0])), "device_pages")
    pool_case("set.list_loc", "set_kv_buffer: loc a Python list", lambda p, k: p.set_kv_buffer(0, [5, 6], k, k), "loc")
    # writes before checks (issue #65): K/V of a dtype the pool cannot take, K/V that are views of the pool's own
    # buffers, and K/V that require grad (valid: the pool stays out of the caller's autograd graph)
    for fmt, loc in (("bf16", [5, 6]), ("mxfp8", [130, 131])):
        pool_case("set.float64_cache_k", "set_kv_buffer: cache_k in float64", lambda p, k, loc=loc: p.set_kv_buffer(
            0, T(loc), k.double(), k), "cache_k", fmt=fmt)
        pool_case("set.int_cache_v", "set_kv_buffer: cache_v an int32 tensor", lambda p, k, loc=loc: p.set_kv_buffer(
            0, T(loc), k, k.int()), "cache_v", fmt=fmt)
        pool_case("set.requires_grad_control", "set_kv_buffer: K/V that require grad (valid)",
                  lambda p, k, loc=loc: p.set_kv_buffer(0, T(loc), k.float().requires_grad_(), k), "cache_k",
                  kind="control", fmt=fmt)
    pool_case("set.cache_k_view_of_pool", "set_kv_buffer: cache_k a view of the pool's own K buffer",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), p.get_key_buffer(0)[3:5], k), "cache_k")
    pool_case("set.cache_v_view_of_pool", "set_kv_buffer: cache_v a view of the pool's own V buffer",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, p.get_value_buffer(0)[3:5]), "cache_v")
    pool_case("set.cache_v_from_another_layer_control", "set_kv_buffer: cache_v read from layer 2's V buffer "
              "(valid: another layer's storage, not the one written)",
              lambda p, k: p.set_kv_buffer(0, T([5, 6]), k, p.get_value_buffer(2)[3:5]), "cache_v",
              kind="control")
    accelerator = getattr(torch, "accelerator", None)
    if not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available()):
        pool_case("host.pin_memory_without_accelerator", "HostKVTier(pin_memory=True) where torch has no "
                  "accelerator (pinned memory needs one)", lambda p, k: HostKVTier(p, 2, pin_memory=True),
                  "pin_memory")
    pool_case("host.pin_memory_int", "HostKVTier(pin_memory=1)", lambda p, k: HostKVTier(p, 2, pin_memory=1),
              "pin_memory")

    # --- constructors that take a device --------------------------------------------------------------------
    unreachable = _unreachable_cuda()
    for tag, device in (("device_unreachable", unreachable), ("device_meta", "meta"),
                        ("device_torch_unreachable", torch.device(unreachable))):
        call_case(f"core.InklingKVPool.init.{tag}", "core.kv_pool", "kv_pool.py:InklingKVPool.__init__",
                  f"device={device!r} (issue #58: 'cuda' without CUDA was torch's AssertionError)",
                  lambda device=device: InklingKVPool(plan(), 64, 1, device=device), "device")
    for tag, device in (("device_unreachable", unreachable), ("device_meta", "meta")):
        call_case(f"core.scale_layout.empty_{tag}", "core.scale_layout", "scale_layout.py:ScaleLayout.empty",
                  f"device={device!r}", lambda device=device: ScaleLayout.for_pool(8, 1, 32, 1).empty(device), "device")
    call_case("core.SpecVerify.from_trees_device_unreachable", "core.attention_inputs",
              "attention_inputs.py:SpecVerify.from_trees", f"device={unreachable!r}",
              lambda: SpecVerify.from_trees([(torch.ones(1, 1, dtype=torch.bool), T([0]))], device=unreachable),
              "device")

    def layer_view(device):
        from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
        return vllm_layer_view(BlockCacheLayout("bf16", HKV, D, BS), 4, device=device)

    for tag, device in (("device_unreachable", unreachable), ("device_meta", "meta")):
        call_case(f"vllm.layer.view_{tag}", "vllm.layer", "hosts/vllm/block_cache.py:vllm_layer_view",
                  f"device={device!r}", lambda device=device: layer_view(device), "device")

    # --- the core's value objects and readers: meta, lists, factory bypass, zero extents -----------------------
    S = "core.attention_inputs"
    kvp = lambda: PagedKV(torch.randn(16, 1, 32, generator=g(1)), torch.randn(16, 1, 32, generator=g(2)))  # noqa
    e4m3 = lambda n=8: torch.full((n, 1, 32), 1.0).to(torch.float8_e4m3fn)  # noqa: E731

    def decode_over(kv):  # the first use of a pool: two requests' decode over slots 1..8 (8 when it has fewer)
        d = kv.head_dim if kv.k_buffer.dim() == 3 else 32
        last = max(1, min(8, kv.num_slots - 1))
        return paged_decode_attention(torch.randn(2, 2, d, generator=g(3)), kv, T([0, last // 2, last]),
                                      torch.arange(1, last + 1), AttentionParams(0.2))
    for tag, make, names, defect in (
            ("meta_buffers", lambda: PagedKV(meta(torch.zeros(8, 1, 32)), meta(torch.zeros(8, 1, 32))), "k_buffer",
             "k_buffer and v_buffer on the meta device"),
            ("meta_scales", lambda: PagedKV(e4m3(), e4m3(), meta(torch.zeros(8, 1, 1, dtype=torch.uint8)),
                                            torch.zeros(8, 1, 1, dtype=torch.uint8),
                                            ScaleLayout.for_pool(8, 1, 32, 1)), "k_scales",
             "MXFP8 k_scales on the meta device"),
            ("layout_direct_interleaved", lambda: PagedKV(
                e4m3(), e4m3(), torch.zeros(0, 1, 32, 4, 1, dtype=torch.uint8),
                torch.zeros(0, 1, 32, 4, 1, dtype=torch.uint8), ScaleLayout(8, 1, 32, 128)), ("num_slots", "layout"),
             "a ScaleLayout built directly (not with for_pool): 8 slots in the interleaved page-128 layout, zero "
             "pages (issue #58: IndexError at the first read)"),
            ("layout_direct_head_dim_16", lambda: PagedKV(
                torch.zeros(8, 1, 16).to(torch.float8_e4m3fn), torch.zeros(8, 1, 16).to(torch.float8_e4m3fn),
                torch.zeros(8, 1, 0, dtype=torch.uint8), torch.zeros(8, 1, 0, dtype=torch.uint8),
                ScaleLayout(8, 1, 16, 1)), "head_dim",
             "a ScaleLayout built directly with head_dim 16 (no scale block)"),
            ("layout_not_a_layout", lambda: PagedKV(e4m3(), e4m3(), torch.zeros(8, 1, 1, dtype=torch.uint8),
                                                    torch.zeros(8, 1, 1, dtype=torch.uint8), (8, 1, 32, 1)), "layout",
             "layout a tuple, not a ScaleLayout"),
            ("kv_head_dims_differ", lambda: PagedKV(torch.randn(16, 1, 32), torch.randn(16, 1, 64)),
             ("k_buffer", "v_buffer"), "K head_dim 32, V head_dim 64 (issue #58: RuntimeError in the reference)"),
            ("zero_kv_heads", lambda: PagedKV(torch.zeros(16, 0, 32), torch.zeros(16, 0, 32)), ("k_buffer", "Hkv"),
             "buffers of 0 KV heads"),
            ("zero_head_dim", lambda: PagedKV(torch.zeros(16, 1, 0), torch.zeros(16, 1, 0)), ("k_buffer", "head_dim"),
             "buffers of head_dim 0"),
            ("zero_slots", lambda: PagedKV(torch.zeros(0, 1, 32), torch.zeros(0, 1, 32)), ("k_buffer", "slots"),
             "buffers of 0 slots (not even the padding slot)")):
        construct_case(f"core.PagedKV.{tag}", S, "attention_inputs.py:PagedKV (then the reference decode)", defect,
                       make, decode_over, names)
    for tag, make, names in (("page_zero", lambda: ScaleLayout(8, 1, 32, 0), "page_size"),
                             ("head_dim_48", lambda: ScaleLayout(8, 1, 48, 1), "head_dim"),
                             ("slots_bool", lambda: ScaleLayout(True, 1, 32, 1), "num_slots")):
        construct_case(f"core.scale_layout.direct_{tag}", "core.scale_layout", "scale_layout.py:ScaleLayout",
                       f"ScaleLayout built directly: {tag}", make, lambda lay: lay.empty().shape, names)
    call_case("core.PagedKV.read.meta_slots", S, "attention_inputs.py:PagedKV.read", "slots on the meta device",
              lambda: kvp().read(meta(T([1, 2]))), "slots")
    construct_case("core.AttentionParams.meta_sinks", S, "attention_inputs.py:AttentionParams (then the reference "
                   "decode)", "sinks on the meta device", lambda: AttentionParams(0.2, sinks=meta(torch.zeros(2))),
                   lambda p: paged_decode_attention(torch.randn(2, 2, 32), kvp(), T([0, 3, 8]), torch.arange(1, 9),
                                                    p), "sinks")
    construct_case("core.AttentionParams.meta_rel_bias", S, "attention_inputs.py:AttentionParams (then the reference "
                   "decode)", "rel_bias on the meta device",
                   lambda: AttentionParams(0.2, rel_bias=meta(torch.zeros(2, 2, 4))),
                   lambda p: paged_decode_attention(torch.randn(2, 2, 32), kvp(), T([0, 3, 8]), torch.arange(1, 9),
                                                    p), "rel_bias")
    construct_case("core.AttentionParams.rel_bias_extent_0", S, "attention_inputs.py:AttentionParams (then the "
                   "reference decode)", "rel_bias [2, 2, 0]: a relative bias of extent 0 (issue #58: RuntimeError "
                   "in the reference)", lambda: AttentionParams(0.2, rel_bias=torch.zeros(2, 2, 0)),
                   lambda p: paged_decode_attention(torch.randn(2, 2, 32), kvp(), T([0, 3, 8]), torch.arange(1, 9),
                                                    p), "rel_bias")

    def swapped_rel_bias():  # a field replaced after construction: the reader checks it again
        p = AttentionParams(0.2, rel_bias=torch.zeros(2, 2, 4))
        p.rel_bias = torch.zeros(2, 2, 0)
        return paged_decode_attention(torch.randn(2, 2, 32), kvp(), T([0, 3, 8]), torch.arange(1, 9), p)

    call_case("core.reference.decode.rel_bias_extent_0_set_later", "core.reference",
              "reference/attention.py:paged_decode_attention", "params.rel_bias replaced by a [2, 2, 0] bias after "
              "construction", swapped_rel_bias, "rel_bias")
    tree = lambda: (torch.ones(1, 1, dtype=torch.bool), T([0]))  # noqa: E731
    for tag, fn, names in (
            ("meta_tree_mask", lambda: SpecVerify(meta(torch.ones(1, dtype=torch.bool)), T([0, 1]), T([0])),
             "tree_mask"),
            ("meta_depths", lambda: SpecVerify(torch.ones(1, dtype=torch.bool), T([0, 1]), meta(T([0]))), "depths"),
            ("list_mask_indptr", lambda: SpecVerify(torch.ones(1, dtype=torch.bool), [0, 1], T([0])), "mask_indptr"),
            ("check_queries_list", lambda: SpecVerify.from_trees([tree()]).check_queries([0, 1]), "qo_indptr"),
            ("check_queries_meta", lambda: SpecVerify.from_trees([tree()]).check_queries(meta(T([0, 1]))),
             "qo_indptr")):
        call_case(f"core.SpecVerify.{tag}", S, "attention_inputs.py:SpecVerify", tag, fn, names)

    # --- the reference, the torch route, layer_step ---------------------------------------------------------------
    R = "core.reference"
    q2 = lambda: torch.randn(2, 2, 32, generator=g(3))  # noqa: E731
    P = lambda: AttentionParams(0.2)  # noqa: E731
    for tag, fn, names in (
            ("meta_q", lambda: paged_decode_attention(meta(q2()), kvp(), T([0, 3, 8]), torch.arange(1, 9), P()),
             r"\bq\b"),
            ("meta_kv_indptr", lambda: paged_decode_attention(q2(), kvp(), meta(T([0, 3, 8])), torch.arange(1, 9),
                                                              P()), "kv_indptr"),
            ("meta_kv_indices", lambda: paged_decode_attention(q2(), kvp(), T([0, 3, 8]), meta(torch.arange(1, 9)),
                                                               P()), "kv_indices"),
            ("list_kv_indices", lambda: paged_decode_attention(q2(), kvp(), T([0, 3, 8]), list(range(1, 9)), P()),
             "kv_indices"),
            ("q_zero_heads", lambda: paged_decode_attention(torch.zeros(2, 0, 32), kvp(), T([0, 3, 8]),
                                                            torch.arange(1, 9), P()), r"\bq\b"),
            ("rel_bias_extent_0", lambda: paged_decode_attention(q2(), kvp(), T([0, 3, 8]), torch.arange(1, 9),
                                                                 AttentionParams(0.2, rel_bias=torch.zeros(2, 2, 0))),
             "rel_bias")):
        call_case(f"{R}.decode.{tag}", R, "reference/attention.py:paged_decode_attention", tag, fn, names)
    for tag, fn, names in (
            ("meta_qo_indptr", lambda: paged_extend_attention(torch.randn(6, 2, 32), kvp(), T([0, 5, 8]),
                                                              torch.arange(1, 9), meta(T([0, 4, 6])), P()),
             "qo_indptr"),
            ("list_qo_indptr", lambda: paged_extend_attention(torch.randn(6, 2, 32), kvp(), T([0, 5, 8]),
                                                              torch.arange(1, 9), [0, 4, 6], P()), "qo_indptr")):
        call_case(f"{R}.extend.{tag}", R, "reference/attention.py:paged_extend_attention", tag, fn, names)

    def attend(out=None, q=None, keys_of=None):
        def fn():
            Sx = route_setup("torch")
            keys = SimpleNamespace(num_decode_rows=2, max_seq_len=20, plans=Sx.plans,
                                   decode_keys=lambda w, p: Sx.rails, extend_keys=lambda w: (Sx.rails, Sx.qo))
            from sglang_inkling_backend.layer_plan import LayerSpec
            spec = LayerSpec(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=D**-0.5)
            return layer_step.attend(Sx.route, spec, q(Sx) if q else Sx.q, Sx.kv, keys, lambda a, b: Sx.params, None,
                                     out(Sx) if out else None)
        return fn

    M = "core.routes"
    call_case("core.layer_step.attend.out_meta", M, "layer_step.py:attend", "out on the meta device",
              attend(out=lambda Sx: torch.zeros(2, HQ, D, device="meta")), "out")
    call_case("core.layer_step.attend.out_list", M, "layer_step.py:attend", "out a Python list",
              attend(out=lambda Sx: [0.0] * 2), "out")
    call_case("core.layer_step.attend.q_meta", M, "layer_step.py:attend", "q on the meta device",
              attend(q=lambda Sx: meta(Sx.q)), r"\bq\b")
    call_case("core.routes.torch_extend_keys_none", M, "routes.py:TorchRoute.extend", "rails None",
              lambda: __import__("sglang_inkling_backend.routes", fromlist=["TorchRoute"]).TorchRoute().extend(
                  torch.randn(6, 2, 32), kvp(), None, T([0, 4, 6]), P()), "rails")

    # --- rails, kv_views, mxfp8, checks, scale_layout ---------------------------------------------------------------
    Rl = "core.rails"
    r2t = lambda: torch.arange(40).view(4, 10)  # noqa: E731
    for tag, fn, names, call in (
            ("gather_meta_seq_lens", lambda: rails.gather_rails(r2t(), T([1]), meta(T([3]))), "seq_lens",
             "gather_rails"),
            ("gather_meta_table", lambda: rails.gather_rails(meta(r2t()), T([1]), T([3])), "req_to_token",
             "gather_rails"),
            ("page_table_list_table", lambda: rails.page_table([[0, 1]], T([0]), 1), "token_to_slot", "page_table"),
            ("page_table_meta_rows", lambda: rails.page_table(r2t(), meta(T([1])), 2), "rows", "page_table"),
            ("window_start_list", lambda: rails.window_start([5], [1], 2), "seq_lens", "window_start"),
            ("translate_meta_map", lambda: rails.translate_rails(rails.KVRails(T([0, 2]), T([3, 4])),
                                                                 meta(torch.arange(10))), "full_to_swa",
             "translate_rails"),
            ("translate_list_rails", lambda: rails.translate_rails(rails.KVRails([0, 2], [3, 4]), torch.arange(10)),
             ("indptr", "indices"), "translate_rails"),
            ("translate_rails_tuple", lambda: rails.translate_rails((T([0, 2]), T([3, 4])), torch.arange(10)), "rails",
             "translate_rails"),
            ("block_table_meta", lambda: rails.block_table_token_table(meta(T([[1]])), 4), "block_table",
             "block_table_token_table"),
            ("host_lengths_meta", lambda: rails.check_host_lengths(meta(T([3])), 1, 8), "seq_lens_host",
             "check_host_lengths"),
            ("KVPages_list_table", lambda: rails.KVPages([[1]], T([3]), 16), "page_table", "KVPages")):
        call_case(f"core.rails.{tag}", Rl, f"rails.py:{call}", tag, fn, names)
    fp8z = lambda: torch.zeros(8, 1, 32, dtype=torch.float8_e4m3fn)  # noqa: E731
    for tag, fn, names, call in (
            ("dequantize_query_meta", lambda: kv_views.dequantize_query(meta(torch.zeros(2, 64)), 2, 32, None),
             r"\bq\b", "dequantize_query"),
            ("dequantize_query_meta_descale", lambda: kv_views.dequantize_query(
                torch.zeros(2, 64, dtype=torch.float8_e4m3fn), 2, 32, meta(torch.zeros(4, dtype=torch.uint8))),
             "q_descale", "dequantize_query"),
            ("paged_kv_list_buffer", lambda: kv_views.paged_kv("mxfp8", [0], [0], page_size=1,
                                                                k_scales=torch.zeros(8, 1, 1, dtype=torch.uint8),
                                                                v_scales=torch.zeros(8, 1, 1, dtype=torch.uint8)),
             "k_buffer", "paged_kv"),
            ("paged_kv_meta_scales", lambda: kv_views.paged_kv("mxfp8", fp8z(), fp8z(), page_size=1,
                                                                k_scales=meta(torch.zeros(8, 1, 1, dtype=torch.uint8)),
                                                                v_scales=torch.zeros(8, 1, 1, dtype=torch.uint8)),
             "k_scales", "paged_kv")):
        call_case(f"core.kv_views.{tag}", Rl, f"kv_views.py:{call}", tag, fn, names)
    for tag, fn, names, call in (
            ("quantize.meta", lambda: mxfp8.quantize(meta(torch.ones(32))), "x", "quantize"),
            ("dequantize.meta_scales", lambda: mxfp8.dequantize(torch.zeros(32, dtype=torch.float8_e4m3fn),
                                                                meta(torch.zeros(1, dtype=torch.uint8))), "scales",
             "dequantize"),
            ("quantize_per_tensor.meta", lambda: mxfp8.quantize_per_tensor(meta(torch.ones(4)), 1.0), "x",
             "quantize_per_tensor")):
        call_case(f"core.mxfp8.{tag}", "core.mxfp8", f"mxfp8.py:{call}", tag, fn, names)
    call_case("core.checks.require_slots.meta", "core.checks", "checks.py:require_slots", "slots on the meta device",
              lambda: checks.require_slots(meta(T([1, 2])), "loc", 10), "loc")
    call_case("core.checks.require_slots_once.meta", "core.checks", "checks.py:require_slots_once",
              "slots on the meta device", lambda: checks.require_slots_once(meta(T([1, 2])), "loc", 10), "loc")
    lay = lambda: ScaleLayout.for_pool(8, 1, 32, 1)  # noqa: E731
    sf = lambda: torch.zeros(8, 1, 1, dtype=torch.uint8)  # noqa: E731
    sfb = sf()
    case("core.scale_layout.scatter_meta_scales", "core.scale_layout", "scale_layout.py:ScaleLayout.scatter",
         "scales on the meta device (torch ignores a meta source in an indexed store)",
         lambda: Setup(lambda: lay().scatter(sfb, T([1]), meta(torch.ones(1, 1, 1, dtype=torch.uint8))),
                       {"sf": sfb}), "scales")
    call_case("core.scale_layout.gather_meta_buffer", "core.scale_layout", "scale_layout.py:ScaleLayout.gather",
              "sf on the meta device", lambda: lay().gather(meta(sf()), T([1])), "sf")

    # --- per-request arrays against their counts ------------------------------------------------------------------
    call_case("core.BatchedDecodeContext.caches_short", "core.decode_context",
              "mlx/decode_context.py:BatchedDecodeContext",
              "2 requests, a layer's caches for 1 (cache_for(layer, 1) was an IndexError-free refusal only later)",
              lambda: BatchedDecodeContext([3, 4], [[None, None], [None]]).cache_for(1, 1), "attention_layer_caches")
    call_case("core.BatchedDecodeContext.caches_not_a_list", "core.decode_context",
              "mlx/decode_context.py:BatchedDecodeContext", "a layer's caches None",
              lambda: BatchedDecodeContext([3], [None]).cache_for(0, 0), "attention_layer_caches")

    # --- vLLM: the store, the forward, the batch ----------------------------------------------------------------
    store_case("meta_key", "key on the meta device (issue #58: stored nothing, no error)",
               lambda S: setattr(S, "key", meta(S.key)), names=("key", ))
    store_case("meta_value", "value on the meta device", lambda S: setattr(S, "value", meta(S.value)),
               names=("value", ))
    store_case("meta_slot_mapping", "slot_mapping on the meta device (issue #58: NotImplementedError from a copy)",
               lambda S: setattr(S, "slot_mapping", meta(S.slot_mapping)))
    store_case("meta_kv_cache", "kv_cache on the meta device", lambda S: setattr(S, "cache", meta(S.cache)),
               names=("kv_cache", ))
    store_case("meta_key", "key on the meta device", lambda S: setattr(S, "key", meta(S.key)), names=("key", ),
               fmt="mxfp8")
    forward_case("meta_query", "query on the meta device", lambda S: setattr(S, "q", meta(S.q)), ("query", ))
    forward_case("meta_output", "output on the meta device", lambda S: setattr(S, "output", meta(S.output)),
                 ("output", ))
    forward_case("meta_kv_cache", "kv_cache on the meta device", lambda S: setattr(S, "cache", meta(S.cache)),
                 ("kv_cache", ))
    forward_case("meta_seq_lens", "seq_lens on the meta device",
                 lambda S: S.kw.__setitem__("seq_lens", meta(S.kw["seq_lens"])), ("seq_lens", ))
    forward_case("list_block_table", "block_table a Python list",
                 lambda S: S.kw.__setitem__("block_table", S.kw["block_table"].tolist()), ("block_table", ))

    def after_build(change, names, defect, tag):
        """A valid VllmBatch, one field set after construction (a dataclass's fields can be), then the forward."""
        def build():
            Sv = vllm_batch_setup()
            from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
            batch = VllmBatch(**Sv.kw)
            change(batch)
            return Setup(lambda: Sv.att.forward(Sv.q, Sv.cache, batch, Sv.output),
                         {"output": Sv.output, "kv_cache": Sv.cache})

        case(f"vllm.batch.{tag}", "vllm.batch", "hosts/vllm/batch.py:VllmBatch.check_values (via "
             "LayerAttention.forward)", defect, build, names)

    after_build(lambda b: setattr(b, "seq_lens", T([20, 9], dtype=torch.int32)), "seq_lens",
                "seq_lens with 2 entries for 3 requests, set after construction (issue #58: IndexError in VllmBatch)",
                "seq_lens_short_set_later")
    after_build(lambda b: setattr(b, "num_reqs", 4), ("seq_lens", "query_start_loc", "block_table", "num_reqs"),
                "num_reqs raised to 4 after construction (3 requests' arrays)", "num_reqs_raised_later")
    after_build(lambda b: setattr(b, "block_table", b.block_table[:2]), "block_table",
                "block_table with 2 rows for 3 requests, set after construction", "block_table_short_set_later")
    after_build(lambda b: setattr(b, "seq_lens", [20, 9, 12]), "seq_lens",
                "seq_lens a Python list, set after construction", "seq_lens_list_set_later")

    def batch_kw(**change):
        from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
        kw = dict(num_reqs=2, num_actual_tokens=4, num_decodes=1, num_decode_tokens=1,
                  query_start_loc=T([0, 1, 4], dtype=torch.int32), seq_lens=T([5, 3], dtype=torch.int32),
                  block_table=T([[1], [2]], dtype=torch.int32), slot_mapping=torch.zeros(4, dtype=torch.int64),
                  block_size=BS, max_seq_len=5)
        kw.update(change)
        return VllmBatch(**kw)

    call_case("vllm.batch.meta_seq_lens", "vllm.batch", "hosts/vllm/batch.py:VllmBatch (then check_values)",
              "seq_lens on the meta device", lambda: batch_kw(seq_lens=meta(T([5, 3], dtype=torch.int32)))
              .check_values(4), "seq_lens")
    call_case("vllm.batch.meta_query_start_loc", "vllm.batch", "hosts/vllm/batch.py:VllmBatch (then check_values)",
              "query_start_loc on the meta device",
              lambda: batch_kw(query_start_loc=meta(T([0, 1, 4], dtype=torch.int32))).check_values(4),
              "query_start_loc")
    call_case("vllm.layer.meta_sinks", "vllm.layer", "hosts/vllm/attention.py:LayerAttention.__init__",
              "sinks on the meta device", lambda: vllm_layer(sinks=meta(torch.zeros(HQ))), "sinks")
    call_case("vllm.forward.batch_none", "vllm.forward", "hosts/vllm/attention.py:LayerAttention.forward",
              "batch None (not the builder's VllmBatch)",
              lambda: (lambda Sv: Sv.att.forward(Sv.q, Sv.cache, None, Sv.output))(vllm_batch_setup()), "batch")

    # --- SGLang: the pool (one layer's data on the meta device would be copied after layer 0's) and its metadata ---
    sglang_pool_case("meta_k_layer_1", "layer 1's k on the meta device (its copy would fail after layer 0's write)",
                     lambda S: S.saved[1].__setitem__(0, meta(S.saved[1][0])), "kv_cache_cpu", op="load")
    sglang_pool_case("meta_k_scales_layer_1", "layer 1's k scale bytes on the meta device",
                     lambda S: S.saved[1].__setitem__(2, meta(S.saved[1][2])), "kv_cache_cpu", op="load")
    sglang_pool_case("meta_indices", "indices on the meta device", lambda S: setattr(S, "indices", meta(S.indices)),
                     "indices", op="get")
    sglang_pool_case("meta_loc", "loc on the meta device", lambda S: setattr(S, "loc", meta(S.loc)), "loc",
                     op="set", fmt="bf16")
    sglang_pool_case("meta_k", "cache_k on the meta device", lambda S: setattr(S, "k", meta(S.k)),
                     ("cache_k", "cache_v"), op="set", fmt="bf16")

    def graph_buffers(device):
        from sglang_inkling_backend.hosts.sglang.metadata import DecodeGraphBuffers
        return DecodeGraphBuffers(4, 64, [], device, swa=False)

    def verify_buffers(device):
        from sglang_inkling_backend.hosts.sglang.metadata import VerifyGraphBuffers
        return VerifyGraphBuffers(4, 3, 64, [], device, swa=False)

    G = "sglang.graph_buffers"
    for tag, fn, names in (
            ("decode_device_unreachable", lambda: graph_buffers(unreachable), "device"),
            ("decode_device_meta", lambda: graph_buffers("meta"), "device"),
            ("verify_device_unreachable", lambda: verify_buffers(unreachable), "device"),
            ("decode_refill_list_seq_lens", lambda: graph_buffers("cpu").refill(torch.arange(64).view(1, 64), T([0]),
                                                                                [3]), "seq_lens"),
            ("decode_refill_meta_seq_lens", lambda: graph_buffers("cpu").refill(
                torch.arange(64).view(1, 64), T([0]), meta(T([3]))), "seq_lens"),
            ("verify_refill_list_seq_lens", lambda: verify_buffers("cpu").refill(
                torch.arange(64).view(1, 64), T([0]), [3], T([3, 4, 5]), None, num_real=1), "seq_lens"),
            ("build_list_extend_seq_lens", lambda: __import__(
                "sglang_inkling_backend.hosts.sglang.metadata", fromlist=["x"]).build_forward_metadata(
                    torch.arange(64).view(1, 64), T([0]), T([5]), extend_seq_lens=[2]), "extend_seq_lens"),
            ("build_list_out_cache_loc", lambda: __import__(
                "sglang_inkling_backend.hosts.sglang.metadata", fromlist=["x"]).build_forward_metadata(
                    torch.arange(64).view(1, 64), T([0]), T([5]), full_to_swa=torch.arange(64), out_cache_loc=[4]),
             "out_cache_loc")):
        call_case(f"{G}.{tag}", G, "hosts/sglang/metadata.py", tag, fn, names)

    # --- the Triton route and its workspace (interpreter; a process per case) --------------------------------------
    route_case("meta_q", "q on the meta device", lambda S: setattr(S, "q", meta(S.q)), (r"\bq\b", ))
    route_case("rel_bias_extent_0_set_later", "params.rel_bias replaced by a [2, 4, 0] bias (extent 0) after "
               "construction", lambda S: (setattr(S, "params", AttentionParams(D**-0.5,
                                                                               rel_bias=torch.zeros(2, HQ, 4))),
                                          setattr(S.params, "rel_bias", torch.zeros(2, HQ, 0))), ("rel_bias", ))
    call_case("triton.route.workspace_device_unreachable", "triton.route", "triton/plan.py:DecodeWorkspace",
              f"DecodeWorkspace on {unreachable}", lambda: __import__(
                  "sglang_inkling_backend.triton", fromlist=["DecodeWorkspace"]).DecodeWorkspace(4, 4, 32, 2,
                                                                                                unreachable),
              ("device", "workspace"), group="triton")


def _keep(args):
    pass


def all_cases() -> list[Case]:
    if CASES:
        return CASES
    define_vllm_store_cases()
    define_vllm_batch_cases()
    define_vllm_layer_cases()
    define_vllm_forward_cases("torch")
    define_vllm_forward_cases("triton")
    define_route_cases("torch")
    define_route_cases("triton")
    define_checks_cases()
    define_mxfp8_cases()
    define_attention_inputs_cases()
    define_layer_plan_cases()
    define_decode_context_cases()
    define_reference_cases()
    define_kv_pool_cases()
    define_rails_cases()
    define_routes_misc_cases()
    define_sglang_pool_cases()
    define_sglang_forward_cases()
    define_verify_graph_cases()
    define_tensor_kind_cases()
    return CASES


def _message(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text[:400]}"


def _names_match(case: Case, message: str) -> bool:
    return any(re.search(p, message, re.IGNORECASE) for p in case.names)


def _internal_words(message: str) -> list[str]:
    return [w for w in INTERNAL_WORDS if re.search(w, message)]


def _judge(case: Case, setup: Setup, result) -> tuple[Optional[str], str]:
    """``(outcome or None, detail)`` of a call that did not raise: None when its result is right (or not judged)."""
    exp = setup.expect
    torch = _torch()
    if any(t.device.type == "meta" for t in tensors_in(result)):  # shapes without values: nothing was computed
        return "silent_wrong", "no error, and the result is a tensor on the meta device (no data computed)"
    try:
        if isinstance(exp, torch.Tensor):
            verdict = compare(result, exp, setup.atol)
        elif callable(exp):
            verdict = exp(result)
        else:
            verdict = ("silent_nan", "non-finite values in the result") if has_nonfinite(result) else None
    except Exception as err:  # the check needs the inputs' values (a meta input has none): the call took them
        return "accepted", f"no error; its result could not be checked ({type(err).__name__}: {str(err)[:120]})"
    if verdict is None or verdict is True:
        return None, ""
    if verdict is False:
        return "silent_wrong", "result check failed"
    return verdict[0], str(verdict[1])[:300]


def run_one(case: Case) -> dict:
    torch = _torch()
    out = dict(id=case.id, surface=case.surface, call=case.call, defect=case.defect, kind=case.kind, group=case.group,
               names=list(case.names))
    t0 = time.time()
    try:
        setup = case.build()
    except Exception as exc:  # the probe's own bug: never counted as an outcome of the code under test
        out.update(outcome="setup_error", message=_message(exc), trace=traceback.format_exc()[-1500:])
        return out
    # a buffer on the meta device (a case's defect) holds no bytes to compare
    snaps = {k: v.detach().clone() for k, v in setup.buffers.items()
             if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    exc = result = None
    phase = "call"

    def on_alarm(signum, frame):
        raise TimeoutError(f"the call ran past {CASE_TIMEOUT_S}s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        result = setup.run()
        if setup.use is not None:
            phase = "use"
            result = setup.use(result)
    except TimeoutError as e:
        exc = e
    except Exception as e:
        exc = e
    finally:
        signal.alarm(0)
    changed = [k for k, before in snaps.items() if not byte_equal(before, setup.buffers[k])]
    out.update(seconds=round(time.time() - t0, 3), written=changed, phase=phase)
    if isinstance(exc, TimeoutError) and "ran past" in str(exc):
        out.update(outcome="crash", message=f"hung: {exc}")
        return out
    if exc is not None:
        msg = _message(exc)
        out["message"] = msg
        out["exception"] = type(exc).__name__
        if changed:
            out["outcome"] = "partial_write"
            out["detail"] = f"raised after writing {changed}"
        elif case.kind == "control":
            out["outcome"] = "control_failed"
        elif not isinstance(exc, (ValueError, TypeError)):
            out["outcome"] = "wrong_type"
            if phase == "use":
                out["detail"] = "accepted at construction; this error at first use"
        elif phase == "use":
            out["outcome"] = "deferred"
            if not _names_match(case, msg):
                out["detail"] = "and the first-use message does not name the argument"
        elif _names_match(case, msg):
            out["outcome"] = "clean"
            internal = _internal_words(msg) if case.surface.startswith(("vllm", "sglang")) else []
            if internal:
                out["note"] = f"clean, but the message also uses internal words: {internal}"
        else:
            out["outcome"] = "internal_name"
        here = [f for f in traceback.extract_tb(exc.__traceback__) if "sglang_inkling_backend" in f.filename]
        if here:  # the backend's frames, outermost first (the last three)
            out["raised_at"] = " -> ".join(f"{f.filename.split('sglang_inkling_backend/')[-1]}:{f.lineno} ({f.name})"
                                           for f in here[-3:])
        if out["outcome"] != "clean":
            out["trace"] = "".join(traceback.format_tb(exc.__traceback__)[-3:])[-1200:]
        return out
    verdict, detail = _judge(case, setup, result)
    if case.kind == "control":
        out["outcome"] = "valid" if verdict is None else verdict
    elif case.kind == "activation":  # a NaN activation must show as NaN outputs, never as a finite result
        out["outcome"] = "valid" if verdict == "silent_nan" else verdict or "silent_wrong"
        detail = detail if verdict != "silent_nan" else f"NaN propagated, as documented: {detail}"
    else:
        out["outcome"] = verdict or "accepted"
        if verdict is None:
            detail = "no error; the result is the valid call's (or not judged)"
        if changed:
            detail = f"{detail}; wrote {changed}"
    if detail:
        out["detail"] = detail
    if case.kind != "control" and result is not None and not isinstance(result, torch.Tensor):
        out["returned"] = repr(result)[:200]
    return out


def worker_main(group: str, ids: list[str]) -> None:
    if group.startswith("sglang"):
        from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import
        prepare_sglang_cpu_import()
    import logging
    import warnings
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch = _torch()
    torch.set_num_threads(1)
    cases = {c.id: c for c in all_cases()}
    for cid in ids:
        print(f"@@START {cid}", flush=True)
        res = run_one(cases[cid])
        print("@@RESULT " + json.dumps(res), flush=True)


def run_job(group: str, ids: list[str], python: str) -> list[dict]:
    """Run ``ids`` in worker processes of ``group``: a fresh one after each crash."""
    results, remaining = [], list(ids)
    while remaining:
        cmd = [python, str(Path(__file__).resolve()), "--worker", group]
        timeout = CASE_TIMEOUT_S * len(remaining) + 120
        try:
            proc = subprocess.run(cmd, input="\n".join(remaining), capture_output=True, text=True, timeout=timeout,
                                  cwd=str(REPO))
            stdout, rc, stderr = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, stderr = "timeout", ""
        started, done = None, set()
        for line in stdout.splitlines():
            if line.startswith("@@START "):
                started = line.split(" ", 1)[1]
            elif line.startswith("@@RESULT "):
                res = json.loads(line.split(" ", 1)[1])
                results.append(res)
                done.add(res["id"])
                started = None
        remaining = [i for i in remaining if i not in done]
        if not remaining:
            break
        if started is None:  # died before its first case (an import error): report every case
            for cid in remaining:
                results.append(dict(id=cid, outcome="setup_error", message=f"worker exited {rc}: {stderr[-800:]}"))
            break
        sig = ""
        if isinstance(rc, int) and rc < 0:
            sig = signal.Signals(-rc).name
        results.append(
            dict(id=started, outcome="crash",
                 message=f"process died ({sig or rc}) during the call; stderr tail: {stderr[-300:]!r}"))
        remaining = [i for i in remaining if i != started]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the JSON results here")
    ap.add_argument("--only", action="append", default=[], help="case id prefix (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes at a time (default 2)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter workers run under")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, [line.strip() for line in sys.stdin if line.strip()])
        return
    cases = [c for c in all_cases() if not args.only or any(c.id.startswith(p) for p in args.only)]
    if args.list:
        for c in cases:
            print(f"{c.id:70s} {c.kind:9s} {c.group:7s} {c.defect}")
        print(f"{len(cases)} cases")
        return
    t0 = time.time()
    jobs = []
    for group in ("core", "sglang"):
        ids = [c.id for c in cases if c.group == group]
        if ids:
            jobs.append((group, ids))
    jobs += [(c.group, [c.id]) for c in cases if c.group in ("triton", "sglang-triton")]
    # the two long workers first, then the one-case Triton processes
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_job, g, ids, args.python) for g, ids in jobs]
        results = [r for f in futures for r in f.result()]
    by_id = {c.id: c for c in cases}
    for r in results:  # fill in what a crash record lacks
        c = by_id.get(r["id"])
        if c is not None:
            for k in ("surface", "call", "defect", "kind", "group"):
                r.setdefault(k, getattr(c, k))
    order = {c.id: i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order.get(r["id"], 1 << 30))
    elapsed = time.time() - t0
    text = report(results, elapsed)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        counts = {
            k: sum(1 for r in results if r["outcome"] == k)
            for k in list(OUTCOMES) + ["control_failed", "setup_error"]
        }
        out.write_text(
            json.dumps(
                dict(command=" ".join([python_name()] + sys.argv), seconds=round(elapsed, 1), cases=len(
                    results), counts=counts, before=BEFORE, outcomes=OUTCOMES, results=results), indent=1) + "\n")


def python_name() -> str:
    exe = Path(sys.executable)
    return os.path.relpath(exe, REPO) if REPO in exe.parents else str(exe)


def report(results: list[dict], elapsed: float) -> str:
    lines = []
    keys = list(OUTCOMES) + ["control_failed", "setup_error"]
    counts = {k: sum(1 for r in results if r["outcome"] == k) for k in keys}
    lines.append(f"bad-input probe (issue #33): {len(results)} cases in {elapsed:.0f}s")
    lines.append("")
    lines.append(f"{'outcome':64s} {'before':>7s} {'now':>5s}")
    for k in keys:
        if k in OUTCOMES or counts[k]:
            before = BEFORE.get(k)
            lines.append(f"{OUTCOMES.get(k, k):64s} {'' if before is None else before:>7} {counts[k]:>5d}")
    lines.append(f"{'total':64s} {sum(BEFORE.values()):>7d} {len(results):>5d}")
    lines.append("(before: the issue's probe of about 290 cases; this probe's case set differs)")
    lines.append("")
    surfaces = sorted({r.get("surface", "?") for r in results})
    short = dict(clean="clean", valid="valid", internal_name="intern", wrong_type="wrongT", partial_write="partW",
                 silent_wrong="wrong", silent_nan="NaN", accepted="accept", deferred="defer", crash="crash",
                 control_failed="ctlFail", setup_error="setupE")
    cols = [k for k in keys if k in OUTCOMES or counts[k]]
    lines.append(f"{'surface':24s} " + " ".join(f"{short[k]:>7s}" for k in cols) + f" {'total':>6s}")
    for s in surfaces:
        rs = [r for r in results if r.get("surface") == s]
        lines.append(f"{s:24s} " + " ".join(f"{sum(1 for r in rs if r['outcome'] == k):>7d}"
                                            for k in cols) + f" {len(rs):>6d}")
    lines.append("")
    lines.append("Every case that is not clean or valid:")
    for k in keys:
        rs = [r for r in results if r["outcome"] == k]
        if k in ("clean", "valid") or not rs:
            continue
        lines.append("")
        lines.append(f"== {OUTCOMES.get(k, k)} ({len(rs)})")
        for r in rs:
            lines.append(f"- {r['id']}  [{r.get('call', '')}]")
            lines.append(f"    defect: {r.get('defect', '')}")
            if r.get("message"):
                lines.append(f"    raised: {r['message']}")
            if r.get("raised_at") and r["outcome"] != "crash":
                lines.append(f"    at: {r['raised_at']}")
            if r.get("detail"):
                lines.append(f"    detail: {r['detail']}")
            if r.get("returned"):
                lines.append(f"    returned: {r['returned']}")
    notes = [r for r in results if r.get("note")]
    if notes:
        lines.append("")
        lines.append(f"Clean, with a note ({len(notes)}):")
        for r in notes:
            lines.append(f"- {r['id']}: {r['note']}\n    {r.get('message', '')}")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (the CPU runs the interpreter)
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    main()
