"""Test-only CUDA stand-in for ``sgl_kernel`` (SGLang 0.5.23 on a GPU machine without the sglang-kernel wheel).

Implements, in plain torch, what a dense decode/extend step of a Llama- or Gemma-3-style model calls through
``sgl_kernel`` (RMSNorm plain / fused-add / Gemma, the gated activations, weak_ref_tensor, the sampling renorms).
Every other name, and every ``sgl_kernel.<submodule>``, resolves to a placeholder that raises
``NotImplementedError`` naming itself when called, so an import never hides a call that would need the real wheel.
Set ``INKLING_TEST_SGL_KERNEL_LOG=/path`` to append the name of every implemented function at its first call.

Never shipped: this folder lives under gpu_tests/ and is put on PYTHONPATH by gpu_tests/sglang/run_server.sh.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

import torch
import torch.nn.functional as F

__version__ = "0.4.9"  # SGLang's engine asserts sglang-kernel >= 0.4.9 (it reads package metadata, see below)

_HERE = os.path.dirname(os.path.abspath(__file__))
_CALL_LOG = os.environ.get("INKLING_TEST_SGL_KERNEL_LOG")
_logged: set[str] = set()


def _record(name: str) -> None:
    if _CALL_LOG and name not in _logged:
        _logged.add(name)
        with open(_CALL_LOG, "a") as f:
            f.write(name + "\n")


class _Missing:
    """A name the stand-in does not implement: attribute access works (import-time constants such as
    ``scalar_types.uint4b8``), calling raises."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._qualname}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._qualname} is not implemented by the test-only sgl_kernel stand-in "
                                  "(gpu_tests/sglang/pythonpath/sgl_kernel)")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in placeholder {self._qualname}>"

    def __mro_entries__(self, bases):  # `class X(sgl_kernel.Something)` at import time
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = _Missing(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Synthesizes any ``sgl_kernel.x.y`` submodule as a package of placeholders."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        relative = fullname[len(__name__) + 1:].replace(".", os.sep)
        if os.path.exists(os.path.join(_HERE, relative + ".py")):  # a real submodule of the stand-in (utils.py)
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _SubmoduleFinder())
sys.modules[__name__].__class__ = _StubModule


# ---------------------------------------------------------------------------------------------------------------
# RMSNorm (flashinfer semantics: float32 math, result in the input dtype)

def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    return (y * w).to(x.dtype)


def _norm_into(name, input, weight, eps, out, gemma):
    _record(name)
    result = _rms(input, weight, eps, gemma)
    if out is None:
        return result
    out.copy_(result)
    return out


def _fused_add_norm(name, input, residual, weight, eps, gemma):
    """In place: residual += input; input = rmsnorm(residual) * weight (Gemma: * (1 + weight))."""
    _record(name)
    summed = input.float() + residual.float()
    residual.copy_(summed.to(residual.dtype))
    input.copy_(_rms(summed, weight, eps, gemma).to(input.dtype))


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _norm_into("rmsnorm", input, weight, eps, out, gemma=False)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add_norm("fused_add_rmsnorm", input, residual, weight, eps, gemma=False)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    return _norm_into("gemma_rmsnorm", input, weight, eps, out, gemma=True)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    _fused_add_norm("gemma_fused_add_rmsnorm", input, residual, weight, eps, gemma=True)


# ---------------------------------------------------------------------------------------------------------------
# Gated activations: x = [gate | up] on the last dim, out = act(gate) * up

def _gated(name, act, input, out=None):
    _record(name)
    d = input.shape[-1] // 2
    result = (act(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def silu_and_mul(input, out=None, enable_pdl=None):
    return _gated("silu_and_mul", F.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _gated("gelu_and_mul", lambda x: F.gelu(x, approximate="none"), input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _gated("gelu_tanh_and_mul", lambda x: F.gelu(x, approximate="tanh"), input, out)


def gelu_quick(input, out=None):
    _record("gelu_quick")
    result = (input.float() * torch.sigmoid(1.702 * input.float())).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Misc

def weak_ref_tensor(tensor):
    """The real kernel returns a tensor aliasing the same storage without holding a reference; an alias that does
    hold one is enough for a test server (the graph's buffers live as long as the runner anyway)."""
    _record("weak_ref_tensor")
    return tensor.view(tensor.shape) if isinstance(tensor, torch.Tensor) else tensor


def top_k_renorm_prob(probs, top_k, *args, **kwargs):
    _record("top_k_renorm_prob")
    k = top_k if isinstance(top_k, torch.Tensor) else torch.full((probs.shape[0],), int(top_k), device=probs.device)
    sorted_probs, _ = probs.sort(dim=-1, descending=True)
    kth = sorted_probs.gather(1, (k.long().clamp(1, probs.shape[1]) - 1).view(-1, 1))
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs, top_p, *args, **kwargs):
    _record("top_p_renorm_prob")
    p = top_p if isinstance(top_p, torch.Tensor) else torch.full((probs.shape[0],), float(top_p), device=probs.device)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cum = sorted_probs.cumsum(-1)
    drop = (cum - sorted_probs) > p.view(-1, 1)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)
