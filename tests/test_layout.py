"""The package's layering, checked from its source: the core imports no host and no accelerator, accelerators import
no host, hosts never import each other, the rooms (core, each accelerator folder, each host, entry points) import
each other in one direction only, and no two modules import each other (directly or around a longer cycle).

Module-level imports and imports inside functions both count: a lazy import is still a dependency, and so is a route
module the core imports by its path (``routes.ACCELERATED_ROUTES``)."""
from __future__ import annotations

import ast
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from sglang_inkling_backend.routes import ACCELERATED_ROUTES

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_inkling_backend"
NAME = "sglang_inkling_backend"
# Every folder of the package is an accelerator (a kernel family or a route composing some) but these: the core's
# own folder, the hosts, the entry points and the demo. A new accelerator is a new folder, seen here as one.
NOT_ACCELERATORS = ("reference", "hosts", "entry_points", "demo")
ACCELERATORS = frozenset(p.name for p in PACKAGE.iterdir()
                         if (p / "__init__.py").is_file() and p.name not in NOT_ACCELERATORS)


def route_reaches(route_modules) -> set[tuple[str, str]]:
    """The core's sanctioned reaches outward: the route dispatch (``routes``) imports each accelerated route module
    it lists, by path, when it is asked for an accelerated route; nothing else in the core names an accelerator or a
    host. So these pairs follow from the one list, ``routes.ACCELERATED_ROUTES``."""
    return {(f"{NAME}.routes", path) for path in route_modules}


ALLOWED = route_reaches(ACCELERATED_ROUTES)


def module_name(path: Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports (resolved to the longest known module name)."""
    return imports_in(name, path.read_text(), path.name == "__init__.py", modules, str(path))


def imports_in(name: str, source: str, is_pkg: bool, modules, filename: str = "<source>") -> set[str]:
    """The package modules the source of module ``name`` imports (resolved to the longest name in ``modules``)."""
    base = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source, filename)):
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


def layer_of(name: str, accelerators=ACCELERATORS) -> str:
    """The room of module ``name``: ``core``, an accelerator folder, ``hosts.<engine>``, ``hosts`` (its
    ``__init__``), ``entry_points``."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in accelerators:
        return parts[1]
    if len(parts) > 2 and parts[1] == "hosts":
        return f"hosts.{parts[2]}"
    if len(parts) > 1 and parts[1] in ("hosts", "entry_points"):
        return parts[1]
    return "core"


def package_graph(route_modules=ACCELERATED_ROUTES) -> dict[str, set[str]]:
    """Each package module's imports; ``routes`` also imports each route module it lists by path."""
    modules = package_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    graph[f"{NAME}.routes"] |= set(route_modules)
    return graph


GRAPH = package_graph()


def core_reaches_outward(graph, accelerators=ACCELERATORS, allowed=ALLOWED) -> set[tuple[str, str]]:
    """The core's imports of a host or an accelerator other than the sanctioned reaches."""
    return {(n, t) for n, ts in graph.items() if layer_of(n, accelerators) == "core"
            for t in ts if layer_of(t, accelerators) != "core" and (n, t) not in allowed}


def accelerators_importing_hosts(graph, accelerators=ACCELERATORS) -> set[tuple[str, str]]:
    return {(n, t) for n, ts in graph.items() if layer_of(n, accelerators) in accelerators
            for t in ts if layer_of(t, accelerators).startswith("hosts")}


def room_graph(graph, accelerators=ACCELERATORS, allowed=ALLOWED) -> dict[str, set[str]]:
    """Which rooms import which (a room's own modules left out), the sanctioned reaches left out."""
    rooms: dict[str, set[str]] = {}
    for n, ts in graph.items():
        here = layer_of(n, accelerators)
        rooms.setdefault(here, set()).update(layer_of(t, accelerators) for t in ts if (n, t) not in allowed)
        rooms[here].discard(here)
    return rooms


def room_cycles(graph, accelerators=ACCELERATORS, allowed=ALLOWED) -> list[tuple[str, ...]]:
    """Every pair or longer loop of rooms importing each other (depth-first, each loop once from its least room)."""
    rooms, loops = room_graph(graph, accelerators, allowed), set()

    def walk(path):
        for nxt in rooms.get(path[-1], ()):
            if nxt == path[0]:
                loops.add(tuple(path))
            elif nxt not in path and nxt > path[0]:
                walk(path + [nxt])

    for room in rooms:
        walk([room])
    return sorted(loops)


def test_the_scan_sees_the_packages_layers():
    layers = {layer_of(n) for n in GRAPH}
    assert {"core", "triton", "mlx", "flashinfer", "gpu", "hosts.sglang", "entry_points"} <= layers, layers
    assert f"{NAME}.hosts.sglang.backend" in GRAPH[f"{NAME}.entry_points.sglang"]  # a lazy import is seen
    assert ALLOWED and all(t in GRAPH for _, t in ALLOWED)  # every listed route module exists


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
    outward = {t for t in GRAPH[name] if layer_of(t) != "core" and (name, t) not in ALLOWED}
    assert not outward, f"{name} imports {sorted(outward)}"


def test_accelerators_import_no_host():
    bad = accelerators_importing_hosts(GRAPH)
    assert not bad, bad


def test_rooms_import_each_other_in_one_direction():
    """No two rooms import each other, around any loop: the kernel families (``triton``, ``flashinfer``, ``mlx``)
    import only the core, and ``gpu`` composes ``triton`` and ``flashinfer``, which import neither it nor each
    other. The core's reach into the route modules it lists is the one arrow back."""
    assert not room_cycles(GRAPH), room_cycles(GRAPH)
    rooms = room_graph(GRAPH)
    assert rooms["triton"] == rooms["flashinfer"] == rooms["mlx"] == {"core"}, rooms
    assert {"triton", "flashinfer"} <= rooms["gpu"], rooms


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


# A new accelerator, as a newcomer would add it: a folder ``toy/`` with a route module, and one line in
# routes.ACCELERATED_ROUTES. The toy route serves CUDA devices with the torch reference's numbers.
TOY_ROUTE = '''
from sglang_inkling_backend.reference import attention as reference
from sglang_inkling_backend.route_protocol import Route


class ToyRoute(Route):
    name = "toy"

    def decode(self, q, kv, keys, params, *, max_seq_len, plans, workspace):
        return reference.paged_decode_attention(q, kv, keys.indptr, keys.indices, params)

    def extend(self, q, kv, rails, qo_indptr, params, *, plans=None, verify=None, workspace=None):
        return reference.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params, verify)


def unavailable_because(device, head_dims=()):
    return "" if device is None or device.type == "cuda" else f"the toy kernels run on CUDA only, not {device}"


def route_for(device):
    return ToyRoute(), f"toy kernels on {device}"
'''


def test_a_new_accelerator_is_a_folder_and_one_line(monkeypatch, caplog):
    """With the toy folder's route module listed first, choose_route picks it (and accelerated_route_possible says
    so), and every layering check accepts it: the core's reach into it follows from the list alone."""
    from sglang_inkling_backend import routes
    from sglang_inkling_backend.route_protocol import Route

    path = f"{NAME}.toy.route"
    folder = types.ModuleType(f"{NAME}.toy")
    folder.__path__ = []
    module = types.ModuleType(path)
    exec(compile(TOY_ROUTE, path, "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, folder.__name__, folder)
    monkeypatch.setitem(sys.modules, path, module)
    listed = (path,) + ACCELERATED_ROUTES
    monkeypatch.setattr(routes, "ACCELERATED_ROUTES", listed)  # the one line

    with caplog.at_level(logging.INFO, logger=routes.__name__):
        route = routes.choose_route(torch.device("cuda"), head_dims=(48,))
    assert isinstance(route, module.ToyRoute) and isinstance(route, Route) and route.name == "toy"
    assert "inkling: attention route: toy kernels on cuda" in caplog.text
    assert routes.accelerated_route_possible((48,)) == (True, "")
    assert route.plan_graph_step(None, [], torch.ones(1), kv_format="bf16", max_bs=1, max_seq_len=1) is None
    assert route.fused_store is None and not route.graph_capturable  # the protocol's defaults, no getattr

    modules = {**package_modules(), path: None}
    graph = package_graph(listed)
    graph[path] = imports_in(path, TOY_ROUTE, False, modules)
    accelerators = ACCELERATORS | {"toy"}  # what the folder on disk would add
    allowed = route_reaches(listed)
    assert layer_of(path, accelerators) == "toy" and f"{NAME}.route_protocol" in graph[path]
    assert not core_reaches_outward(graph, accelerators, allowed)
    assert not accelerators_importing_hosts(graph, accelerators)
    assert not room_cycles(graph, accelerators, allowed)
    # the reach is sanctioned by the line: without it, the same import is the core reaching outward
    assert core_reaches_outward(graph, accelerators, ALLOWED) == {(f"{NAME}.routes", path)}
