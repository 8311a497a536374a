"""Test-only import-time patches for the server runs (gpu_tests/sglang/gpu_env.sh sets the variables on the GPU
machine; serve_check.py --cpu on a CPU). This folder holds only this file, first on PYTHONPATH; the next
``sitecustomize`` on the path (the CPU shims' one, third_party/sglang_cpu/pythonpath) still runs, at the end.

``INKLING_TEST_NO_DUAL_GEMM=1``: SGLang's Llama MLP asks ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` (CuTe DSL,
the nvidia-cutlass-dsl wheel, not carried) whether its fused gate/up + down GEMM applies; the patch answers "no"
(``DualGemm._select_mode`` returns None), so the plain MergedColumnParallelLinear + RowParallelLinear path runs,
for every attention backend alike.

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
