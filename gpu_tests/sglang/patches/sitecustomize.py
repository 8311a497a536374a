"""Test-only import-time patches for the server runs (gpu_tests/sglang/gpu_env.sh sets the variables on the GPU
machine; serve_check.py --cpu on a CPU). This folder holds only this file, first on PYTHONPATH; the next
``sitecustomize`` on the path (the CPU shims' one, third_party/sglang_cpu/pythonpath) still runs, at the end.

``INKLING_TEST_NO_DUAL_GEMM=1``: SGLang's Llama MLP asks ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` (CuTe DSL,
the nvidia-cutlass-dsl wheel, not carried) whether its fused gate/up + down GEMM applies; the patch answers "no"
(``DualGemm._select_mode`` returns None), so the plain MergedColumnParallelLinear + RowParallelLinear path runs,
for every attention backend alike.

``INKLING_TEST_NO_CUTE_INIT=1``: SGLang's Inkling attention imports ``flash_attn.cute.batch_invariance`` (a
pure-Python flag), and the package's ``__init__`` imports the FA4 interface, which needs the same CuTe DSL. The patch
gives that package an empty ``__init__`` (its submodules still import from its folder); ``attn.py`` already guards its
own ``cutlass`` import, and neither the inkling backend (which implements the FA4 kwarg contract itself) nor SGLang's
triton backend calls FA4.

``INKLING_TEST_SEEDED_INIT=1`` (with ``--load-format dummy``): SGLang's dummy weights (uniform in +-1e-3, norms
included) leave every logit tied. ``make_models.seeded_dummy_weights`` replaces them, the same for every attention
backend and process (q/k norms ``INKLING_TEST_QK_SCALE``, default 3). Buffers are left as built.

``INKLING_TEST_NO_INKLING_CHAT=1``: for an Inkling checkpoint the OpenAI server builds its chat adapter at start-up,
which needs the ``tml-renderers`` package and a served tokenizer equal to its o200k one ("Serving Inkling requires the
`tml-renderers` package"). The harness sends ``/generate`` requests only (token ids, or text through the served
tokenizer), never chat: the patch makes the adapter's renderer a stand-in that raises ``NotImplementedError`` if a
chat request ever reaches it, and skips the tokenizer comparison.

``INKLING_TEST_CPU_MAMBA_EXTRA_BUFFER=1`` (with ``TRITON_INTERPRET=1``, for the Inkling model on a CPU:
integration/test_inkling_model.py): the model asserts SGLang's mamba extra-buffer mode, which SGLang allows on
accelerators only ("extra_buffer requires platform support for Mamba cache state snapshots"). The patch answers yes
on the CPU, gives SGLang's autotuned short-conv kernels a constant benchmark (no device to time them on under the
interpreter), and makes ``Tensor.pin_memory`` a no-op (the decode batch's track mask is staged through pinned
memory: "Cannot access accelerator device when none is available").

``INKLING_TEST_DUMP_ATTENTION=DIR``: every ``RadixAttention`` call with at least 2 query rows, up to
``INKLING_TEST_DUMP_CALLS`` (default 6), is saved to ``DIR/callN.pt``. Each file holds q, k, v, the relative bias
(``rel_bias``, or the triton contract's ``aux_tensors[0]``), the output, the layer's scale and window, the positions
and the keyword names. It serves the oracle check of integration/test_inkling_model.py.

``INKLING_TEST_Q_BF16=1`` (a diagnostic of issue #36, with SGLang's fused Inkling prologue off:
``SGLANG_OPT_USE_INKLING_FUSED_ATTN_PROLOGUE=0``): in MXFP8 mode the in-tree Inkling model rounds Q to MXFP8 with
``to_mxfp8`` before the attention call (FA4's contract). The patch makes that one call, the one whose argument is a
view of the caller's local ``q`` in ``inkling_common/attn.py``, return Q unrounded with no ``q_descale``; K and V
are quantized as before. It separates Q's rounding from K/V's in the drift from bf16.

A deliberately broken inkling backend, to show that the parity check can fail:

With ``INKLING_TEST_BREAK_SCALE=eps`` set, every attention call of ``--attention-backend inkling`` uses a softmax
scale ``(1 + eps)`` times the layer's (the class of bug a wrong ``query_pre_attn_scalar`` or head-dim scale is).
Unset (every other run): this file does nothing. It patches the class when ``sglang_inkling_backend.hosts.sglang.backend``
is first imported (an import hook), so processes that never build the backend are untouched.
"""
import importlib.abc
import importlib.util
import os
import sys


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``target`` is first executed."""

    def __init__(self, target, patch):
        self.target, self.patch = target, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        exec_module = spec.loader.exec_module
        patch = self.patch

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get("INKLING_TEST_NO_DUAL_GEMM") == "1":
    def _no_dual_gemm(module):
        module.DualGemm._select_mode = lambda self, gate_up_proj, hidden_size: None

    sys.meta_path.insert(0, _PatchOnImport("sglang.srt.layers.dual_gemm", _no_dual_gemm))

if os.environ.get("INKLING_TEST_NO_CUTE_INIT") == "1":
    class _EmptyPackageInit(importlib.abc.MetaPathFinder):
        target = "sglang.kernels.ops.attention.flash_attn.cute"

        def find_spec(self, fullname, path, target=None):
            if fullname != self.target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            spec.loader.exec_module = lambda module: None  # keeps __path__: submodules import from the folder
            return spec

    sys.meta_path.insert(0, _EmptyPackageInit())

if os.environ.get("INKLING_TEST_SEEDED_INIT") == "1":
    def _seeded_init(model, *args, **kwargs):
        # make_models.py (this folder's parent) owns the test models' weight scheme and its seed
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "make_models.py")
        spec = importlib.util.spec_from_file_location("_inkling_test_make_models", path)
        make_models = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_models)
        make_models.seeded_dummy_weights(model, float(os.environ.get("INKLING_TEST_QK_SCALE", "3")))
        print("[sitecustomize] seeded test weights (INKLING_TEST_SEEDED_INIT)", file=sys.stderr)

    def _patch_dummy_init(module):
        module.initialize_dummy_weights = _seeded_init

    sys.meta_path.insert(0, _PatchOnImport("sglang.srt.model_loader.loader", _patch_dummy_init))

if os.environ.get("INKLING_TEST_NO_INKLING_CHAT") == "1":
    def _no_inkling_chat(module):
        def no_renderer():
            raise NotImplementedError("INKLING_TEST_NO_INKLING_CHAT: the test harness serves no Inkling chat "
                                      "(tml-renderers is not carried)")

        module.load_tml_renderers = lambda: None
        module._check_served_tokenizer = lambda tokenizer: None
        module.render_inkling_messages = lambda *args, **kwargs: no_renderer()

    sys.meta_path.insert(0, _PatchOnImport("sglang.srt.entrypoints.openai.serving_inkling", _no_inkling_chat))

if os.environ.get("INKLING_TEST_CPU_MAMBA_EXTRA_BUFFER") == "1":
    def _cpu_extra_buffer(module):
        module._platform_supports_mamba_cache_extra_buffer = lambda: True

    def _no_autotune_benchmark(module):  # under TRITON_INTERPRET there is no device to time configs on
        module.Autotuner._bench = lambda self, *args, config, **kwargs: [0.0, 0.0, 0.0]

    def _no_pinning(module):  # the mamba track mask is staged through pinned memory, which needs a CUDA device
        module.Tensor.pin_memory = lambda self, *args, **kwargs: self

    sys.meta_path.insert(0, _PatchOnImport("sglang.srt.arg_groups.mamba_hook", _cpu_extra_buffer))
    sys.meta_path.insert(0, _PatchOnImport("triton.runtime.autotuner", _no_autotune_benchmark))
    sys.meta_path.insert(0, _PatchOnImport("torch", _no_pinning))

_DUMP = os.environ.get("INKLING_TEST_DUMP_ATTENTION")
if _DUMP:
    def _dump_attention(module):
        import torch

        original = module.RadixAttention.forward
        calls = [0]
        limit = int(os.environ.get("INKLING_TEST_DUMP_CALLS", "6"))

        def forward(self, q, k, v, forward_batch, save_kv_cache=True, *args, **kwargs):
            out = original(self, q, k, v, forward_batch, save_kv_cache, *args, **kwargs)
            if calls[0] < limit and q.shape[0] >= 2:
                rel = kwargs.get("rel_bias")
                if rel is None and kwargs.get("aux_tensors"):
                    rel = kwargs["aux_tensors"][0]
                torch.save({"layer": self.layer_id, "mode": str(forward_batch.forward_mode), "q": q, "k": k, "v": v,
                            "rel": rel, "out": out, "scaling": self.scaling,
                            "window": self.sliding_window_size, "positions": forward_batch.positions,
                            "kwargs": sorted(kwargs)}, os.path.join(_DUMP, f"call{calls[0]}.pt"))
                calls[0] += 1
            return out

        module.RadixAttention.forward = forward

    sys.meta_path.insert(0, _PatchOnImport("sglang.srt.layers.radix_attention", _dump_attention))

if os.environ.get("INKLING_TEST_Q_BF16") == "1":
    def _query_stays_bf16(module):
        import types

        original = module.to_mxfp8
        site = os.path.join("inkling_common", "attn.py")

        class _NoScale:  # attn.py passes q_mxfp.scale.view(torch.float8_e8m0fnu) on as q_descale: None here
            def view(self, *args, **kwargs):
                return None

        def to_mxfp8(x):
            caller = sys._getframe(1)
            q = caller.f_locals.get("q")
            if caller.f_code.co_filename.endswith(site) and getattr(q, "data_ptr", None) is not None \
                    and x.data_ptr() == q.data_ptr() and x.numel() == q.numel():
                if not _query_stays_bf16.said:
                    print("[sitecustomize] Inkling Q kept unrounded (INKLING_TEST_Q_BF16)", file=sys.stderr)
                    _query_stays_bf16.said = True
                return types.SimpleNamespace(data=x, scale=_NoScale())
            return original(x)

        module.to_mxfp8 = to_mxfp8

    _query_stays_bf16.said = False
    sys.meta_path.insert(0, _PatchOnImport("sglang.kernels.ops.quantization.mxfp8_quant", _query_stays_bf16))

_EPS = os.environ.get("INKLING_TEST_BREAK_SCALE")

if _EPS:
    import dataclasses

    def _patch(module):
        cls = module.InklingAttnBackend
        original = cls._layer_spec
        factor = 1.0 + float(_EPS)

        def broken_layer_spec(self, layer):
            spec = original(self, layer)
            return dataclasses.replace(spec, softmax_scale=spec.scale * factor)

        cls._layer_spec = broken_layer_spec
        print(f"[sitecustomize] inkling backend deliberately broken: softmax scale x{factor}", file=sys.stderr)

    sys.meta_path.insert(0, _PatchOnImport("sglang_inkling_backend.hosts.sglang.backend", _patch))


def _run_next_sitecustomize():
    """Python imports only the first sitecustomize on sys.path; run the next one too (the CPU shims' hook)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry, "sitecustomize.py")
        if entry and os.path.abspath(entry) != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_run_next_sitecustomize()
