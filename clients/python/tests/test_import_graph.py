"""The client's modules import each other without circles and bottom up,
counting imports inside functions too: each module imports only modules of
its own layer or of the layers below it (LAYERS: the leaves, transport,
state, ops, elastic, the frameworks, Keras, the Keras façades)."""

from __future__ import annotations

import ast
import os

PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "hvdd"))


def _modules(pkg: str = PKG) -> dict:
    """hvdd's modules by dotted name -> their source path."""
    mods = {}
    for root, _, files in os.walk(pkg):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(root, f), os.path.dirname(pkg))[: -len(".py")].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            mods[".".join(rel)] = os.path.join(root, f)
    return mods


def _node_imports(node: ast.AST, name: str, path: str, mods: dict) -> set:
    """The hvdd modules one import statement of module name imports."""
    is_pkg = path.endswith("__init__.py")
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    targets = []
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        # from X import m: the module X.m if there is one, else X
        targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
    out = set()
    for t in targets:
        while t and t not in mods:
            t = t.rpartition(".")[0]
        if t and t != name:
            out.add(t)
    return out


def _imports(name: str, path: str, mods: dict) -> set:
    """The hvdd modules that module name imports, anywhere in its source."""
    out: set = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= _node_imports(node, name, path, mods)
    return out


def _circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The layers, bottom up (docs/ARCHITECTURE.md, the Python client). A module
# belongs to the layer of the longest name listed that is its own or a
# package above it; "hvdd" is the package's __init__ alone. A module that no
# layer names fails test_layers: give a new module its place here.
LAYERS = [
    # Nothing of hvdd but each other: errors, the wire format, the protocol's
    # messages, every environment read, host-update notifications.
    ("leaves", ["hvdd.exceptions", "hvdd._wire", "hvdd._proto", "hvdd._env", "hvdd._notifications"]),
    # The connection to the daemon, the GPU path's CUDA IPC (the _cuda
    # package: its seam, libcuda binding, pools and sessions; the frameworks'
    # exporters live in their packages), and for jobs under mpirun or srun
    # the daemon the job starts (_launcher).
    ("transport", ["hvdd._shm", "hvdd._channel", "hvdd._cuda", "hvdd._reader", "hvdd._client", "hvdd._launcher"]),
    # init, ranks, process sets (hvdd itself re-exports them).
    ("state", ["hvdd.basics", "hvdd"]),
    # The one funnel of every collective, host or device tensor.
    ("ops", ["hvdd.ops"]),
    ("elastic", ["hvdd.elastic"]),
    ("frameworks", ["hvdd.torch", "hvdd.tensorflow"]),
    # The Keras API written once: it imports hvdd.tensorflow's modules, never
    # the hvdd.tensorflow package.
    ("keras", ["hvdd._keras"]),
    ("facades", ["hvdd.keras", "hvdd.tensorflow.keras"]),
]


def _layer(name: str) -> int:
    """The index in LAYERS of module name's layer; -1 for none."""
    best, found = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if name == p or (p != "hvdd" and name.startswith(p + ".")):
                if len(p) > best:
                    best, found = len(p), i
    return found


def _upward(graph: dict) -> list:
    """The imports of a module of a higher layer, as (importer, imported)."""
    return sorted((a, b) for a in graph for b in graph[a] if _layer(b) > _layer(a))


def _graph() -> tuple:
    mods = _modules()
    return mods, {m: _imports(m, p, mods) for m, p in mods.items()}


# The frameworks' own imports, which only their layers (and Keras's above
# them) may make, anywhere in a module: the GPU path's seam, its session and
# the ops every framework shares stay framework-neutral (a torch exporter
# lives in hvdd.torch, never in hvdd._cuda).
FRAMEWORKS = {"torch", "tensorflow", "keras", "tf_keras", "jax"}


def _foreign(path: str) -> set:
    """The top-level names of the packages outside hvdd that the module at
    path imports, anywhere in its source (relative imports are hvdd's)."""
    out: set = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _framework_imports(mods: dict) -> list:
    """(module, framework) for each framework import of a module below the
    frameworks' layer."""
    low = [n for n, _ in LAYERS].index("frameworks")
    return sorted((m, f) for m, p in mods.items() if 0 <= _layer(m) < low for f in _foreign(p) & FRAMEWORKS)


def test_framework_neutral_layers_import_no_framework() -> None:
    mods = _modules()
    found = [f"{m} imports {f}" for m, f in _framework_imports(mods)]
    assert found == [], "a framework imported below the frameworks' layer:\n" + "\n".join(found)
    # The GPU path's parts are where this test looks.
    assert {"hvdd._cuda", "hvdd._cuda._session", "hvdd._cuda._driver", "hvdd._cuda._pool"} <= set(mods)
    assert _layer("hvdd._cuda._exporter") < _layer("hvdd.ops") < _layer("hvdd.torch._cuda_export")


def test_the_check_finds_a_framework_import() -> None:
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hvdd_import_graph_fw_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write("import numpy\nfrom . import _wire\ndef f():\n    from torch.cuda import Event\n")
    try:
        assert _foreign(path) == {"numpy", "torch"}
        mods = {"hvdd._cuda._session": path, "hvdd.torch._cuda_export": path}
        assert _framework_imports(mods) == [("hvdd._cuda._session", "torch")]
    finally:
        os.remove(path)


def test_no_import_circles() -> None:
    _, graph = _graph()
    assert _circles(graph) == []


def test_layers() -> None:
    mods, graph = _graph()
    unplaced = sorted(m for m in mods if _layer(m) < 0)
    assert unplaced == [], f"modules in no layer (add them to LAYERS): {unplaced}"
    upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})" for a, b in _upward(graph)]
    assert upward == [], "imports of a higher layer:\n" + "\n".join(upward)


def test_the_check_sees_imports_inside_functions() -> None:
    mods = {"hvdd": "", "hvdd.a": "", "hvdd.b": ""}
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hvdd_import_graph_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write("def f():\n    from .b import x\n")
    try:
        assert _imports("hvdd.a", path, mods) == {"hvdd.b"}
    finally:
        os.remove(path)


def test_the_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_check_finds_an_upward_import() -> None:
    graph = {"hvdd._client": {"hvdd.elastic", "hvdd._wire"}, "hvdd.elastic": {"hvdd.ops"}, "hvdd.ops": set()}
    assert _upward(graph) == [("hvdd._client", "hvdd.elastic")]
    assert _layer("hvdd.tensorflow.keras.callbacks") > _layer("hvdd._keras.api") > _layer("hvdd.tensorflow.mpi_ops")
    assert _layer("hvdd") == _layer("hvdd.basics") and _layer("hvdd.nothing_placed") == -1
