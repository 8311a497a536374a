"""Make ``import sglang`` work in-process on a CPU-only machine (unit tests; no server).

SGLang 0.5.23 on CPU needs ``SGLANG_USE_CPU_ENGINE=1`` before its first import, the project's stand-in
``sgl_kernel`` on ``sys.path``, and the torchvision op-schema work-around installed before torchvision is imported
(all three live in the checkout's ``third_party/sglang_cpu/``, or where ``INKLING_SGLANG_CPU_SHIMS`` points). A
server started as a subprocess gets them through its environment instead (``demo/cpu_host.py``, beside the package).
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from sglang_inkling_backend import settings

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout holding sglang_inkling_backend/


def shims_dir() -> Path:
    """The SGLang CPU shims: ``$INKLING_SGLANG_CPU_SHIMS``, else the checkout's ``third_party/sglang_cpu``."""
    configured = settings.sglang_cpu_shims()
    path = Path(configured) if configured else REPO_ROOT / "third_party" / "sglang_cpu"
    if not (path / "pythonpath" / "sgl_kernel" / "__init__.py").is_file():
        raise FileNotFoundError(
            f"SGLang CPU shims not found at {path} (expected pythonpath/sgl_kernel/); run from a checkout of "
            "sglang-inkling-backend or set INKLING_SGLANG_CPU_SHIMS to its third_party/sglang_cpu directory")
    return path


def prepare_sglang_cpu_import() -> None:
    """Idempotent. Must run before anything imports sglang (or torchvision) in this process."""
    if "sglang" in sys.modules:
        if not settings.sglang_cpu_engine():
            raise RuntimeError("sglang was imported before prepare_sglang_cpu_import() without SGLANG_USE_CPU_ENGINE=1")
        return
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    pythonpath = shims_dir() / "pythonpath"  # FileNotFoundError where the shims are not
    if str(pythonpath) not in sys.path:
        sys.path.insert(0, str(pythonpath))
    if "torchvision" not in sys.modules:
        # Runs the shim's sitecustomize body (it installs a one-shot import hook); not imported as `sitecustomize`,
        # which the interpreter may already have taken.
        runpy.run_path(str(pythonpath / "sitecustomize.py"), run_name="_inkling_sglang_cpu_sitecustomize")
