"""The package's shape: no import cycles, no private names used across modules, one
definition of each shared constant, every registered stage reachable, and packages used
from outside through their face only.

The import graph is read from the syntax trees (imports inside functions count: the
stages import TensorFlow-facing code lazily, and a lazy import is still a dependency),
the same way `tpubuild/keys/code.py` finds a stage's code closure.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tpubuild
from tpubuild import pipeline
from tpubuild.keys.code import module_file, package_face

ROOT = Path(tpubuild.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for each tpubuild import of a file."""
    tree = ast.parse(path.read_bytes())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in MODULES:  # `from pkg import module`
                    out.append((f"{module}.{alias.name}", None, node.lineno))
                elif alias.name in package_face(module):  # `from pkg import name`, through pkg's face
                    out.append((package_face(module)[alias.name], alias.name, node.lineno))
                else:
                    out.append((module, alias.name, node.lineno))
    return [(m, n, line) for m, n, line in out if m == "tpubuild" or m.startswith("tpubuild.")]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = set()
        for module, _, _ in _imports(name, path):
            # Importing a.b.c runs a/__init__ and a/b/__init__ first.
            parts = module.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {e for e in edges if e in MODULES and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_tpubuild_modules():
    assert _cycles(_graph()) == []


def test_no_private_name_is_imported_from_another_module():
    crossings = [
        f"{path.relative_to(ROOT.parent)}:{line}: {module}.{imported}"
        for name, path in MODULES.items()
        for module, imported, line in _imports(name, path)
        if imported and imported.startswith("_") and not imported.startswith("__") and module != name
    ]
    assert crossings == []


def test_no_private_attribute_of_another_tpubuild_module_is_used():
    """`module._helper` or `instance._field` reached from outside: the same crossing."""
    crossings = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_bytes())
        local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and (n.module or "").startswith("tpubuild") for a in n.names}
        local |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                  for a in n.names if a.name.startswith("tpubuild")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in local):
                crossings.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert crossings == []


def _top_level_assignments(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_bytes())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_each_shared_constant_and_helper_is_defined_once():
    shared = ("CALL_OPS", "MANIFEST", "LOCK_SUFFIX", "human_size", "human_bytes", "fsync_path",
              "fsync_directory", "TARGET_STAGES", "TARGET_DEFAULTS", "MAIN_TARGET", "TRANSFORMS")
    definitions = {constant: sorted(m for m in MODULES if constant in _top_level_assignments(m))
                   for constant in shared}
    assert {c: m for c, m in definitions.items() if len(m) > 1} == {}


def test_one_latency_method():
    """Every target's latency comes from tpubuild/verify/latency.py."""
    measuring = sorted(m for m in MODULES if {"median_latency_us", "_tf_latency", "measure"}
                       & _top_level_assignments(m))
    assert measuring == ["tpubuild.verify.latency"]


def test_every_registered_stage_module_exists_and_is_imported_by_no_stage():
    for name in pipeline.STAGE_ORDER:
        if name in pipeline.ENGINE_STEPS:
            continue
        module = pipeline.stage_module(name)
        assert module_file(module) is not None, module
        assert pipeline.spec(name).name == name
    graph = _graph()
    importers = sorted(m for m, edges in graph.items() if "tpubuild.pipeline" in edges)
    stage_modules = {pipeline.stage_module(n) for n in pipeline.STAGE_ORDER if n not in pipeline.ENGINE_STEPS}
    assert not stage_modules & set(importers)


def test_a_target_is_its_folder_and_one_registry_line():
    for target, package in pipeline.TARGET_PACKAGES.items():
        assert package == f"tpubuild.targets.{target}"
        build, verify = pipeline.target(target).chain
        assert pipeline.stage_module(build) == f"{package}.stage"
        assert pipeline.stage_module(verify) == f"{package}.verify_stage"
        # Everything the target's stages use that is the target's own lives in its folder.
        for module in MODULES:
            if module.startswith("tpubuild.") and target in module.split(".")[-1] and module != package:
                assert module.startswith(package + "."), module


def _faced_packages() -> list[str]:
    return sorted(name for name in MODULES if package_face(name))


def test_a_package_with_a_face_is_used_from_outside_through_it_alone():
    """`from tpubuild.store import Store`, never `from tpubuild.store.store import Store`:
    what a package's `__init__` exports is all the rest of tpubuild may use of it."""
    crossings = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_bytes())
        for package in _faced_packages():
            if name == package or name.startswith(package + "."):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module == package:
                    modules = [f"{package}.{a.name}" for a in node.names if f"{package}.{a.name}" in MODULES]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    modules = [node.module or ""]
                else:
                    continue
                crossings += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {m}" for m in modules
                              if m.startswith(package + ".")]
    assert crossings == []


def test_every_name_of_a_face_is_defined_where_it_says():
    for package in _faced_packages():
        for name, module in package_face(package).items():
            assert module in MODULES, (package, name, module)
            assert name in _top_level_assignments(module), (package, name, module)


def test_each_package_face_has_a_stub_equal_to_it():
    """Type checkers read `__init__.pyi` (scripts/face_stubs.py writes it from `_FACE`): a name
    added to a face without its stub would be invisible to them, one in the stub alone a lie."""
    from scripts.face_stubs import differing, faces

    assert len(faces()) >= 9
    assert [str(p.relative_to(ROOT.parent)) for p in differing()] == []


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_transport_knows_no_keys_records_store_or_its_users():
    """issue 49 item 6: the transport under the remote cache and the publish destinations
    imports neither of them, nor stage keys or the store (what it may read is the caller's
    to say: a limit, a root)."""
    graph = _graph()
    transport = [name for name in MODULES if name == "tpubuild.transport" or name.startswith("tpubuild.transport.")]
    assert len(transport) >= 3
    above = ("tpubuild.keys", "tpubuild.store", "tpubuild.remote", "tpubuild.publish", "tpubuild.engine")
    reached = {name: sorted(m for m in _reaches(graph, name) if m.startswith(above)) for name in transport}
    assert reached == {name: [] for name in transport}


def test_the_remote_cache_never_touches_the_local_store():
    """issue 49 item 6: RemoteCache speaks to the remote only; remote/transfer.py alone moves
    records and objects between the local store and it (the layered cache's job)."""
    graph = _graph()
    # The store's layout version (`v1`, store/layout.py) names the remote's root too; nothing else of the store.
    assert sorted(m for m in _reaches(graph, "tpubuild.remote.cache") if m.startswith("tpubuild.store")) == [
        "tpubuild.store", "tpubuild.store.layout"]
    assert "tpubuild.remote.transfer" in graph["tpubuild.engine.cache"]
    source = MODULES["tpubuild.remote.cache"].read_text()
    assert "Store" not in source.replace("StageEntry", "")


def test_no_empty_file_in_the_project():
    """issue 49 item 8: every file the project ships says something (an empty `__init__.py`
    gets a docstring saying why it is there; `py.typed` says what it marks)."""
    repo = ROOT.parent
    places = [repo / name for name in ("tpubuild", "tests", "recipes", "schemas", "docs", "scripts", "benchmarks")]
    empty = [path.relative_to(repo).as_posix() for place in places if place.is_dir() for path in place.rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and ".tpubuild" not in path.parts
             and path.stat().st_size == 0]
    empty += [path.name for path in repo.iterdir() if path.is_file() and path.stat().st_size == 0]
    assert empty == []
