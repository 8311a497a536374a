"""The SGLang harness's module of a name this folder also uses (``make_bundle``, ``serve_bench``), loaded by path:
an ``import`` would find this folder's own module of that name."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def load(name: str):
    path = Path(__file__).resolve().parents[1] / "sglang" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"sglang_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
