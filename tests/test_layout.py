"""The package's layering, checked from its source: the core imports no host and no accelerator, accelerators import
no host, hosts never import each other, and no two modules import each other (directly or around a longer cycle).

Module-level imports and imports inside functions both count: a lazy import is still a dependency."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_inkling_backend"
NAME = "sglang_inkling_backend"
ACCELERATORS = ("triton", "mlx", "flashinfer")  # kernel families, each a folder
# The core's one sanctioned reach outward: the route dispatch imports the Triton family's route module lazily when
# it is asked for an accelerated route (routes.triton_family, routes.choose_route); nothing else in the core names
# an accelerator or a host. The Triton route itself lives in its folder (triton/route.py) and imports the core.
ALLOWED = {(f"{NAME}.routes", f"{NAME}.triton")}


def module_name(path: Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports (resolved to the longest known module name)."""
    is_pkg = path.name == "__init__.py"
    base = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target.startswith(NAME) and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in ACCELERATORS:
        return parts[1]
    if len(parts) > 2 and parts[1] == "hosts":
        return f"hosts.{parts[2]}"
    if len(parts) > 1 and parts[1] in ("hosts", "entry_points"):
        return parts[1]
    return "core"


GRAPH = {name: imports_of(name, path, package_modules()) for name, path in package_modules().items()}


def test_the_scan_sees_the_packages_layers():
    layers = {layer_of(n) for n in GRAPH}
    assert {"core", "triton", "mlx", "flashinfer", "hosts.sglang", "entry_points"} <= layers, layers
    assert f"{NAME}.hosts.sglang.backend" in GRAPH[f"{NAME}.entry_points.sglang"]  # a lazy import is seen


def test_the_package_never_imports_the_launcher_beside_it():
    """``demo/`` (the checkout's server launcher, beside the package and not shipped in the wheel) imports the
    package; no package module imports it."""
    assert (PACKAGE.parent / "demo" / "__main__.py").is_file()
    bad = set()
    for name, path in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            bad |= {(name, t) for t in targets if t.split(".")[0] == "demo"}
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if layer_of(n) == "core"))
def test_the_core_imports_no_host_and_no_accelerator(name):
    outward = {t for t in GRAPH[name] if layer_of(t) != "core" and (name, f"{NAME}.{layer_of(t)}") not in ALLOWED}
    assert not outward, f"{name} imports {sorted(outward)}"


def test_accelerators_import_no_host():
    bad = {(n, t) for n, ts in GRAPH.items() if layer_of(n) in ACCELERATORS
           for t in ts if layer_of(t).startswith("hosts")}
    assert not bad, bad


def test_hosts_never_import_each_other():
    hosts = {layer_of(n) for n in GRAPH if layer_of(n).startswith("hosts.")}
    assert {"hosts.sglang", "hosts.vllm"} <= hosts, hosts
    bad = {(n, t) for n, ts in GRAPH.items() if layer_of(n).startswith("hosts.")
           for t in ts if layer_of(t).startswith("hosts.") and layer_of(t) != layer_of(n)}
    assert not bad, bad
    # and each host's entry point names only its own host
    bad = {(n, t) for n, ts in GRAPH.items() if n.startswith(f"{NAME}.entry_points.")
           for t in ts if layer_of(t).startswith("hosts.") and layer_of(t) != f"hosts.{n.rsplit('.', 1)[1]}"}
    assert not bad, bad


def test_no_import_cycles():
    """Tarjan's strongly connected components over the package's import graph: every component is one module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    # A package's __init__ re-exporting its own submodules is not a cycle in the sense that matters (the
    # submodules do not need the __init__'s names); drop edges from a package to its own children first.
    real = [c for c in cycles if not all(any(o.startswith(m + ".") or m.startswith(o + ".") for o in c if o != m)
                                         for m in c)]
    assert not real, f"import cycles: {real}"


def test_the_core_imports_without_any_host_or_accelerator():
    """In a fresh interpreter with sglang, vllm, triton and mlx made unimportable, every core module imports."""
    core = sorted(n for n in GRAPH if layer_of(n) == "core")
    code = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('sglang', 'vllm', 'triton', 'mlx', 'sgl_kernel', 'flashinfer'):
            raise ImportError(f'blocked: {{name}}')
sys.meta_path.insert(0, Block())
for name in {core!r}:
    importlib.import_module(name)
print('ok', len({core!r}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=PACKAGE.parent, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-3000:]
