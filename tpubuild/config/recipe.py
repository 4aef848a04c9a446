"""Loading recipes: YAML with marks -> extends and defaults -> schema -> semantic checks
-> canonical form. Every problem of every file is collected and raised as one ConfigError."""

from __future__ import annotations

import copy
import fnmatch
import glob
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tpubuild.config.canonical import canonical_json, canonicalize, digest
from tpubuild.config.checks import Checker
from tpubuild.config.finding import LOCK_SUFFIX, lock_file_of, recipe_matches
from tpubuild.config.merge import ReplacedList, deep_merge
from tpubuild.config.names import (
    invalid_name_message,
    name_from_file_message,
    valid_name,
)
from tpubuild.config.paths import boundary_problem, rebase
from tpubuild.config.schema import schema_diagnostics
from tpubuild.config.workspace import (
    Workspace,
    display_path,
    find_workspace_file,
    implicit_workspace,
    load_workspace,
)
from tpubuild.config.yamlload import Marks, load_yaml, read_yaml_file
from tpubuild.errors import ConfigError, Diagnostic, Location, UsageError


@dataclass
class Recipe:
    name: str
    file: Path  # absolute
    rel_file: str  # as shown in messages: workspace-relative
    root: Path  # canonical paths are relative to this directory
    canonical: dict[str, Any] = field(repr=False)
    # The recipe file and its `extends` bases: what the canonical form was read from.
    files: list[Path] = field(default_factory=list, repr=False)
    # Where the name was written (its `name:` key), else the file: what a duplicate points at.
    name_loc: Location | None = field(default=None, repr=False)
    # Problems that do not stop a build, which validate reports (a list an extends replaced).
    warnings: list[Diagnostic] = field(default_factory=list, repr=False)
    # A value with glob characters (`deps: [models/*.py]`): its canonical form depends on
    # the files that match now, not only on the recipe's text.
    globs: bool = field(default=False, repr=False)
    # Where its versions are also published (its own `publish_to:`, else the workspace's;
    # None: out/ only), and `serving.version_labels`: neither is part of what is built.
    publish_to: str | None = field(default=None, repr=False)
    version_labels: dict[str, int] = field(default_factory=dict, repr=False)
    # How versions are pushed to an oci:// destination (`oci:`, the recipe's keys over the
    # workspace's): format, base_image, insecure. Not part of what is built either.
    oci: dict[str, Any] = field(default_factory=dict, repr=False)
    # The converter section as the recipe's layers write it (the workspace's defaults, its
    # bases and itself merged, paths root-relative), beside the canonical meaning: how
    # `tpubuild render` spells it (render.Spelling: list order, an explicit scope, an empty
    # section); and the JSON paths of its dataset paths that were written absolute.
    written_converter: dict[str, Any] = field(default_factory=dict, repr=False)
    absolute_paths: frozenset[tuple] = field(default_factory=frozenset, repr=False)

    @cached_property
    def canonical_json(self) -> str:
        return canonical_json(self.canonical)

    @cached_property
    def digest(self) -> str:
        return digest(self.canonical)

    @property
    def lock_file(self) -> Path:
        return lock_file_of(self.file)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".yaml", ".yml"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def discover(ws: Workspace) -> list[Path]:
    """Recipe files matched by the workspace globs (lock files excluded), sorted. A match
    that a symlink leads out of the workspace is an error."""
    found = set()
    escaped = []
    for index, pattern in enumerate(ws.recipe_globs):
        for match in recipe_matches(ws.root, pattern, ws.file):
            rel = os.path.relpath(match, ws.root)
            problem = boundary_problem(rel, ws.root)
            if problem:
                message = f"{pattern!r} matches {rel}, which {problem}"
                escaped.append(Diagnostic(Location(ws.display(ws.file)), f"recipes[{index}]", message))
            else:
                found.add(Path(match).resolve())
    if escaped:
        raise ConfigError(escaped)
    return sorted(found)


def unmatched_globs(ws: Workspace) -> list[str]:
    """The workspace's recipe globs that match no recipe file (worth a warning: a typo
    there makes `validate` check nothing)."""
    return [p for p in ws.recipe_globs if not recipe_matches(ws.root, p, ws.file)]


@dataclass
class BrokenRecipe:
    """A recipe file that does not load: reported, never built."""

    name: str  # its `name:` when that much is readable, else the file's stem: what targets match
    file: Path  # absolute
    rel_file: str
    diagnostics: list[Diagnostic]

    def summary(self) -> str:
        """One line: where its first problem is, what it is, and how many more there are."""
        first, more = sorted(self.diagnostics)[0], len(self.diagnostics) - 1
        what = f"{first.json_path}: {first.message}" if first.json_path else first.message
        rest = f" (+{more} more: tpubuild validate {self.rel_file})" if more else ""
        return f"{first.loc}: invalid recipe {self.name!r} skipped: {what}{rest}"


@dataclass
class Selection:
    """What targets select among the workspace's recipes (`tpubuild build TARGET...`)."""

    recipes: list[Recipe]  # asked for, valid
    broken: list[BrokenRecipe]  # asked for, not loadable
    others: list[BrokenRecipe]  # not asked for, not loadable: worth a warning, never fatal


def load_all(ws: Workspace, deep: bool = False) -> tuple[list[Recipe], list[BrokenRecipe]]:
    """(the recipes that load, the files that do not), in file order. Of two recipes with
    one name, the second is broken (pointing at its `name:` line). `deep`: also the checks
    that read the model's files (config.model_checks), as `validate` does."""
    recipes: list[Recipe] = []
    broken: list[BrokenRecipe] = []
    by_name: dict[str, Recipe] = {}
    for path in discover(ws):
        try:
            recipe = _load(path, ws, deep)
        except ConfigError as exc:
            broken.append(BrokenRecipe(_readable_name(path, ws), path, display_path(path, ws.root), exc.diagnostics))
            continue
        other = by_name.get(recipe.name)
        if other is not None:
            message = f"recipe name {recipe.name!r} is also used by {other.rel_file}"
            where = recipe.name_loc or Location(recipe.rel_file)
            broken.append(BrokenRecipe(recipe.name, recipe.file, recipe.rel_file, [Diagnostic(where, "name", message)]))
            continue
        by_name[recipe.name] = recipe
        recipes.append(recipe)
    return recipes, broken


def _readable_name(path: Path, ws: Workspace) -> str:
    """A broken recipe's name as far as it can be read: a target naming it must find it."""
    try:
        data, _ = read_yaml_file(path, display_path(path, ws.root))
    except ConfigError:
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else _stem(path)


def load_recipes(ws: Workspace, targets: list[str] | tuple[str, ...] | None = None) -> list[Recipe]:
    """All recipes of the workspace (or those matching `targets`: names or globs). Any
    recipe that does not load is an error, asked for or not (what `diff` compares)."""
    recipes, broken = load_all(ws)
    if broken:
        raise ConfigError([d for b in broken for d in b.diagnostics])
    if not targets:
        return recipes
    return select(recipes, targets)


def load_selection(ws: Workspace, targets: list[str] | tuple[str, ...] | None, cwd: Path | None = None,
                   deep: bool = False) -> Selection:
    """The recipes `targets` ask for (names, globs or recipe files; none: all), split into
    valid and broken; the broken ones not asked for are set apart, so one bad recipe does
    not stop the work on another (like make, which reads only what a target needs)."""
    recipes, broken = load_all(ws, deep)
    if not targets:
        return Selection(recipes, broken, [])
    wanted = {id(r) for r in select([*recipes, *broken], targets, ws, cwd)}
    return Selection([r for r in recipes if id(r) in wanted], [b for b in broken if id(b) in wanted],
                     [b for b in broken if id(b) not in wanted])


def select(recipes: list, targets: list[str] | tuple[str, ...], ws: Workspace | None = None,
           cwd: Path | None = None) -> list:
    """Recipes named by `targets`, in workspace order: names or shell globs of names, or
    recipe files (a path relative to `cwd`, or absolute; globs too), like make's targets."""
    wanted: set[int] = set()
    names = [r.name for r in recipes]
    for target in targets:
        if ws is not None and is_path_target(target, names):
            files = _target_files(target, ws, cwd or Path.cwd())
            matched_ids = {id(r) for r in recipes if r.file in files}
            if not matched_ids:
                raise UsageError(_not_a_recipe_message(target, files, ws, names))
            wanted.update(matched_ids)
            continue
        matched = set(fnmatch.filter(names, target))
        if not matched:
            import difflib

            close = difflib.get_close_matches(target, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (recipes: {', '.join(names) or 'none'})"
            outside = _outside_globs(target, ws) if ws is not None else None
            raise UsageError(f"no recipe matches {target!r}{outside or hint}")
        wanted.update(id(r) for r in recipes if r.name in matched)
    return [r for r in recipes if id(r) in wanted]


def _outside_globs(target: str, ws: Workspace) -> str | None:
    """When a YAML file named like `target` sits where no `recipes:` glob looks (e.g.
    recipes/vision/toy2.yaml beside the glob recipes/*.yaml): which file, which globs, and
    a glob that would match it."""
    from tpubuild.config.finding import yaml_files_named

    skip = tuple(p for p in (ws.output_dir, ws.cache_dir, ws.state_dir) if p is not None)
    found = [f for f in yaml_files_named(ws.root, target, skip) if f.resolve() != ws.file]
    if not found:
        return None
    rel = display_path(found[0], ws.root)
    globs = ", ".join(repr(g) for g in ws.recipe_globs)
    globs = f"glob {globs} of {display_path(ws.file, ws.root)} does" if len(ws.recipe_globs) == 1 else \
        f"globs {globs} of {display_path(ws.file, ws.root)} do"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    suggestion = f"{Path(rel).parent.as_posix()}/*{Path(rel).suffix}" if "/" in rel else f"*{Path(rel).suffix}"
    return (f": {rel}{more} is not a recipe of this workspace: the recipes {globs} not match it "
            f"(add {suggestion!r} to `recipes:` to build it)")


def is_path_target(target: str, names: list[str]) -> bool:
    """A target with a slash is a file; so is `x.yaml` when no recipe is named that (a
    name may hold dots)."""
    if "/" in target or os.sep in target:
        return True
    return target.endswith((".yaml", ".yml")) and not fnmatch.filter(names, target)


def _target_files(target: str, ws: Workspace, cwd: Path) -> set[Path]:
    """The files a path target names, resolved (so symlinks and `..` compare equal)."""
    pattern = os.path.join(cwd, target)
    try:
        if glob.has_magic(target):
            return {Path(m).resolve() for m in glob.glob(pattern, recursive=True) if os.path.isfile(m)}
        return {Path(pattern).resolve()}
    except ValueError:  # a null byte: names no file
        return set()


def _not_a_recipe_message(target: str, files: set[Path], ws: Workspace, names: list[str]) -> str:
    missing = _missing_reason(target, files)
    if missing:
        return f"no recipe matches {target!r}: {missing} (recipes: {', '.join(names) or 'none'})"
    if any(str(f).endswith(LOCK_SUFFIX) for f in files):
        return f"{target!r} is a lock file, not a recipe (its recipe is {target[: -len(LOCK_SUFFIX)]}.yaml)"
    return (f"{target!r} is not a recipe of the workspace {ws.root} "
            f"(its recipes: {', '.join(ws.recipe_globs)} in {display_path(ws.file, ws.root)})")


def _missing_reason(target: str, files: set[Path]) -> str | None:
    """Why a path target names no file (the OS's words), else None."""
    if not files:
        return "no such file"
    for path in files:
        try:
            os.stat(path)
            return None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
    return reason


def load_recipe_file(path: Path, workspace: Workspace | None = None) -> Recipe:
    """One recipe file; outside any workspace its own directory acts as the root."""
    path = Path(path).resolve()
    if workspace is None:
        ws_file = find_workspace_file(path.parent)
        workspace = load_workspace(override=ws_file) if ws_file else implicit_workspace(path.parent)
    return _load(path, workspace)


def load_converter_options_file(path: Path, saved_model: Path, workspace: Workspace | None = None) -> Recipe:
    """A YAML file holding a bare `converter:` section (ConverterOptions-like), for a
    SavedModel given on the command line (`tpubuild convert --options-file`)."""
    path = Path(path).resolve()
    ws = workspace or implicit_workspace(Path(os.path.commonpath([path.parent, Path(saved_model).resolve()])))
    display = display_path(path, ws.root)
    data, marks = read_yaml_file(path, display)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Diagnostic(marks.value(()), "", "an options file must be a mapping")])
    if set(data) != {"converter"}:
        # Accept the section's fields at the top level too: that is what ConverterOptions holds.
        wrapped_marks = Marks()
        wrapped_marks.update(marks, ("converter",))
        wrapped_marks.values[()] = marks.value(())
        data, marks = {"converter": data}, wrapped_marks
    saved_model_rel = Path(os.path.relpath(Path(saved_model).resolve(), ws.root)).as_posix()
    data = {"name": _stem(path), "model": {"saved_model": saved_model_rel}, **data}
    marks.values.setdefault(("model",), marks.value(()))
    return _finish(data, marks, path, display, ws)


def converter_options_root(saved_model: Path) -> Path:
    """The workspace root of options given for `saved_model` without a workspace: this
    directory, or the directory holding both it and the model."""
    return Path(os.path.commonpath([Path.cwd().resolve(), Path(saved_model).resolve()]))


def load_converter_options(converter: dict[str, Any], saved_model: Path, origin: str, name: str,
                           workspace: Workspace | None = None) -> Recipe:
    """A `converter:` section read from elsewhere (a converter text proto, config/../
    converter_text.py) for a SavedModel given on the command line; problems name `origin`."""
    saved_model = Path(saved_model).resolve()
    ws = workspace or implicit_workspace(converter_options_root(saved_model))
    saved_model_rel = Path(os.path.relpath(saved_model, ws.root)).as_posix()
    data = {"name": name, "model": {"saved_model": saved_model_rel}, "converter": converter}
    marks = Marks()
    marks.values[()] = Location(origin)
    return _finish(data, marks, ws.root / origin, origin, ws)


def load_recipe_text(text: str, path: Path, ws: Workspace) -> Recipe:
    """The recipe `text` as it will load once written at `path` (absolute) in `ws`, its
    SavedModel allowed not to exist yet (`model.saved_model` is not checked: the caller
    checks that it is inside the workspace): what `tpubuild import` checks before it writes
    a file."""
    return _load(Path(path), ws, text=text)


def recipe_names(ws: Workspace) -> list[tuple[str, Path]]:
    """(name, file) of every recipe file of the workspace, loadable or not (a broken one's
    name as far as it can be read, as targets match it)."""
    return [(_readable_name(path, ws), path) for path in discover(ws)]


def _load(path: Path, ws: Workspace, deep: bool = False, text: str | None = None) -> Recipe:
    display = display_path(path, ws.root)
    read: list[Path] = []
    replaced: list[ReplacedList] = []
    data, marks = _read_layered(path, ws, display, chain=(), read=read, replaced=replaced, text=text)
    if ws.defaults:  # deep_merge copies: the workspace's defaults stay untouched
        data, marks = deep_merge(ws.defaults, ws.defaults_marks, data, marks, replaced)
    recipe = _finish(data, marks, path, display, ws, deep, model_pending=text is not None)
    recipe.files = read
    recipe.warnings = [r.warning() for r in replaced]
    return recipe


def _read_layered(path: Path, ws: Workspace, display: str, chain: tuple[Path, ...],
                  read: list[Path] | None = None, replaced: list[ReplacedList] | None = None,
                  text: str | None = None) -> tuple[dict, Marks]:
    """The recipe at `path` (or `text`, to be written there) with its `extends` chain
    applied, paths rebased to the root; every file read is appended to `read`, every list
    that lost fields to `replaced`."""
    if read is not None:
        read.append(path)
    data, marks = read_yaml_file(path, display) if text is None else load_yaml(text, display)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Diagnostic(marks.value(()), "", "a recipe must be a mapping of keys to values")])
    rebase(data, path.parent, ws.root, marks.written)
    base_ref = data.get("extends")
    if not isinstance(base_ref, str):
        return data, marks  # absent, or a wrong type the schema reports
    where = marks.value(("extends",))
    written = marks.written.get(("extends",), base_ref)
    problem = boundary_problem(base_ref, ws.root)
    if problem:
        raise ConfigError([Diagnostic(where, "extends", f"{written!r} {problem}")])
    base_path = (ws.root / base_ref).resolve()
    if base_path in chain or base_path == path:
        cycle = " -> ".join(display_path(p, ws.root) for p in (*chain, path, base_path))
        raise ConfigError([Diagnostic(where, "extends", f"extends cycle: {cycle}")])
    try:
        is_file = base_path.is_file()
    except OSError as exc:  # e.g. File name too long
        raise ConfigError([Diagnostic(where, "extends", f"{written!r} cannot be used: {exc.strerror}")]) from None
    if not is_file:
        raise ConfigError([Diagnostic(where, "extends", f"{written!r} does not exist")])
    base, base_marks = _read_layered(base_path, ws, display_path(base_path, ws.root), chain + (path,), read, replaced)
    base.pop("extends", None)
    base.pop("name", None)  # a name belongs to the recipe that states it, not to its children
    base_marks.drop(("name",))
    merged, merged_marks = deep_merge(base, base_marks, data, marks, replaced)
    merged_marks.values[()] = marks.value(())
    return merged, merged_marks


def _name_problems(data: dict, marks: Marks, path: Path, display: str, reported: bool) -> list[Diagnostic]:
    """A name from the file name is checked like an explicit one; an explicit one is
    checked again because the schema's regex (Python's re.search) accepts a final newline."""
    if "name" not in data:
        stem = _stem(path)
        return [] if valid_name(stem) else [Diagnostic(Location(display), "name", name_from_file_message(stem))]
    name = data["name"]
    if reported or not isinstance(name, str) or valid_name(name):
        return []
    return [Diagnostic(marks.value(("name",)), "name", invalid_name_message(name))]


def _finish(data: dict, marks: Marks, path: Path, display: str, ws: Workspace, deep: bool = False,
            model_pending: bool = False) -> Recipe:
    problems = schema_diagnostics("recipe", data, marks)
    problems += Checker(data, marks, ws.root).run()
    if model_pending:
        problems = [d for d in problems if d.json_path != "model.saved_model"]
    if deep and not problems:  # on a recipe whose shape is right: the model's files are read
        from tpubuild.config.model_checks import model_problems

        problems += model_problems(data, marks, ws.root)
    problems += _name_problems(data, marks, path, display, reported=any(d.json_path == "name" for d in problems))
    if problems:
        raise ConfigError(one_line_per_list(problems))
    data.pop("extends", None)
    data.pop("$schema", None)
    # Where the versions go and how a server labels them: nothing a stage reads, so not
    # in the canonical form (a new destination rebuilds nothing).
    own_destination = "publish_to" in data
    publish_to = data.pop("publish_to") if own_destination else getattr(ws, "publish_to", None)
    oci = {**(getattr(ws, "oci", None) or {}), **(data.pop("oci", None) or {})}  # the recipe's keys win
    labels = dict((data.pop("serving", None) or {}).get("version_labels") or {})
    name = data.get("name") or _stem(path)
    name_loc = marks.key(("name",)) if "name" in data else Location(display)
    if isinstance(publish_to, str) and publish_to.startswith("oci://"):
        from tpubuild.config.remote_url import oci_recipe_problem

        problem = oci_recipe_problem(publish_to, name)
        if problem:
            where = marks.value(("publish_to",)) if own_destination else name_loc
            raise ConfigError([Diagnostic(where, "publish_to" if own_destination else "name", problem)])
    written = copy.deepcopy(data.get("converter", {}))
    absolute = frozenset(p for p, value in marks.written.items()
                         if p[:1] == ("converter",) and os.path.isabs(os.path.expanduser(value)))
    return Recipe(name, path, display, ws.root, canonicalize(data, name, ws.root), name_loc=name_loc,
                  globs=_has_glob(data), publish_to=publish_to, version_labels=labels, oci=oci,
                  written_converter=written, absolute_paths=absolute)


# More problems than this among the elements of one list are one line and a count.
MAX_ELEMENT_LINES = 3
_ELEMENT = re.compile(r"(.*)\[(\d+)\]")


def one_line_per_list(problems: list[Diagnostic]) -> list[Diagnostic]:
    """`problems` with those of the elements of one list (`...allowed_batch_sizes[7]`), when
    there are more than MAX_ELEMENT_LINES, said once: the first element's, and how many more
    (100,000 bad sizes are one line, not 100,000)."""
    lists: dict[tuple[str, str], list[tuple[int, Diagnostic]]] = {}
    out = []
    for problem in problems:
        element = _ELEMENT.fullmatch(problem.json_path)
        if element:
            lists.setdefault((problem.loc.path, element.group(1)), []).append((int(element.group(2)), problem))
        else:
            out.append(problem)
    for (_, name), elements in lists.items():
        if len(elements) <= MAX_ELEMENT_LINES:
            out += [problem for _, problem in elements]
            continue
        elements.sort(key=lambda element: element[0])
        first, last = elements[0][1], elements[-1][0]
        more = f"and {len(elements) - 1} more problems in its elements, up to {name}[{last}]"
        out.append(Diagnostic(first.loc, first.json_path, f"{first.message} ({more})"))
    return out


def _has_glob(value: Any) -> bool:
    """Whether any string in the recipe is a glob pattern (conservatively: any string)."""
    if isinstance(value, str):
        return glob.has_magic(value)
    if isinstance(value, dict):
        return any(_has_glob(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_glob(v) for v in value)
    return False
