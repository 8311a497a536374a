"""Test-only patch for the vLLM GPU runs: with ``INKLING_TEST_BREAK_SCALE=eps`` set, ``--attention-backend CUSTOM``
(this backend) uses a softmax scale ``(1 + eps)`` times the layer's, the class of bug a wrong head-dim scale is, so
that the parity comparison can be seen to fail. Unset (every other run): this file does nothing. The class is
patched when ``sglang_inkling_backend.hosts.vllm.backend`` is first imported (an import hook), so processes that
never build the backend are untouched."""
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
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_EPS = os.environ.get("INKLING_TEST_BREAK_SCALE")

if _EPS:
    def _patch(module):
        cls = module.InklingVllmImpl
        original = cls.__init__
        factor = 1.0 + float(_EPS)

        def broken_init(self, num_heads, head_size, scale, *args, **kwargs):
            original(self, num_heads, head_size, scale * factor, *args, **kwargs)

        cls.__init__ = broken_init
        print(f"[sitecustomize] inkling vLLM backend deliberately broken: softmax scale x{factor}", file=sys.stderr)

    sys.meta_path.insert(0, _PatchOnImport("sglang_inkling_backend.hosts.vllm.backend", _patch))
