"""The docs name code that exists (issue 49 item 7): every file or folder README.md and
docs/**/*.md name in backticks or links exists, every dotted `module.name` / `Class.method`
they name is defined in tpubuild (read from the syntax trees, nothing imported), every bare
snake_case name or call they give is in the code, and docs/commands.md names every verb and
option the CLI accepts and nothing it does not. Also: docs/architecture.md's layer drawing
has no import running up and its layout names every module, every stage chain a page draws
is pipeline.MAIN_STAGES', and the file names in the code's comments and pyproject.toml exist.

Fast: no TensorFlow, no build. A page added to docs/ is checked like the others."""

from __future__ import annotations

import ast
import itertools
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import click
import pytest

from tests.cli import REPO

PACKAGE = REPO / "tpubuild"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


# --- what the pages name ---------------------------------------------------------------

@dataclass(frozen=True)
class Named:
    page: Path
    line: int
    token: str

    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {self.token}"


FENCE = re.compile(r"^\s*```")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# A word of a span that may name code or a file: a dotted name or a path, a call's
# arguments and the punctuation around it taken off (`pipeline.plan(recipe)`).
WORD = re.compile(r"[A-Za-z_.][\w.\-]*(?:/[\w.\-]*)*")


def named(page: Path) -> list[Named]:
    """The words of the page's inline code spans and the targets of its links, outside
    fenced blocks, with their lines."""
    found = []
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in SPAN.findall(line):
            if "://" in span or "<" in span or "..." in span or "*" in span:
                continue  # an address, a placeholder, an elision or a glob names no one thing
            for word in span.split():
                match = WORD.match(word.lstrip("(["))
                if match and match.group(0).rstrip(".,;:") and ("." in match.group(0) or "/" in match.group(0)):
                    found.append(Named(page, number, match.group(0).rstrip(".,;:")))
        for target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target):  # not a web address
                found.append(Named(page, number, "link:" + target))
    return found


def all_named() -> list[Named]:
    return [n for page in pages() for n in named(page)]


# --- files and folders -----------------------------------------------------------------

# Extensions of files a page names as data, not code (`saved_model.pb`, `verify.json`).
DATA_EXTENSIONS = {"pb", "yaml", "yml", "json", "sig", "tflite", "txt", "sqlite", "key", "cc", "h", "cmake",
                   "toml", "proto", "pem", "tfrecord", "npz", "log", "pbtxt", "csv", "md", "py", "so", "mlir", "hlo", "cpb"}
# Folders that a build, a cache or a report makes at run time, not files of this repository.
RUNTIME_FOLDERS = {"out", "tmp", "objects", "hlo", ".tpubuild", "v1", "assets", "variables", ".pytest_cache",
                   ".hypothesis", "build", "dist"}
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "out", ".tpubuild", "build", "dist"}


@cache
def repository() -> tuple[tuple[Path, ...], frozenset[str]]:
    """Every file of the repository, and the names of its folders: not .git, caches, build
    outputs or virtual environments (pruned, not walked: a built checkout holds many)."""
    import os

    files, dirs = [], set()
    for top, folders, names in os.walk(REPO):
        folders[:] = [f for f in folders if f not in SKIPPED_DIRS and not f.startswith(".venv")
                      and not f.endswith(".egg-info")]
        dirs.update(folders)
        files += [Path(top, name) for name in names]
    return tuple(files), frozenset(dirs)


def tree_names() -> tuple[frozenset[str], frozenset[str]]:
    """The names of every file and of every folder in the repository."""
    files, dirs = repository()
    return frozenset(f.name for f in files), dirs


def is_path(token: str) -> bool:
    """A path (`engine/loop.py`, `config/`), or a file of code or docs by its name (`loop.py`);
    not an extension alone (`.md`) or a file a build writes (`tpubuild-report.md`)."""
    if re.fullmatch(r"\.\w+", token) or token.startswith("tpubuild-"):
        return False
    return "/" in token or token.rsplit(".", 1)[-1] in ("py", "md")


def path_problem(page: Path, token: str) -> str | None:
    """Why a path a page names does not lead to a file or folder of the repository, or None
    (also None for a path that is not of this repository: `out/toy/1/`, `cpu_savedmodel/N`)."""
    link = token.startswith("link:")
    path = token.removeprefix("link:").removeprefix("./")
    if link:
        return None if (page.parent / path).exists() else "no such file"
    bases = (page.parent, REPO, PACKAGE, REPO / "docs")
    if any((base / path).exists() for base in bases):
        return None
    parts = [p for p in path.split("/") if p]
    top = {p.name for p in REPO.iterdir()} | {p.name for p in PACKAGE.iterdir()}
    if parts[0] in RUNTIME_FOLDERS:
        return None
    if len(parts) == 1:
        files, dirs = tree_names()
        if path.endswith("/"):
            return None if parts[0] in dirs else "no such folder"
        return None if parts[0] in files else "no such file"
    if parts[0] in top or parts[0] == "tpubuild":
        return "no such file or folder"
    return None  # a path of a workspace, a cache or a published version, not of this repository


def test_every_file_the_docs_name_exists() -> None:
    problems = [f"{n.where()}: {why}" for n in all_named() if is_path(n.token)
                for why in [path_problem(n.page, n.token)] if why]
    assert problems == [], "\n".join(problems)


# --- code --------------------------------------------------------------------------------

@dataclass
class Module:
    name: str  # dotted, below tpubuild ("" for the package itself)
    path: Path
    tree: ast.Module
    names: dict[str, ast.AST] = field(default_factory=dict)  # top-level definitions
    face: dict[str, str] = field(default_factory=dict)  # a package's `_FACE`: name -> module
    submodules: set[str] = field(default_factory=set)


@cache
def code() -> dict[str, Module]:
    """Every module of the package by dotted name below tpubuild, read with ast."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        tree = ast.parse(path.read_bytes())
        module = Module(".".join(parts), path, tree)
        for node in tree.body:
            for name, value in _bound(node):
                module.names[name] = value
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_FACE" for t in node.targets):
                module.face = ast.literal_eval(node.value)
        modules[module.name] = module
    for name in modules:
        if name:
            parent = name.rpartition(".")[0]
            modules[parent].submodules.add(name.rpartition(".")[2])
    return modules


def _bound(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """The names a top-level or class-level statement binds, with what binds them."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, node)]
    if isinstance(node, ast.Assign):
        return [(n.id, node.value) for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [(node.target.id, node.value or node)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [((a.asname or a.name).split(".")[0], node) for a in node.names]
    if isinstance(node, (ast.If, ast.Try)):
        inner = node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]
        return [b for s in inner for b in _bound(s)]
    return []


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    found: dict[str, list[ast.ClassDef]] = {}
    for module in code().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def class_members(node: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str]:
    """A class's methods, class attributes and fields, attributes its methods set on self,
    and the same of its tpubuild base classes."""
    members = {name for statement in node.body for name, _ in _bound(statement)}
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) \
                and isinstance(inner.value, ast.Name) and inner.value.id == "self":
            members.add(inner.attr)
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if name and name not in seen:
            for parent in classes().get(name, []):
                members |= class_members(parent, seen | {node.name})
    return members


def _in_class(nodes: list[ast.ClassDef], rest: list[str]) -> bool:
    if not rest:
        return True
    for node in nodes:
        if rest[0] in class_members(node):
            inner = [n for n in node.body if isinstance(n, ast.ClassDef) and n.name == rest[0]]
            if len(rest) == 1 or not inner or _in_class(inner, rest[1:]):
                return True
    return False


def _in_module(module: Module, rest: list[str]) -> bool:
    if not rest:
        return True
    head, tail = rest[0], rest[1:]
    if head in module.submodules:
        return _in_module(code()[f"{module.name}.{head}".lstrip(".")], tail)
    if head in module.face:  # handed on from a module of the package
        return _in_module(code()[f"{module.name}.{module.face[head]}".lstrip(".")], rest)
    if head not in module.names:
        return False
    bound = module.names[head]
    if isinstance(bound, ast.ClassDef):
        return _in_class([bound], tail)
    if tail and isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name) and bound.func.id in classes():
        return _in_class(classes()[bound.func.id], tail)  # TARGET = TargetSpec(...): TARGET.defaults
    return not tail or not isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef))


def resolves(token: str) -> bool:
    """Whether `token` (`engine.loop.Engine.uptodate`, `Store.put`, `remote_url.Timeouts`)
    names something tpubuild defines: a prefix that names a module (by its dotted path below
    tpubuild or the tail of one: `remote_url` is config/remote_url.py; of several modules
    with that tail, any) and the rest inside it; else a class, or a module-level object
    made by a class, by its bare name and the rest inside that class."""
    parts = token.removeprefix("tpubuild.").split(".")
    modules = code()
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        matches = [m for name, m in modules.items() if name == prefix or name.endswith("." + prefix)]
        if any(_in_module(m, parts[cut:]) for m in matches):
            return True
    if parts[0] in classes():
        return _in_class(classes()[parts[0]], parts[1:])
    for module in modules.values():  # a module-level object by its bare name: TARGET.defaults
        if parts[0] in module.names and not isinstance(module.names[parts[0]], ast.ClassDef) \
                and _in_module(module, parts):
            return True
    return False


# First components of names that are not tpubuild's: libraries and the standard library.
EXTERNAL = {"tf", "tensorflow", "np", "numpy", "os", "sys", "keras", "jax", "jax2tf", "orbax", "asyncio",
            "stablehlo", "fsspec", "botocore", "gcsfs", "click", "doit", "ray", "yaml", "json", "pathlib",
            "typing", "importlib", "subprocess", "hashlib", "sqlite3", "flax", "tflite", "shutil",
            # OCI's vocabulary (docs/publish-to-oci.md): reverse-DNS annotation keys, an image config's rootfs
            "org", "rootfs"}


@cache
def schema_children() -> dict[str, set[str]]:
    """Each key of the recipe and workspace schemas -> the keys that may sit under it."""
    children: dict[str, set[str]] = {}

    def walk(node: object, parent: str | None) -> None:
        if isinstance(node, dict):
            for key, value in node.get("properties", {}).items():
                if parent:
                    children.setdefault(parent, set()).add(key)
                walk(value, key)
            for key, value in node.items():
                if key != "properties":
                    walk(value, parent)
        elif isinstance(node, list):
            for value in node:
                walk(value, parent)

    for name in ("recipe", "workspace"):
        schema = json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())
        for key, value in schema.get("properties", {}).items():
            children.setdefault("", set()).add(key)
            walk(value, key)
    return children


def is_field_path(token: str) -> bool:
    """`verify.rtol`, `bfloat16_optimization_options.filterlist`: keys of a recipe or of
    tpubuild.yaml, each under the one before it."""
    parts = token.split(".")
    children = schema_children()
    known = set(children) | {k for ks in children.values() for k in ks}
    return parts[0] in known and all(b in children.get(a, set()) for a, b in itertools.pairwise(parts))


def skipped(token: str) -> bool:
    """Whether a dotted name is clearly not tpubuild's code: a library's, a file name with
    a data extension, a recipe or workspace field path, a version number."""
    parts = token.split(".")
    return (parts[0] in EXTERNAL or parts[-1] in DATA_EXTENSIONS or is_field_path(token)
            or not all(p.isidentifier() for p in parts) or len(parts) < 2)


def test_every_name_of_code_the_docs_give_is_defined() -> None:
    problems = [f"{n.where()}: not defined in tpubuild" for n in all_named()
                if not is_path(n.token) and not n.token.startswith("link:") and not skipped(n.token)
                and not resolves(n.token)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("token", ["engine.loop.Engine.uptodate", "Store.put", "remote_url.Timeouts", "cli.main",
                                   "tpubuild.store.Store", "pipeline.TARGET_PACKAGES", "config.recipe.Recipe",
                                   "StageResult.summary", "TARGET.defaults", "publish.targets"])
def test_the_resolver_finds_what_exists(token: str) -> None:
    assert resolves(token)


@pytest.mark.parametrize("token", ["build._unexpected", "workers._run_stage", "Engine._push", "Store._index_faults",
                                   "remote_backends._FsspecBackend", "engine.build.up_to_date", "Store.no_such_method"])
def test_the_resolver_refuses_what_is_gone(token: str) -> None:
    assert not resolves(token)


@pytest.mark.parametrize("token,why", [
    ("engine/loop.py", None), ("tpubuild/engine/loop.py", None), ("config/", None), ("docs/ray.md", None),
    ("loop.py", None), ("out/toy/1/", None), ("engine/remote.py", "no such file or folder"),
    ("fsutil.py", "no such file"), ("tpubuild/engine/ray_executor.py", "no such file or folder"),
])
def test_paths_resolve_as_the_docs_mean_them(token: str, why: str | None) -> None:
    assert path_problem(REPO / "docs" / "architecture.md", token) == why


# --- the CLI -----------------------------------------------------------------------------

def verbs() -> dict[str, click.Command]:
    from tpubuild.cli import VERBS, cli

    ctx = click.Context(cli)
    return {verb: cli.get_command(ctx, verb) for verb in VERBS}


def spellings(command: click.Command) -> list[list[str]]:
    """Each option of a command (--help aside) as its spellings: [['-j', '--jobs'], ...]."""
    return [[*p.opts, *p.secondary_opts] for p in command.params
            if isinstance(p, click.Option) and "--help" not in p.opts]


COMMANDS = REPO / "docs" / "commands.md"


def usages(page: Path = COMMANDS) -> list[tuple[int, str, str]]:
    """(line, verb, the rest) of each `tpubuild VERB ...` span of a page; in docs/commands.md
    also each `VERB --option` span (`build --check`), whose verb the page is about."""
    from tpubuild.cli import VERBS

    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        # A table row's first cell declares verbs (`tpubuild clean ...`, `tpubuild gc ...`):
        # a word there that is no verb is a verb gone; elsewhere only known verbs count.
        first = line.split(" | ")[0] if page == COMMANDS and line.startswith("| `tpubuild ") else ""
        for span in SPAN.findall(line):
            words = span.split()
            prefixed = bool(words) and words[0] == "tpubuild"
            words = words[1:] if prefixed else words
            if not words or not (prefixed or page == COMMANDS):
                continue
            if words[0] in VERBS or f"`{span}`" in first:
                found.append((number, words[0], " ".join(words[1:])))
    return found


OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def test_docs_commands_names_every_verb_and_option_the_cli_accepts() -> None:
    from tpubuild.cli import cli

    shown: dict[str, set[str]] = {}
    for _, verb, rest in usages():
        shown.setdefault(verb, set()).update(OPTION.findall(rest))
    missing = []
    for verb, command in verbs().items():
        if verb not in shown:
            missing.append(f"docs/commands.md: no `tpubuild {verb}`")
            continue
        missing += [f"docs/commands.md: `tpubuild {verb}` without {'/'.join(names)}"
                    for names in spellings(command) if not set(names) & shown[verb]]
    text = COMMANDS.read_text()
    missing += [f"docs/commands.md: no global option {'/'.join(names)}" for names in spellings(cli)
                if not any(f"`{n}" in text for n in names)]
    assert missing == [], "\n".join(missing)


def test_the_docs_name_no_verb_or_option_the_cli_does_not_accept() -> None:
    """docs/commands.md's verbs and options, and every `tpubuild VERB --option` of the other
    pages (with a placeholder too, which test_docs_commands.py does not parse)."""
    from tpubuild.cli import cli

    commands = verbs()
    accepted_globally = {o for names in spellings(cli) for o in names} | {"--help", "-h", "--version"}
    gone = []
    for page in pages():
        where = page.relative_to(REPO)
        for line, verb, rest in usages(page):
            if verb not in commands:
                gone.append(f"{where}:{line}: `tpubuild {verb}`: no such verb")
                continue
            accepted = {o for names in spellings(commands[verb]) for o in names} | accepted_globally
            gone += [f"{where}:{line}: `{verb} {option}`: no such option"
                     for option in OPTION.findall(rest) if option not in accepted]
    assert gone == [], "\n".join(gone)


# --- docs/architecture.md against the package ----------------------------------------------

ARCHITECTURE = REPO / "docs" / "architecture.md"


def drawing() -> tuple[list[set[str]], int]:
    """The layer drawing under `### Layers`, top line first: each line's folders and files;
    and the ground floor's line (the one with `...`, which stands for the rest)."""
    block = re.search(r"### Layers\n.*?```\n(.*?)```", ARCHITECTURE.read_text(), re.DOTALL)
    assert block, "docs/architecture.md: no layer drawing (a fenced block under `### Layers`)"
    lines = block.group(1).splitlines()
    ground = next((i for i, line in enumerate(lines) if "..." in line), len(lines) - 1)
    return [set(re.findall(r"(?<![\w/.])(\w+/|\w+\.py)(?![\w/])", line)) for line in lines], ground


def place_of(module: str) -> str | None:
    """Where the drawing would show a module: its folder below tpubuild (`engine/`) or, at the
    top, its file (`pipeline.py`); None for the package itself."""
    parts = module.split(".")
    if not parts[0]:
        return None
    return f"{parts[0]}/" if len(parts) > 1 or (PACKAGE / parts[0]).is_dir() else f"{parts[0]}.py"


def tpubuild_imports(module: Module) -> list[tuple[str, int]]:
    """(imported module below tpubuild, line) of every import of a module, in functions too."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "tpubuild":  # `from tpubuild import pipeline`
                found += [(f"tpubuild.{a.name}", node.lineno) for a in node.names if a.name in code()[""].submodules]
            else:
                found.append((node.module, node.lineno))
    return [(name.removeprefix("tpubuild."), line) for name, line in found if name.startswith("tpubuild.")]


def test_the_layer_drawing_has_no_import_running_up() -> None:
    lines, ground = drawing()
    row = {place: i for i, line in enumerate(lines) for place in line}
    up = set()
    for module in code().values():
        here = place_of(module.name)
        for imported, line in tpubuild_imports(module):
            there = place_of(imported)
            if here and there and here != there and row.get(there, ground) < row.get(here, ground):
                drawn = f"puts {here} below {there}" if here in row else \
                    f"does not show {here} (the ground floor, then) but shows {there}"
                up.add(f"docs/architecture.md: the layer drawing {drawn}, which it imports "
                       f"({module.path.relative_to(REPO)}:{line})")
    assert sorted(up) == [], "\n".join(sorted(up))


def layout_rows() -> list[tuple[str, str]]:
    """(first cell, whole row) of the table under `## Layout`."""
    section = ARCHITECTURE.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [(line.split(" | ")[0], line) for line in section.splitlines() if line.startswith("| `")]


def test_the_layout_names_every_module() -> None:
    rows = layout_rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        parts = rel.split("/")
        if parts[-1] == "__init__.py" or parts[0] == "commands":
            continue  # a face hands names on; each verb is docs/commands.md's (tested above)
        if len(parts) == 1:
            if not any(f"`{rel}`" in first for first, _ in rows):
                missing.append(f"docs/architecture.md: the layout names no `{rel}`")
            continue
        # The package's row (`engine/`, `targets/<name>/`) names the file, or a stage by name.
        home = [row for first, row in rows if f"`{parts[0]}/" in first]
        name = parts[-1]
        if not home:
            missing.append(f"docs/architecture.md: the layout has no row for `{parts[0]}/`")
        elif not any(f"`{name}`" in row or f"/{name}`" in row or f"`{name[:-3]}`" in row for row in home):
            missing.append(f"docs/architecture.md: the `{parts[0]}/` row names no `{name}` (tpubuild/{rel})")
    assert missing == [], "\n".join(missing)


# --- stage chains ----------------------------------------------------------------------------

def main_stages() -> list[str]:
    """pipeline.MAIN_STAGES' names in order, read from the source."""
    for node in code()["pipeline"].tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "MAIN_STAGES" for t in targets):
                return list(ast.literal_eval(node.value))
    raise AssertionError("tpubuild/pipeline.py: no MAIN_STAGES")


CHAIN_LINK = r"(?:`\w+`(?: \(or `\w+`\))?|\(targets\))"
CHAIN = re.compile(rf"{CHAIN_LINK}(?: > {CHAIN_LINK}){{3,}}")


def test_every_stage_chain_the_docs_draw_is_the_pipelines() -> None:
    order = [*main_stages(), "publish"]
    wrong = []
    for page in pages():
        text = re.sub(r"\s+", " ", page.read_text())
        for chain in CHAIN.findall(text):
            names = re.findall(r"`(\w+)`", chain)
            if not set(names) <= set(order):
                continue  # not a chain of stages
            where = f"{page.relative_to(REPO)}: {chain}"
            if [order.index(n) for n in names] != sorted(order.index(n) for n in names):
                wrong.append(f"{where}: not in pipeline.MAIN_STAGES' order")
            # A whole chain (from the model to publish) names every stage; `source` and
            # `export` are the two ways a chain starts, either will do.
            left = set(order) - set(names) - ({"source", "export"} if {"source", "export"} & set(names) else set())
            if names[0] in ("source", "export") and names[-1] == "publish" and left:
                wrong.append(f"{where}: without {', '.join(n for n in order if n in left)}")
    assert wrong == [], "\n".join(wrong)


# --- file names in the code's own comments -------------------------------------------------

# Files of TensorFlow and other libraries that tpubuild's comments cite by bare name.
UPSTREAM_FILES = {"constants.py", "function_def_to_graph.py", "functional_saver.py", "save.py", "load.py", "lite.py",
                  "saved_model_aot_compile.py", "function_deserialization.py", "json.py", "helper.py",
                  "quantize_model.py"}
FILE_IN_TEXT = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")


def code_texts() -> list[tuple[str, int, str]]:
    """(file, line, text) of each comment and string of tpubuild's code and of pyproject.toml's
    comments."""
    import io
    import tokenize

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type in (tokenize.COMMENT, tokenize.STRING):
                found.append((rel, token.start[0], token.string))
    for number, line in enumerate((REPO / "pyproject.toml").read_text().splitlines(), 1):
        if "#" in line:
            found.append(("pyproject.toml", number, line.split("#", 1)[1]))
    return found


def test_every_file_the_code_comments_name_exists() -> None:
    files, _ = tree_names()
    top = {p.name for p in REPO.iterdir()} | {p.name for p in PACKAGE.iterdir()}
    gone = []
    for rel, line, text in code_texts():
        for name in FILE_IN_TEXT.findall(text):
            parts = name.split("/")
            if len(parts) == 1:
                ok = name in files or name in UPSTREAM_FILES
            elif parts[0] in top:
                ok = (REPO / name).exists() or (PACKAGE / name).exists()
            else:
                continue  # a path of another project (tensorflow/python/...), or of a workspace
            if not ok:
                gone.append(f"{rel}:{line}: {name}")
    assert gone == [], "\n".join(gone)


# --- bare names --------------------------------------------------------------------------------

# Names of other projects the docs give bare: TF's and orbax's options, TF Serving's flag, a package.
OTHER_NAMES = {"save_options", "keras_hub", "load_retry_interval_micros", "min_num_elements_for_weights"}
BARE = re.compile(r"([A-Za-z_]\w*)(\(.*)?")


@cache
def names_in_python() -> frozenset[str]:
    """Every name the repository's Python code defines, uses or spells in a string (tests,
    scripts and benchmarks too: the docs describe their helpers), and every schema key."""
    found: set[str] = set()
    for path in repository()[0]:
        if path.suffix != ".py" or path == Path(__file__).resolve():
            continue  # not this file either: it names what is gone
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
                found.add(node.arg)
            elif isinstance(node, ast.alias):
                found.update((node.asname or node.name).split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(re.findall(r"\w+", node.value))
    children = schema_children()
    return frozenset(found | set(children) | {k for keys in children.values() for k in keys})


def bare_name(token: str) -> str | None:
    """The name a span gives bare when it looks like tpubuild's code: a snake_case name
    (`finish_uploads`) or a call (`enforce(model)`); None for a word, a CamelCase or ALL_CAPS
    name (`PutObject`, `SQLITE_FULL`, `AWS_PROFILE`: as often another program's), a dotted
    name or a path."""
    match = BARE.fullmatch(token)
    if not match:
        return None
    name, call = match.groups()
    if name.lower() != name or ("_" not in name.strip("_") and not call):
        return None
    return name


@pytest.mark.parametrize("span,gone", [("finish_uploads", True), ("fetch_entry(key, store)", False),
                                       ("enforce(model)", False), ("no_such_helper(x)", True), ("PutObject", False),
                                       ("AWS_PROFILE", False), ("serving", False)])
def test_bare_names_are_checked_when_they_look_like_code(span: str, gone: bool) -> None:
    name = bare_name(span)
    assert (name is not None and name not in names_in_python() and name not in OTHER_NAMES) == gone


def test_every_bare_name_of_code_the_docs_give_exists() -> None:
    gone = []
    for page in pages():
        fenced = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            for span in [] if fenced else SPAN.findall(line):
                name = bare_name(span)
                if name and name not in names_in_python() and name not in OTHER_NAMES:
                    gone.append(f"{page.relative_to(REPO)}:{number}: {name}: not in the code")
    assert gone == [], "\n".join(gone)
