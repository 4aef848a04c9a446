"""The digest of a stage's own code: its module and every tpubuild module it imports.

Computed from the installed sources (never a hand-kept version number), so editing
`stages/report.py`, a `savedmodel/` helper it uses, or pulling a new tpubuild under an
editable install reruns exactly the stages whose code changed. Imports are found by
reading the modules' syntax trees (including imports inside functions, where the stages
import TensorFlow-facing code lazily), without importing anything.
"""

from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from pathlib import Path

import tpubuild
from tpubuild.digests import hash_bytes

PACKAGE_ROOT = Path(tpubuild.__file__).resolve().parent
MODULE_NAME = re.compile(r"tpubuild(\.[A-Za-z_][A-Za-z0-9_]*)+")
# Code that runs around every stage: the worker process (not the pool that starts it, nor the
# build loop), the hand-on protocol, the stage contract, errors, atomic writes.
RUNTIME_MODULES = ("tpubuild.workers.process", "tpubuild.handoff", "tpubuild.stages.base", "tpubuild.errors",
                   "tpubuild.atomic")


def module_file(name: str) -> Path | None:
    """The source file of `tpubuild.x.y` under the installed package, if it exists."""
    parts = name.split(".")[1:]
    base = PACKAGE_ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# An import statement that starts a line (a parenthesized name list may span lines), and
# a string constant naming a tpubuild module, which is run (`python -m tpubuild.x` in a
# subprocess) or imported by name: what `_imports` reads without parsing the whole file.
_STATEMENT = re.compile(rb"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*(?:\([^)]*\)|[^\n]*)|import[ \t]+[^\n]*)", re.M)
_IMPORT_WORD = re.compile(rb"\bimport\b")
_MODULE_STRING = re.compile(rb"""(['"])(tpubuild(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\1""")


@lru_cache(maxsize=None)
def _imports(path: Path, name: str) -> frozenset[str]:
    """tpubuild modules named by the import statements of one source file.

    Parsing every file of a closure costs ~0.3 s, more than a no-op build, and `build
    --check` in a fresh clone has no memo of the digests. So only the import statements
    are parsed, found by a pattern; a file where the word `import` appears anywhere else
    (prose, `x; import y`, `if a: import b`) or a statement does not parse alone is
    parsed whole. tests/engine/test_check_from_locks.py checks both agree on every module."""
    source = path.read_bytes()
    text = source.replace(b"\\\n", b" ")  # backslash continuations
    statements = [m.group(0) for m in _STATEMENT.finditer(text)]
    try:
        if sum(len(_IMPORT_WORD.findall(s)) for s in statements) != len(_IMPORT_WORD.findall(text)):
            raise SyntaxError("an import outside the statements found")
        nodes = [node for s in statements for node in ast.parse(s.strip()).body]
    except SyntaxError:
        return _parsed_imports(source, path, name)
    found = _import_names(nodes, name if path.name == "__init__.py" else name.rpartition(".")[0])
    found.update(m.group(2).decode() for m in _MODULE_STRING.finditer(source))
    return frozenset(m for m in found if m == "tpubuild" or m.startswith("tpubuild."))


def _parsed_imports(source: bytes, path: Path, name: str) -> frozenset[str]:
    """`_imports` from the file's whole syntax tree."""
    nodes = list(ast.walk(ast.parse(source, filename=str(path))))
    found = _import_names(nodes, name if path.name == "__init__.py" else name.rpartition(".")[0])
    found.update(node.value for node in nodes
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value))
    return frozenset(m for m in found if m == "tpubuild" or m.startswith("tpubuild."))


def _import_names(nodes, package: str) -> set[str]:
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import mod`
            face = package_face(module)  # `from pkg import name`: the module of pkg that defines it
            found.update(face[alias.name] for alias in node.names if alias.name in face)
    return found


@lru_cache(maxsize=None)
def package_face(package: str) -> dict[str, str]:
    """A package's face, name -> the module defining it: the literal `_FACE` of its
    `__init__.py` (tpubuild's packages load their parts lazily, by that mapping), read
    without importing anything. Empty for a module or a package without one."""
    if not package.startswith("tpubuild"):
        return {}
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_FACE" for t in node.targets):
            return {name: f"{package}.{module}" for name, module in ast.literal_eval(node.value).items()}
    return {}


def closure(roots: tuple[str, ...]) -> dict[str, Path]:
    """Every tpubuild module reachable by imports from `roots` (with parent packages)."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_file(name)
        if path is None:
            continue  # `from pkg import function`: not a module
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(path, name))
    return seen


@lru_cache(maxsize=None)
def code_digest(module: str) -> str:
    """BLAKE3 over (module name, source bytes) of the stage module's closure."""
    files = closure((module, *RUNTIME_MODULES))
    lines = []
    for name in sorted(files):
        lines.append(f"{name}\0{hash_bytes(files[name].read_bytes())}")
    return hash_bytes("\n".join(lines).encode())


def forget_code() -> None:
    """Read the sources again (a long-lived process after tpubuild's files changed)."""
    code_digest.cache_clear()
    _imports.cache_clear()
    package_face.cache_clear()
    planning_code_digest.cache_clear()


def package_fingerprint() -> str:
    """A digest of the stat of every source file of the installed package: when it is
    unchanged, so are all code digests (one directory walk instead of parsing ~80 files)."""
    parts = []
    for dirpath, dirnames, filenames in os.walk(PACKAGE_ROOT):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".json", ".proto")):  # code and the schemas it validates with
                st = os.stat(os.path.join(dirpath, name))
                parts.append(f"{dirpath}/{name}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}")
    return hash_bytes("\n".join(parts).encode())


# What decides a lock file's keys besides each stage's own code: the recipe loader and the
# canonical form it hashes, the registry of stages, the resolver that takes the keys, and
# the lock file's own reading and quick check.
PLANNING_ROOTS = ("tpubuild.config.recipe", "tpubuild.pipeline", "tpubuild.engine.resolver",
                  "tpubuild.lock.lockfile", "tpubuild.lock.quickcheck")
# Every stage module lives here (pipeline.py registers them).
STAGE_FOLDERS = ("stages", "targets")
# The package's files (relative paths, or folders ending in /) that decide no key: the
# build loop, the worker pool, the commands, review, publishing's in-place update, the
# remote cache, gc. Left out of `planning_code_digest`, so that an edit there changes no
# lock file. No stage's closure nor the planning roots' may reach one of them
# (tests/examples/test_planning_scope.py); a new module is in the digest until listed here.
NOT_PLANNING = (
    "__main__.py", "cli.py", "commands/", "convert.py", "diagnosis/", "engine/explain.py", "engine/lockcheck.py",
    "engine/cache.py", "engine/loop.py", "engine/tasks.py", "entry.py", "fs/wslock.py", "lock/memo.py", "lock/shape.py",
    "provenance/digests.py", "provenance/signature.py", "publish/destination.py", "publish/refresh.py",
    "publish/serving_config.py", "publish/to_destination.py", "publish/verify_remote.py",
    "publish/version_check.py", "remote/", "render.py",
    "report/targets.py", "review/", "store/gc.py", "store/registration.py", "tpu/inspect.py", "workers/logs.py",
    "workers/pool.py", "workers/ray.py",
)


def stage_modules() -> tuple[str, ...]:
    """Every module under stages/ and targets/: what a stage key's code digest may root at."""
    found = []
    for folder in STAGE_FOLDERS:
        for path in sorted((PACKAGE_ROOT / folder).rglob("*.py")):
            parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(found)


def planning(rel: str) -> bool:
    """Whether the package file at `rel` (POSIX, relative to the package) can decide a key."""
    return not any(rel == entry or (entry.endswith("/") and rel.startswith(entry)) for entry in NOT_PLANNING)


@lru_cache(maxsize=None)
def planning_code_digest() -> str:
    """A digest of the content of every source file of the package that can decide a stage
    key (code and the schemas it validates with; not NOT_PLANNING's): what a lock file's
    `planning` line pins, and what `build --check` compares before trusting its keys
    without computing them (lock/quickcheck.py). ~1 MB read, once."""
    parts = []
    # schemas/ is a link to the repository's schemas in a checkout, a folder once installed.
    for dirpath, dirnames, filenames in os.walk(PACKAGE_ROOT, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".json", ".proto")):
                path = os.path.join(dirpath, name)
                rel = Path(os.path.relpath(path, PACKAGE_ROOT)).as_posix()
                if planning(rel):
                    with open(path, "rb") as handle:
                        parts.append(f"{rel}\0{hash_bytes(handle.read())}")
    return hash_bytes("\n".join(parts).encode())


def code_digests(modules: list[str], memo_file: Path | None) -> dict[str, str]:
    """`code_digest` of each module, reusing the digests memoized in `memo_file` while the
    package's files are unchanged (by stat, ctime included)."""
    import json

    from tpubuild.atomic import write_text_atomic

    fingerprint = package_fingerprint()
    memo: dict = {}
    if memo_file is not None:
        try:
            memo = json.loads(memo_file.read_text())
        except (OSError, ValueError):
            memo = {}
    digests = memo.get("digests", {}) if memo.get("fingerprint") == fingerprint else {}
    missing = [m for m in modules if m not in digests]
    if missing:
        digests = {**digests, **{m: code_digest(m) for m in missing}}
        if memo_file is not None:
            try:
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(memo_file, json.dumps({"fingerprint": fingerprint, "digests": digests}))
            except OSError:
                pass  # only a memo
    return {m: digests[m] for m in modules}


def code_files(module: str) -> list[str]:
    """Package-relative files of the closure (what `explain` can name)."""
    return sorted(os.path.relpath(p, PACKAGE_ROOT) for p in closure((module, *RUNTIME_MODULES)).values())
