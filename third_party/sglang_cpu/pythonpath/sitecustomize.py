"""torchvision work-around for a CPU torch with the PyPI (CUDA-built) torchvision. See ../README.md.

SGLang imports torchvision unconditionally. The PyPI torchvision's C ops link libtorch_cuda and cannot load on a CPU
torch, and torchvision/_meta_registrations.py then fails with "operator torchvision::nms does not exist". Defining the
two op schemas just before torchvision is first imported is enough. No-op unless SGLANG_USE_CPU_ENGINE=1.
"""
import os
import sys

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
    import importlib.abc

    class _DefineTorchvisionOpSchemas(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torchvision":
                return None
            sys.meta_path.remove(self)
            import torch
            for op in ("nms", "qnms"):
                try:
                    getattr(torch.ops.torchvision, op)
                except (AttributeError, RuntimeError):
                    torch.library.define(f"torchvision::{op}",
                                         "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            return None  # let the normal finders import torchvision

    sys.meta_path.insert(0, _DefineTorchvisionOpSchemas())
