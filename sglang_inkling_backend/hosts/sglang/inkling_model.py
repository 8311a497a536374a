"""The seam that lets SGLang's in-tree Inkling model run on ``--attention-backend inkling``.

``srt/models/inkling_common/attn.py`` asks ``serving_attention_backend(forward_batch)`` which backend serves the
call, then ``assert attention_backend in ("fa4", "triton")`` and shapes its kwargs for that backend. This backend
implements the FA4 contract, so for Inkling the name ``inkling`` is answered as ``fa4``:

- the fused decode prologue runs (k/v short conv + conv-cache shift + q/k RMSNorm + tau, optionally MXFP8 q and the
  MXFP8/bf16 KV store into this backend's pool, whose buffers and 5-D page-128 scale layout pass the model's
  eligibility checks), and ``inkling_attn_prologue_decode`` is routed to the serving route's ``decode_prologue``
  (``route_protocol.Route``): the GPU route's Triton kernel (``triton/prologue.py``), the torch route's reference
  (``reference/prologue.py``), both with SGLang's signature;
- in MXFP8 mode q stays unrounded by default (``query_format``; ``INKLING_MXFP8_QUERY=mxfp8`` restores FA4's
  rounded q): our decode prologue stores MXFP8 K/V and returns a bf16 q, SGLang's extend prologue
  (``inkling_attn_prologue_extend``, hooked too) runs in bf16 mode and K/V are stored as MXFP8 here, and both return
  ``kv_views.UNROUNDED_QUERY`` as the q scale (otherwise the model rounds q itself);
- the attention call then carries ``rel_bias`` (+ ``rel_bias_event``) or ``score_mod`` + ``aux_tensors``,
  ``q_descale`` (MXFP8 q), ``save_kv_cache=False`` after a prologue store; ``InklingAttnBackend`` reads them all, and
  ``forward_metadata.swa_out_cache_loc`` is where the model expects it.

The hooks go through SGLang's ``HookRegistry`` and act only when the serving backend is inkling: the name map
touches only the answer ``inkling``, and the prologue hooks defer to SGLang's kernels unless inkling serves the
forward (the decode backend for the decode prologue; the prefill backend, with q kept bf16, for the extend one).
They are installed by ``InklingAttnBackend`` at construction (the scheduler process, after the model was loaded) and
only if the Inkling model's module is loaded: on a CPU host that module cannot even be imported (it needs the
CUDA-only ``cutlass`` package), which is why the seam is tested at the level of these functions.
"""
from __future__ import annotations

import inspect
import logging
import sys

from sglang_inkling_backend import kv_views, settings
from sglang_inkling_backend.kv_formats import KVFormat
from sglang_inkling_backend.hosts.sglang import BACKEND_NAME

logger = logging.getLogger(__name__)

ATTN_MODULE = "sglang.srt.models.inkling_common.attn"
PROLOGUE_MODULE = "sglang.kernels.ops.attention.inkling_attn_prologue"
SERVING_TARGET = f"{ATTN_MODULE}.serving_attention_backend"
PROLOGUE_TARGET = f"{PROLOGUE_MODULE}.inkling_attn_prologue_decode"
EXTEND_PROLOGUE_TARGET = f"{PROLOGUE_MODULE}.inkling_attn_prologue_extend"
QUERY_FORMAT_ENV = settings.MXFP8_QUERY.name
# bf16 (the default): q unrounded, so K/V's rounding is the only one; mxfp8 rounds q too, which adds its own drift
# from bf16 (docs/MEASURED.md, the Inkling model). The pool's bytes are the same either way.
QUERY_FORMATS, DEFAULT_QUERY_FORMAT = settings.QUERY_FORMATS, settings.DEFAULT_QUERY_FORMAT
# The backend whose kwarg contract (rel_bias / q_descale / fused prologue) this backend implements.
CONTRACT_BACKEND = "fa4"


def serving_backend_after(result, *args, **kwargs):
    """AFTER hook on ``serving_attention_backend``: ``inkling`` is answered as the contract it implements."""
    return CONTRACT_BACKEND if result == BACKEND_NAME else result


def extend_backend_is_inkling() -> bool:
    """Whether the forward in progress extends with this backend (False outside a forward)."""
    from sglang.srt.model_executor.forward_context import get_attn_backend, has_forward_context

    if not has_forward_context():
        return False
    return getattr(get_attn_backend(), "prefill_attention_backend_str", None) == BACKEND_NAME


def inkling_backend(backend, split_side: str = "prefill_backend"):
    """This package's backend inside what SGLang set as the forward's backend: the Inkling model's hybrid wrapper
    holds it as ``full_attn_backend``, SGLang's prefill/decode split as ``split_side`` (``prefill_backend`` or
    ``decode_backend``: the side serving the call)."""
    seen = backend
    for _ in range(4):
        # InklingAttnBackend, known by what it has (backend.py imports this module)
        if hasattr(seen, "use_route") and getattr(seen, "route", None) is not None:
            return seen
        seen = getattr(seen, "full_attn_backend", None) or getattr(seen, split_side, None)
    raise RuntimeError(f"inkling: no InklingAttnBackend inside the forward's backend {type(backend).__name__}")


def decode_backend_is_inkling() -> bool:
    """Whether the forward in progress decodes with this backend. Outside a forward (no forward context) SGLang's
    own prologue serves, with a WARNING: the model calls the prologue from inside its forward only."""
    from sglang.srt.model_executor.forward_context import get_attn_backend, has_forward_context

    if not has_forward_context():
        logger.warning("inkling: decode prologue called outside a forward context; SGLang's own kernel serves it")
        return False
    backend = get_attn_backend()
    return getattr(backend, "decode_attention_backend_str", None) == BACKEND_NAME


def our_prologue_decode():
    """The decode prologue of the route serving the forward's decode (``Route.decode_prologue``); called where
    ``decode_backend_is_inkling()``."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    return inkling_backend(get_attn_backend(), "decode_backend").route.decode_prologue


def query_format() -> str:
    """How the Inkling model's query reaches this backend in MXFP8 mode: ``bf16`` (the default: unrounded, the
    prologues store K/V as MXFP8 and keep q) or ``mxfp8`` (rounded, FA4's contract). ``INKLING_MXFP8_QUERY``
    overrides the default (``DEFAULT_QUERY_FORMAT``). Only the fused prologues' q (head_dim 128 on an accelerator)
    can stay bf16; the model's unfused path rounds q itself."""
    return settings.mxfp8_query()


def query_unrounded() -> bool:
    """Whether the fused prologues keep the Inkling model's q unrounded in MXFP8 mode (``query_format`` bf16)."""
    return settings.mxfp8_query_unrounded()


def _argument(original, args, kwargs, name: str):
    """The value ``original``'s parameter ``name`` takes in this call: the model passes the prologues' flags by
    keyword (attn.py), so the signature is bound only when it did not."""
    if name in kwargs:
        return kwargs[name]
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments[name]


def prologue_decode_around(original, *args, **kwargs):
    """AROUND hook on SGLang's ``inkling_attn_prologue_decode``: ours when inkling serves decode, keeping q in bf16
    in MXFP8 mode unless ``query_format()`` is ``mxfp8``."""
    if not decode_backend_is_inkling():
        return original(*args, **kwargs)
    prologue = our_prologue_decode()
    if query_unrounded() and _argument(original, args, kwargs, "mxfp8_quant"):
        q, k, v, _ = prologue(*args, **kwargs, quantize_q=False)
        return q, k, v, kv_views.UNROUNDED_QUERY
    return prologue(*args, **kwargs)


def prologue_extend_around(original, *args, **kwargs):
    """AROUND hook on SGLang's ``inkling_attn_prologue_extend`` (SGLang's kernel, whose one ``mxfp8_quant`` flag
    rounds q and stores MXFP8 K/V): when inkling serves and q stays bf16, SGLang's kernel runs in bf16 mode without
    its store, then K/V are stored as MXFP8 here through the serving route's store (the bytes of the MXFP8 mode's
    store: one encoder rule)."""
    if not (query_unrounded() and extend_backend_is_inkling()
            and _argument(original, args, kwargs, "mxfp8_quant")):
        return original(*args, **kwargs)
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    q, k, v, _ = original(**{**a, "mxfp8_quant": False, "do_store": False, "sfk": None, "sfv": None})
    if a["do_store"]:
        from sglang.srt.model_executor.forward_context import get_attn_backend

        kv = kv_views.paged_kv(KVFormat.MXFP8, a["k_buf"], a["v_buf"], page_size=a["page_size"], k_scales=a["sfk"],
                               v_scales=a["sfv"])
        route = inkling_backend(get_attn_backend()).route
        kv_views.store_kv_unchecked(kv, a["loc"], k, v, fused_store=route.fused_store)
    return q, k, v, kv_views.UNROUNDED_QUERY


def install_seam_if_loaded() -> bool:
    """Install the hooks if the Inkling model's module is loaded in this process; True if installed."""
    if ATTN_MODULE not in sys.modules:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in ((SERVING_TARGET, serving_backend_after, HookType.AFTER),
                             (PROLOGUE_TARGET, prologue_decode_around, HookType.AROUND),
                             (EXTEND_PROLOGUE_TARGET, prologue_extend_around, HookType.AROUND)):
        if not any(hook is fn for _, hook, _ in HookRegistry._hooks.get(target, ())):
            HookRegistry.register(target, fn, kind, source=None)
    HookRegistry.apply_hooks()  # applies only targets not patched yet
    installed = seam_installed()
    if installed:
        logger.info("inkling: Inkling model seam installed (serving name %r -> %r contract, decode prologue -> "
                    "sglang_inkling_backend)", BACKEND_NAME, CONTRACT_BACKEND)
    else:
        logger.error("inkling: could not install the Inkling model seam; the model will reject "
                     "--attention-backend inkling")
    return installed


def seam_installed() -> bool:
    attn = sys.modules.get(ATTN_MODULE)
    prologue = sys.modules.get(PROLOGUE_MODULE)
    if attn is None or prologue is None:
        return False
    return (getattr(attn.serving_attention_backend, "__wrapped__", None) is not None
            and getattr(prologue.inkling_attn_prologue_decode, "__wrapped__", None) is not None
            and getattr(prologue.inkling_attn_prologue_extend, "__wrapped__", None) is not None)
