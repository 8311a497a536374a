"""How the inkling backend bends SGLang's start-up, through SGLang's own hook mechanisms, for this backend only.

Two kinds of hooks, both installed by ``install()`` (called from the entry point):

Server-argument resolution hooks (``sglang.srt.arg_groups.resolution_hooks``; they run in the launcher process):
- ``handle_mxfp8_kv_cache_compatibility``: SGLang allows ``--kv-cache-dtype mxfp8`` only on Blackwell because its
  only MXFP8 reader is FA4. This backend reads MXFP8 on any device, so for inkling the check is replaced by ours:
  both prefill and decode must be inkling, and the page size is 128 (set when unset; a forced other value is an
  error naming ``--page-size``).
- ``handle_attention_backend_compatibility``: start-up validation of combinations this backend cannot serve
  (speculative algorithms other than NGRAM/EAGLE/EAGLE3, speculation on a CPU beyond NGRAM over a page-1 pool,
  MLA, cross attention, unsupported ``--kv-cache-dtype``, head_dim not a
  multiple of 32 with MXFP8, quantized KV shared with another backend, HiCache with quantized KV outside SGLang's
  host-pool rules), the prefill CUDA graph (SGLang's breakable one kept where the Triton route serves prefill,
  ``prefill_graph_backend``), and decode CUDA graphs off when there is no graph-capturable (Triton)
  route or, with speculation, when ``INKLING_VERIFY_GRAPHS=0`` (verify steps then run eagerly).
- ``apply_inkling_prefill_cuda_graph_default``: the Inkling model's FULL prefill graph needs FA4-only metadata; skip
  it when inkling serves attention.

KV-pool configurator hooks (``HookRegistry`` AROUND hooks on ``KVCacheConfigurator``; they run in the scheduler):
- ``configure``: SGLang refuses e4m3 KV on a CPU without AMX ("CPU FP8 KV cache requires Intel AMX support.") because
  its only CPU fp8 reader is the intel_amx kernel. With inkling serving every attention call, the KV pool is ours and
  so is the reader; the gate is lifted for that call only.
- ``_build_token_to_kv_pool``, ``_hybrid_full_attention_pool_class``, ``_build_mha_quant_method``: the pool is built
  from ``InklingMHATokenToKVPool`` (plain, inside ``SWAKVPool`` for hybrid sliding-window models, or as the
  full-attention leaf of hybrid linear models); the pool owns quantization, so SGLang's KV quant method is not used.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

from sglang_inkling_backend import settings
from sglang_inkling_backend.checks import UnsupportedFeature
from sglang_inkling_backend.hosts.sglang import BACKEND_NAME
from sglang_inkling_backend.hosts.sglang.cache_dtypes import KV_FORMAT_OF_FLAG, flag_format, pool_format
from sglang_inkling_backend.kv_formats import KVFormat
from sglang_inkling_backend.mxfp8 import head_dim_ok
from sglang_inkling_backend.scale_layout import INTERLEAVED_PAGE_SIZE as MXFP8_PAGE_SIZE

logger = logging.getLogger(__name__)

_HOOK_SOURCE = "sglang_inkling_backend"
_CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"

_installed = False


# ---------------------------------------------------------------------------------------------------------------
# Helpers shared by the hooks


def inkling_backends(cfg: Any) -> tuple[bool, bool]:
    """(prefill is inkling, decode is inkling) for a server-args view."""
    from sglang.srt.arg_groups.overrides import attention_backends_of

    prefill, decode = attention_backends_of(cfg)
    return prefill == BACKEND_NAME, decode == BACKEND_NAME


def _runtime_inkling_backends() -> tuple[bool, bool]:
    """Same question in the scheduler process, from the published server args."""
    from sglang.srt.runtime_context import attention_backends

    prefill, decode = attention_backends()
    return prefill == BACKEND_NAME, decode == BACKEND_NAME


def _flag_pair(cfg: Any) -> str:
    return (f"--attention-backend {cfg.attention_backend!r}, --prefill-attention-backend "
            f"{cfg.prefill_attention_backend!r}, --decode-attention-backend {cfg.decode_attention_backend!r}")



# ---------------------------------------------------------------------------------------------------------------
# Resolution hooks (launcher process)


def handle_mxfp8_kv_cache_compatibility(server_args: Any, previous: Callable[[Any], None]) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution, resolved_view, resolving_view

    cfg = resolving_view(server_args)
    prefill, decode = inkling_backends(resolved_view(server_args))
    if KV_FORMAT_OF_FLAG.get(cfg.kv_cache_dtype) is not KVFormat.MXFP8 or not (prefill or decode):
        previous(server_args)
        return
    if not (prefill and decode):
        raise ValueError(
            "--kv-cache-dtype mxfp8 with the inkling backend needs inkling for both prefill and decode (the MXFP8 "
            f"pool is this backend's; another backend cannot read it); got {_flag_pair(cfg)}")
    # SGLang's own check (Blackwell only) guards its FA4 reader; this backend reads MXFP8 on any device.
    if cfg.page_size is None:
        declare_resolution(server_args, _HOOK_SOURCE, page_size=MXFP8_PAGE_SIZE)
        logger.info("inkling: --kv-cache-dtype mxfp8 uses page size %d (SGLang's interleaved scale layout)",
                    MXFP8_PAGE_SIZE)
    elif cfg.page_size != MXFP8_PAGE_SIZE:
        raise ValueError(
            f"--kv-cache-dtype mxfp8 with --attention-backend inkling needs --page-size {MXFP8_PAGE_SIZE} "
            f"(SGLang's interleaved UE8M0 scale layout); got --page-size {cfg.page_size}. Allowed: --page-size "
            f"{MXFP8_PAGE_SIZE}, or leave --page-size unset.")


def handle_attention_backend_compatibility(server_args: Any, previous: Callable[[Any], None]) -> None:
    previous(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, model_config_of, resolved_view

    cfg = resolved_view(server_args)
    prefill, decode = inkling_backends(cfg)
    if not (prefill or decode):
        return
    validate_server_args(cfg, model_config_of(server_args), prefill=prefill, decode=decode)

    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    graph_config = cfg.cuda_graph_config
    model_config = model_config_of(server_args)
    head_dim = getattr(model_config, "head_dim", None)
    capturable = decode and decode_graph_capturable(cfg.device, head_dim)
    if prefill:  # another backend's prefill keeps the graph SGLang chose for it
        prefill_graph = prefill_graph_backend(
            graph_config.prefill.backend, locked=(Phase.PREFILL, "backend") in getattr(
                server_args, "_cuda_graph_config_locked", set()),
            capturable=decode_graph_capturable(cfg.device, head_dim),
            speculative=cfg.speculative_algorithm is not None, architectures=_architectures(model_config))
        graph_config = with_phase(graph_config, Phase.PREFILL, backend=prefill_graph)
    if decode and cfg.speculative_algorithm is not None:
        verify_graphs = verify_graphs_setting()  # a bad value is refused wherever speculation is asked for
        if not capturable:
            logger.warning("inkling: decode CUDA graphs disabled with --speculative-algorithm %s on device %r: the "
                           "torch route cannot be captured, verify steps run eagerly", cfg.speculative_algorithm,
                           cfg.device)
            graph_config = with_phase(graph_config, Phase.DECODE, backend=Backend.DISABLED)
        elif not verify_graphs:
            # The target's decode graph runner captures TARGET_VERIFY batches; the backend builds their metadata in
            # graph buffers (VerifyGraphBuffers). 0 turns that off: decode graphs go, and EAGLE's draft graphs too.
            logger.warning("inkling: %s=0: decode CUDA graphs disabled with --speculative-algorithm %s, verify steps "
                           "run eagerly", VERIFY_GRAPHS_ENV, cfg.speculative_algorithm)
            graph_config = with_phase(graph_config, Phase.DECODE, backend=Backend.DISABLED)
        else:
            logger.info("inkling: the target's verify steps run under CUDA graphs (--speculative-algorithm %s; %s=0 "
                        "runs them eagerly)", cfg.speculative_algorithm, VERIFY_GRAPHS_ENV)
    elif decode and not capturable:
        if cfg.device == "cpu":
            # SGLang builds its CPU graph runner from --enable-torch-compile alone; the backend implements its hooks
            # and keeps attention out of the compiled graphs (torch.compiler.disable).
            if cfg.enable_torch_compile:
                logger.info("inkling: CPU graph runner (--enable-torch-compile): the model is compiled, attention "
                            "runs eagerly between the compiled regions")
        else:
            logger.warning("inkling: decode CUDA graphs disabled on device %r: the torch route cannot be captured "
                           "(the Triton route can, where sglang_inkling_backend.triton provides it)", cfg.device)
        graph_config = with_phase(graph_config, Phase.DECODE, backend=Backend.DISABLED)
    elif decode and cfg.speculative_algorithm is None:
        graph_config = widen_decode_graphs(server_args, graph_config)
    declare_resolution(server_args, _HOOK_SOURCE, cuda_graph_config=graph_config)


# The most requests a decode CUDA graph of this backend covers when the flags leave it to SGLang (whose default on an
# H100/H200 at tp < 4 is 256, arg_groups/memory_hook.py): an eager decode step of this backend pays its host work per
# layer that a graph replay does not (bench/results/current/served/README.md).
DECODE_GRAPH_MAX_BS = 1024


def widen_decode_graphs(server_args: Any, graph_config: Any) -> Any:
    """``graph_config`` with decode graphs up to ``DECODE_GRAPH_MAX_BS`` requests (SGLang's own batch-size list for
    that bound, at most ``--max-running-requests``), where SGLang chose a smaller bound itself: neither
    ``--cuda-graph-max-bs-decode`` nor ``--cuda-graph-bs-decode`` (nor a JSON graph config) set it."""
    from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    decode = graph_config.decode
    locked = getattr(server_args, "_cuda_graph_config_locked", set())
    if decode.backend == Backend.DISABLED or (Phase.DECODE, "max_bs") in locked or (Phase.DECODE, "bs") in locked:
        return graph_config
    limit = DECODE_GRAPH_MAX_BS
    running = getattr(server_args, "max_running_requests", None)
    if isinstance(running, int) and running > 0:
        limit = min(limit, running)
    if not decode.max_bs or decode.max_bs >= limit:
        return graph_config
    logger.info("inkling: decode CUDA graphs up to %d requests (SGLang's default bound here: %d; "
                "--cuda-graph-max-bs-decode sets it)", limit, decode.max_bs)
    return with_phase(graph_config, Phase.DECODE, max_bs=limit,
                      bs=generate_decode_cuda_graph_batch_sizes(server_args, limit))


def _architectures(model_config: Any) -> set:
    return set(getattr(getattr(model_config, "hf_config", None), "architectures", None) or ())


def prefill_graph_backend(backend: str, *, locked: bool, capturable: bool, speculative: bool,
                          architectures: set) -> str:
    """The prefill CUDA graph backend for a server whose prefill is inkling's, from the one SGLang resolved.

    SGLang's breakable graph (``breakable``, its CUDA default) captures the model between attention calls and runs
    each attention call eagerly with the step's metadata from ``init_forward_metadata``: what this backend serves
    eagerly, so it stays on where the Triton route serves prefill. It stays off for a model whose own code around
    attention reads the backend's per-step tensors (the in-tree Inkling model's fused prologues: a captured segment
    would keep the capture's addresses) and under speculative decoding (not run on a GPU with it). A FULL prefill
    graph captures attention itself, which needs metadata this backend does not build: refused where the flag asked
    for it, turned off where a default did."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    if backend == Backend.FULL:
        if locked:
            raise UnsupportedFeature(
                "--attention-backend inkling does not serve a FULL prefill CUDA graph (--cuda-graph-backend-prefill "
                "full): attention is captured there, with metadata this backend does not build; allowed: breakable, "
                "disabled")
        logger.info("inkling: prefill CUDA graph: a FULL graph default is replaced by none (attention captured with "
                    "metadata this backend does not build)")
        return Backend.DISABLED
    if backend != Backend.BREAKABLE:
        return backend
    own_prologues = sorted(architectures & set(_OWN_PROLOGUE_ARCHITECTURES))
    why = ("the torch route, which runs on the host" if not capturable else
           "speculative decoding (not yet run with it on a GPU)" if speculative else
           f"{', '.join(own_prologues)}, whose fused attention prologues outside the attention call read the "
           "backend's per-step tensors" if own_prologues else "")
    if why:
        (logger.warning if locked else logger.info)(
            "inkling: prefill CUDA graph (breakable) %s: %s; prefill runs eagerly",
            "refused" if locked else "off", why)
        return Backend.DISABLED
    logger.info("inkling: prefill runs under SGLang's breakable CUDA graph (the model captured between attention "
                "calls; attention eager, planned once per step); --disable-prefill-cuda-graph turns it off")
    return backend


def apply_inkling_prefill_cuda_graph_default(server_args: Any, previous: Callable[[Any], None]) -> None:
    from sglang.srt.arg_groups.overrides import resolving_view

    prefill, decode = inkling_backends(resolving_view(server_args))
    if prefill or decode:
        logger.info("inkling: not applying the Inkling model's FULL prefill CUDA graph default (FA4-only metadata)")
        return
    previous(server_args)


VERIFY_GRAPHS_ENV = settings.VERIFY_GRAPHS.name


def verify_graphs_setting() -> bool:
    """Whether a speculative target's verify steps run under CUDA graphs where the Triton route serves
    (``INKLING_VERIFY_GRAPHS``: 1, the default, or 0). Off, start-up turns decode graphs off with speculation, which
    also drops EAGLE's draft graphs (SGLang has one switch for both, ``Phase.DECODE``)."""
    return settings.verify_graphs()


def decode_graph_capturable(device: str | None, head_dim: int | None = None) -> bool:
    """Decode CUDA graphs need the Triton route (a CUDA/ROCm device, our Triton kernels, a head size they serve)."""
    if device not in (None, "cuda"):
        return False
    from sglang_inkling_backend.routes import accelerated_route_possible

    return accelerated_route_possible(() if head_dim is None else (head_dim,))[0]


# Speculative algorithms this backend serves. It runs the target's extends and verify steps (several draft tokens per
# request over the cached prefix, with SGLang's tree or chain mask) on the Triton route. NGRAM has no draft model.
# EAGLE/EAGLE3 run their draft model on one of SGLang's own backends (DRAFT_ATTENTION_BACKENDS; SGLang's
# DraftBackendFactory has no entry for this one) over a 16-bit draft pool; their verify batches are NGRAM's to this
# backend (SGLang 0.5.23 eagle_utils.build_tree_kernel_efficient). Each was run through the real server on a GPU
# against the same server without speculation (docs/SERVING.md, "Speculative decoding").
SPECULATIVE_ALGORITHMS = ("NGRAM", "EAGLE", "EAGLE3")
DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3")
# Where each runs: CUDA/ROCm ("cuda") through the Triton route's verify kernel; NGRAM also on a CPU through the torch
# route (integration/test_speculative_cpu.py serves it with SGLang's CPU speculative ops as the CPU sgl_kernel
# stand-in's torch code). EAGLE on a CPU is untested: SGLang builds and verifies its trees there with the CPU
# sgl_kernel's build_tree_kernel_efficient_cpu / verify_tree_greedy_cpu (kernels/ops/speculative/spec_tree.py:39),
# which the project's CPU set-up lacks.
SPECULATIVE_DEVICES = {"NGRAM": ("cuda", "cpu"), "EAGLE": ("cuda",), "EAGLE3": ("cuda",)}
_DEVICE_NAMES = {"cuda": "CUDA/ROCm", "cpu": "CPU"}
DRAFT_ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3")
# Models that run their own attention prologues, outside the attention call: the in-tree Inkling model. Its verify
# prologue (FA4's, chain-only short conv) is not hooked here, so speculative decoding stays refused for it; its fused
# prologues store K/V through the backend's per-step ``forward_metadata``, so it stays out of SGLang's breakable
# prefill graph (a captured segment would keep the capture's addresses).
_OWN_PROLOGUE_ARCHITECTURES = ("InklingForConditionalGeneration",)


def validate_server_args(cfg: Any, model_config: Any, *, prefill: bool, decode: bool) -> None:
    """Start-up validation: each error names the flag and the allowed values."""
    kv_cache_dtype = cfg.kv_cache_dtype
    _validate_speculative(cfg, model_config)
    kv_format = flag_format(kv_cache_dtype)
    quantized = kv_format is not None and kv_format.quantized
    if quantized and not (prefill and decode):
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} with the inkling backend needs inkling for both prefill and decode "
            f"(the quantized pool is this backend's); got {_flag_pair(cfg)}")
    if quantized and getattr(cfg, "enable_hierarchical_cache", False):
        _validate_quantized_hicache(cfg, kv_cache_dtype)
    if model_config is None:
        return
    if getattr(model_config, "is_encoder_decoder", False):
        raise ValueError("--attention-backend inkling serves decoder-only models; this model is encoder-decoder. "
                         "Choose another --attention-backend (e.g. torch_native)")
    if getattr(getattr(model_config, "attention_arch", None), "name", None) == "MLA":
        raise ValueError("--attention-backend inkling serves multi-head (MHA/GQA) attention; this model uses MLA. "
                         "Choose another --attention-backend")
    num_heads = getattr(model_config, "num_attention_heads", None)
    tp_size = getattr(cfg, "tp_size", 1) or 1
    if isinstance(num_heads, int) and num_heads % tp_size:
        divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        raise ValueError(
            f"--tp-size {tp_size} does not divide this model's {num_heads} query heads, so the ranks cannot split "
            f"them for --attention-backend inkling; allowed --tp-size values: {', '.join(map(str, divisors))}")
    head_dim = getattr(model_config, "head_dim", None)
    if kv_format is KVFormat.MXFP8 and head_dim is not None and not head_dim_ok(head_dim):
        raise ValueError(
            f"--kv-cache-dtype mxfp8 needs head_dim to be a multiple of 32 (one UE8M0 scale per 32 channels); this "
            f"model has head_dim {head_dim}. Allowed --kv-cache-dtype values for it: auto, bf16, fp8_e4m3")


def _validate_speculative(cfg: Any, model_config: Any) -> None:
    algorithm = cfg.speculative_algorithm
    if algorithm is None:
        return
    name = str(getattr(algorithm, "name", algorithm)).upper()
    if name not in SPECULATIVE_ALGORITHMS:
        raise ValueError(
            f"--attention-backend inkling does not support speculative decoding with --speculative-algorithm "
            f"{algorithm} (its draft steps are not served here, nor run on another backend); allowed: "
            f"{', '.join(SPECULATIVE_ALGORITHMS)}, or leave --speculative-algorithm unset")
    if cfg.device not in SPECULATIVE_DEVICES.get(name, ("cuda",)):
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling is served on "
            f"{' and '.join(_DEVICE_NAMES[d] for d in SPECULATIVE_DEVICES[name])} devices; got --device {cfg.device}")
    mxfp8_pool = KV_FORMAT_OF_FLAG.get(cfg.kv_cache_dtype) is KVFormat.MXFP8
    page_size = MXFP8_PAGE_SIZE if mxfp8_pool else (getattr(cfg, "page_size", None) or 1)
    if cfg.device == "cpu" and page_size > 1:
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling on a CPU needs a KV pool of page "
            f"size 1 (--kv-cache-dtype auto, bf16 or fp8_e4m3 without --page-size): SGLang 0.5.23 places a paged "
            f"pool's draft tokens with a Triton kernel (mem_cache/allocation.py get_last_loc), which a CPU does not "
            f"run; got --kv-cache-dtype {cfg.kv_cache_dtype}, page size {page_size}")
    if cfg.device == "cpu" and getattr(cfg, "enable_torch_compile", False):
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling on a CPU runs its verify steps "
            f"eagerly: leave --enable-torch-compile unset (SGLang 0.5.23's CPU graph runner, which that flag builds, "
            f"asserts that no speculative algorithm is set)")
    if name in DRAFT_MODEL_ALGORITHMS:
        _validate_draft_model(cfg, algorithm)
    architectures = _architectures(model_config)
    if architectures & set(_OWN_PROLOGUE_ARCHITECTURES):
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling is not supported for "
            f"{', '.join(sorted(architectures))}: the model runs its own speculative-verify attention prologue, "
            "which this backend does not serve; leave --speculative-algorithm unset")


def _validate_draft_model(cfg: Any, algorithm: Any) -> None:
    """The draft model's steps run on SGLang's own backend, which has no MXFP8 reader: without
    ``--speculative-draft-kv-cache-dtype bf16`` SGLang 0.5.23 gives the draft the target's dtype string (unset and
    auto alike, model_runner.py's draft KV dtype), and an MXFP8 pool's bytes would be read without their scales. A
    per-tensor fp8 draft pool is not run anywhere here, so every 8-bit target asks for a bf16 draft pool."""
    draft_backend = getattr(cfg, "speculative_draft_attention_backend", None)
    if draft_backend not in DRAFT_ATTENTION_BACKENDS:
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling runs the draft model on another "
            f"backend: set --speculative-draft-attention-backend to one of {', '.join(DRAFT_ATTENTION_BACKENDS)} "
            f"(got {draft_backend!r}; inkling serves the target's extend and verify steps)")
    from sglang.srt.environ import envs

    if envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.get():
        # SGLang 0.5.23's eagle_worker_common.run_eagle_verify then asks the target's backend for
        # update_verify_buffers_to_fill_after_draft, which this backend does not implement
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --attention-backend inkling does not support "
            "SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1 (a verify plan on a side stream); unset it")
    target_format = KV_FORMAT_OF_FLAG.get(cfg.kv_cache_dtype)  # None for a flag not served (refused after this)
    draft_dtype = getattr(cfg, "speculative_draft_kv_cache_dtype", None)
    draft_format = KV_FORMAT_OF_FLAG.get(draft_dtype)
    if target_format is not None and target_format.quantized and draft_format is not KVFormat.BF16:
        raise ValueError(
            f"--speculative-algorithm {algorithm} with --kv-cache-dtype {cfg.kv_cache_dtype} on --attention-backend "
            f"inkling needs --speculative-draft-kv-cache-dtype bf16 (got {draft_dtype!r}): the draft runs on "
            f"{draft_backend} over a pool of its own, and SGLang gives an unset or auto draft dtype the target's")


def _draft_on_its_own_backend(configurator: Any) -> bool:
    """A draft runner's pool when its model runs on another backend (``_validate_draft_model``): SGLang's own."""
    if not getattr(configurator, "is_draft_worker", False):
        return False
    from sglang.srt.runtime_context import get_spec

    return getattr(get_spec(), "speculative_draft_attention_backend", None) not in (None, BACKEND_NAME)


def _validate_quantized_hicache(cfg: Any, kv_cache_dtype: str) -> None:
    """HiCache with an 8-bit pool: SGLang's MXFP8 host pool moves the scale bytes with their pages only through its
    CUDA/HIP kernels in the page_first layout, and has no storage (L3) pages; a per-tensor fp8 pool's pages are
    plain bytes, but an L3 key does not name the KV dtype (sglang#33268), so another run's pages could be read."""
    flag = f"--enable-hierarchical-cache with --kv-cache-dtype {kv_cache_dtype} on --attention-backend inkling"
    if cfg.device != "cuda":
        raise ValueError(f"{flag} needs a CUDA/ROCm device (SGLang's host-pool transfer kernels); got --device "
                         f"{cfg.device}")
    if getattr(cfg, "hicache_storage_backend", None):
        raise ValueError(f"{flag} keeps pages in host memory only; got --hicache-storage-backend "
                         f"{cfg.hicache_storage_backend} (MXFP8 host pages have no storage form, and storage keys do "
                         "not name the KV dtype); leave it unset")
    if flag_format(kv_cache_dtype) is KVFormat.MXFP8:
        layout = getattr(cfg, "hicache_mem_layout", "page_first")
        io_backend = getattr(cfg, "hicache_io_backend", "kernel")
        if layout != "page_first" or io_backend != "kernel":
            raise ValueError(f"{flag} needs --hicache-mem-layout page_first and --hicache-io-backend kernel (SGLang's "
                             f"MXFP8 host pool moves the scales only so); got {layout} and {io_backend}")


# ---------------------------------------------------------------------------------------------------------------
# KV-pool configurator hooks (scheduler process)


@contextlib.contextmanager
def _cpu_fp8_gate_lifted():
    """SGLang's configure() refuses e4m3 KV on CPU unless AMX and intel_amx serve it. Make its two probes answer
    yes for the duration of one configure() call, in which the pool and its reader are this backend's."""
    import sglang.srt.mem_cache.kv_cache_configurator as configurator

    saved = configurator.cpu_has_amx_support, configurator.attention_backends
    configurator.cpu_has_amx_support = lambda: True
    configurator.attention_backends = lambda: tuple(
        "intel_amx" if name == BACKEND_NAME else name for name in saved[1]())
    try:
        yield
    finally:
        configurator.cpu_has_amx_support, configurator.attention_backends = saved


def around_configure(original, self, *args, **kwargs):
    import torch
    from sglang.srt.platforms import current_platform

    prefill, decode = _runtime_inkling_backends()
    if current_platform.is_cpu() and self.kv_cache_dtype == torch.float8_e4m3fn and prefill and decode:
        if self.use_mla_backend:
            raise ValueError("--attention-backend inkling serves multi-head (MHA/GQA) attention; this model uses MLA")
        logger.info("inkling: %s KV cache on CPU without AMX: pool and reader are the inkling backend's",
                    self.kv_cache_dtype_str)
        with _cpu_fp8_gate_lifted():
            return original(self, *args, **kwargs)
    return original(self, *args, **kwargs)


def around_build_token_to_kv_pool(original, self, *, sizes, is_dsa_model, is_dsv4_model, req_to_token_pool):
    prefill, decode = _runtime_inkling_backends()
    if not (prefill or decode) or _draft_on_its_own_backend(self):
        return original(self, sizes=sizes, is_dsa_model=is_dsa_model, is_dsv4_model=is_dsv4_model,
                        req_to_token_pool=req_to_token_pool)
    from sglang_inkling_backend.hosts.sglang import pool as inkling_pool

    return inkling_pool.build_token_to_kv_pool(
        self, original, sizes=sizes, is_dsa_model=is_dsa_model, is_dsv4_model=is_dsv4_model,
        req_to_token_pool=req_to_token_pool)


def around_hybrid_full_attention_pool_class(original, self, *, mha_pool_class, mla_pool_class, dsa_pool_class):
    prefill, decode = _runtime_inkling_backends()
    if (prefill or decode) and not self.use_mla_backend and not _draft_on_its_own_backend(self):
        from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class

        return inkling_pool_class(pool_format(self.kv_cache_dtype_str, self.kv_cache_dtype))
    return original(self, mha_pool_class=mha_pool_class, mla_pool_class=mla_pool_class,
                    dsa_pool_class=dsa_pool_class)


def around_build_mha_quant_method(original, self, *, num_layers):
    prefill, decode = _runtime_inkling_backends()
    if prefill or decode:
        return None  # the inkling pool quantizes K/V itself
    return original(self, num_layers=num_layers)


RESOLUTION_HOOKS = {
    "handle_mxfp8_kv_cache_compatibility": handle_mxfp8_kv_cache_compatibility,
    "handle_attention_backend_compatibility": handle_attention_backend_compatibility,
    "apply_inkling_prefill_cuda_graph_default": apply_inkling_prefill_cuda_graph_default,
}
CONFIGURATOR_HOOKS = {
    f"{_CONFIGURATOR}.configure": around_configure,
    f"{_CONFIGURATOR}._build_token_to_kv_pool": around_build_token_to_kv_pool,
    f"{_CONFIGURATOR}._hybrid_full_attention_pool_class": around_hybrid_full_attention_pool_class,
    f"{_CONFIGURATOR}._build_mha_quant_method": around_build_mha_quant_method,
}


def install() -> None:
    """Register every hook once per process (SGLang's registries append, so a second call must not)."""
    global _installed
    if _installed:
        return
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name, fn in RESOLUTION_HOOKS.items():
        if fn not in _HOOKS.get(name, ()):
            register_resolution_hook(name)(fn)
    for target, fn in CONFIGURATOR_HOOKS.items():
        if not any(hook is fn for _, hook, _ in HookRegistry._hooks.get(target, ())):
            HookRegistry.register(target, fn, HookType.AROUND)
    _installed = True


def installed() -> bool:
    """Whether every hook is registered in this process's SGLang registries (what a failed plugin would miss)."""
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS
    from sglang.srt.plugins.hook_registry import HookRegistry

    return all(fn in _HOOKS.get(name, ()) for name, fn in RESOLUTION_HOOKS.items()) and all(
        any(hook is fn for _, hook, _ in HookRegistry._hooks.get(target, ()))
        for target, fn in CONFIGURATOR_HOOKS.items())
