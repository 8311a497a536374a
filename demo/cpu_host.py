"""What the real SGLang 0.5.23 needs to run on a CPU-only machine: the project's shims and the environment.

The shims live in the source tree, ``third_party/sglang_cpu/`` (see its README): a stand-in ``sgl_kernel``, a
torchvision work-around (``sitecustomize.py``) and the GGUF -> safetensors converter. ``INKLING_SGLANG_CPU_SHIMS``
points elsewhere when the package is not used from a checkout (``shims_dir``, the SGLang host's ``cpu_testing``).
"""
import os
import sys
from pathlib import Path

from sglang_inkling_backend.hosts.sglang.cpu_testing import shims_dir

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout: demo/ sits beside sglang_inkling_backend/


def cpu_env(omp_threads_bind: str | None = None, base: dict | None = None) -> dict:
    """Environment for SGLang (server or converter) on a CPU: CPU engine, shims first on PYTHONPATH,
    no torch.compile (Gemma-3's rotary function would otherwise spend ~15 s in a C++ compile), and this Python's
    scripts directory first on PATH, as an activated venv has it (SGLang's JIT C++ builds, NGRAM's n-gram corpus,
    run ``ninja``, which the test extras install there)."""
    env = dict(os.environ if base is None else base)
    scripts = os.path.dirname(sys.executable)
    env["PATH"] = scripts + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    pythonpath = str(shims_dir() / "pythonpath")
    env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["TORCHDYNAMO_DISABLE"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if omp_threads_bind is not None:
        # One OpenMP thread group per TP rank ("0|1" = one core each); without it SGLang asserts ranks <= NUMA nodes.
        env["SGLANG_CPU_OMP_THREADS_BIND"] = omp_threads_bind
    return env
