"""What a change between two revisions of a workspace does to each recipe (TensorFlow-free).

Each side is loaded with the normal config layer, so `extends` bases and workspace
defaults are applied before comparing: an edit to a shared base shows in every recipe
that uses it, and a comment-only edit changes no canonical form. Which stages rerun is
decided from the two pipeline plans (pipeline.plan): a stage reruns when its option
slice, the content of a file it reads, a module its user code imported (the lock
files' `import:` inputs), or an earlier stage it consumes changes. No cache is needed
for that; when HEAD is the working tree, the engine's resolver then says whether each
rerunning stage's result is already in the cache, and adds causes the plans cannot see
(tpubuild's code, toolchain, environment) from the stored record of BASE's key.
"""

from __future__ import annotations

import difflib
import fnmatch
import glob
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.engine import expand_inputs
from tpubuild.lock import read_lock
from tpubuild.pipeline import ENGINE_STEPS, TARGET_STAGES, PlannedStage, plan, spec

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

# The lock file's `artifact:` figures compared when both sides have them (a key absent
# from either side is skipped, so lock files written before a figure existed still work).
# `peak_memory_bytes`: the build's peak memory (measured), so a change that grows it shows.
ARTIFACT_KEYS = ("size_bytes", "parameters", "cost", "max_abs_error", "argmax_agreement", "warnings",
                 "peak_memory_bytes",
                 *(target for target, chain in TARGET_STAGES.items() if chain))  # each target's size and error
_MISSING = object()


@dataclass
class Side:
    """One revision of the workspace: its recipes by name and a hasher for its files."""

    label: str  # a commit, or "working tree"
    recipes: dict[str, Any]  # name -> tpubuild.config.Recipe
    ws: Workspace | None = None
    top: Path = Path(".")  # the tree's top directory (the git repository's, or its extracted copy)
    # Lock documents by lock file path, when they are not read from the tree (see sides.py).
    locks: dict[Path, dict[str, Any]] | None = None

    def lock(self, recipe: Any) -> dict[str, Any]:
        if self.locks is not None and recipe.lock_file in self.locks:
            return self.locks[recipe.lock_file]
        return read_lock(recipe.lock_file) or {}


@dataclass
class StageChange:
    stage: str
    causes: list[str]
    cached: bool | None = None  # None: not known (HEAD is not the working tree)


@dataclass
class RecipeChange:
    name: str
    status: str  # added | removed | renamed | changed | unchanged
    file: str
    old_name: str | None = None
    fields: list[tuple[str, Any, Any]] = field(default_factory=list)  # (path, old, new); _MISSING when absent
    render_diff: list[str] = field(default_factory=list)
    stages: list[StageChange] = field(default_factory=list)
    artifact: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def affected(self) -> bool:
        """Something to build: the recipe is new, or one of its stages reruns."""
        return self.status in ("added", "renamed", "changed") and bool(self.stages)

    @property
    def rebuild_from(self) -> str | None:
        return self.stages[0].stage if self.stages else None


# --- canonical forms -----------------------------------------------------------------
def flatten(value: Any, path: str = "") -> dict[str, Any]:
    """`{"a": {"b": [1]}}` -> `{"a.b[0]": 1}`: one entry per scalar (empty containers kept)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(flatten(value[k], f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{path}[{i}]"))
        return out
    return {path: value}


def field_changes(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    a, b = flatten(old), flatten(new)
    return [(p, a.get(p, _MISSING), b.get(p, _MISSING)) for p in sorted(set(a) | set(b))
            if a.get(p, _MISSING) != b.get(p, _MISSING)]


def show(value: Any) -> str:
    return "(absent)" if value is _MISSING else json.dumps(value, sort_keys=True, ensure_ascii=False)


def change_text(path: str, old: Any, new: Any) -> str:
    return f"{path}: {show(old)} -> {show(new)}"


def _without_name(canonical: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in canonical.items() if k != "name"}


def rendered(recipe: Any) -> str:
    from tpubuild.render import render

    try:
        return render(recipe.canonical, source=recipe.rel_file)
    except Exception as exc:  # a recipe render rejects: the diff shows the reason instead
        return f"# cannot render: {exc}\n"


def render_diff(old: Any | None, new: Any | None) -> list[str]:
    a = rendered(old).splitlines() if old is not None else []
    b = rendered(new).splitlines() if new is not None else []
    return list(difflib.unified_diff(a, b, "BASE", "HEAD", lineterm="", n=2))


# --- inputs --------------------------------------------------------------------------
# Whether an input's content changed comes from git (revisions.changed_paths): no file
# is hashed, and a file edited then restored is unchanged.
def touched(changed: set[str], rel: str) -> bool:
    """Whether the file or directory `rel` (workspace-relative) differs between the sides."""
    rel = rel.rstrip("/")
    if rel in ("", "."):
        return bool(changed)
    return rel in changed or any(c.startswith(rel + "/") for c in changed)


def _stage_inputs(recipe: Any, planned: PlannedStage) -> dict[str, str]:
    """Input name (as key records spell it) -> workspace-relative path."""
    if planned.name == "source":
        rel = planned.options["saved_model"]
        return {f"dir:{rel}": rel}
    return {f"file:{rel}": rel for rel in expand_inputs(Path(recipe.root), planned.files, keep_missing=True)}


def _pattern_causes(planned: PlannedStage, changed: set[str]) -> list[str]:
    """Globs a changed path may match (fnmatch's `*` also crosses `/`: never too few), so
    a file a glob matched only at one side counts even where that side has no tree."""
    return [f"input files matching {pattern}: changed" for pattern in planned.files
            if glob.has_magic(pattern) and any(fnmatch.fnmatch(c, pattern) for c in changed)]


def _input_causes(old: dict[str, str], new: dict[str, str], changed: set[str]) -> list[str]:
    causes = []
    for name in sorted(set(old) | set(new)):
        if name not in old:
            causes.append(f"input {name}: new")
        elif name not in new:
            causes.append(f"input {name}: removed")
        elif touched(changed, new[name]):
            causes.append(f"input {name}: content changed")
    return causes


def _imports(lock: dict[str, Any]) -> list[str]:
    return [name[len("import:"):] for name in lock.get("inputs", {}) if name.startswith("import:")]


def _reads(base: Side, head: Side, old: Any, new: Any) -> list[str]:
    """Every workspace path either side of the recipe reads (a superset of its stages' inputs)."""
    from tpubuild.config.workspace import recipe_inputs

    paths = [rel for _, rel in recipe_inputs(old.canonical) + recipe_inputs(new.canonical)]
    return paths + _imports(base.lock(old)) + _imports(head.lock(new))


# --- one recipe ----------------------------------------------------------------------
def stage_changes(base: Side, head: Side, old: Any, new: Any, changed: set[str]) -> list[StageChange]:
    """The stages of `new` that rerun compared with `old`, in pipeline order, with causes."""
    old_plan = {p.name: p for p in plan(old.canonical)}
    modules = sorted(set(_imports(base.lock(old))) | set(_imports(head.lock(new))))
    changes: list[StageChange] = []
    rerun: set[str] = set()
    for planned in plan(new.canonical):
        before = old_plan.get(planned.name)
        if before is None:
            causes = ["the stage did not run at BASE"]
        else:
            causes = [f"option {change_text(*c)}" for c in field_changes(before.options, planned.options)]
            inputs = _input_causes(_stage_inputs(old, before), _stage_inputs(new, planned), changed)
            causes += inputs or _pattern_causes(planned, changed)  # a glob match seen only at one side
            if planned.name not in ENGINE_STEPS and spec(planned.name).runs_user_code:
                # The export script itself is a declared input too: named once, as the input.
                named = {cause.split(":", 2)[1] for cause in inputs if cause.startswith("input file:")}
                causes += [f"imported module {m}: content changed" for m in modules
                           if touched(changed, m) and m not in named]
            if before.consumes != planned.consumes or before.summaries != planned.summaries:
                # A stage before it was added or removed: it reads another stage's output now.
                was = ", ".join(f"{r} from {s}" for r, s in sorted(before.consumes.items()))
                now = ", ".join(f"{r} from {s}" for r, s in sorted(planned.consumes.items()))
                causes.append(f"it reads {now or 'no earlier output'} (was {was or 'none'})"
                              if was != now else "it reads other earlier summaries")
            upstream = [s for s in (*planned.consumes.values(), *planned.summaries) if s in rerun]
            causes += [f"its input {s} is rebuilt" for s in dict.fromkeys(upstream)]
        if causes:
            rerun.add(planned.name)
            changes.append(StageChange(planned.name, causes))
    return changes


def artifact_deltas(base_lock: dict[str, Any], head_lock: dict[str, Any], head_recipe: Any) -> dict[str, dict]:
    """BASE's artifact figures against HEAD's, when HEAD's lock file records a build of
    HEAD's recipe (its recipe_digest is HEAD's canonical digest)."""
    if head_lock.get("recipe_digest") != head_recipe.digest:
        return {}
    old, new = base_lock.get("artifact") or {}, head_lock.get("artifact") or {}
    if not isinstance(old, dict) or not isinstance(new, dict):
        return {}
    out = {}
    for key in ARTIFACT_KEYS:
        if key not in old or key not in new:
            continue
        a, b = flatten(old[key], key), flatten(new[key], key)
        for path in sorted(set(a) & set(b)):
            entry: dict[str, Any] = {"old": a[path], "new": b[path]}
            if _number(a[path]) and _number(b[path]):
                entry["delta"] = b[path] - a[path]
                if a[path]:
                    entry["percent"] = round(100.0 * (b[path] - a[path]) / abs(a[path]), 1)
            out[path] = entry
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def compare_recipe(base: Side, head: Side, old: Any, new: Any, changed: set[str],
                   status: str = "changed") -> RecipeChange:
    change = RecipeChange(new.name, status, new.rel_file, old_name=old.name if old.name != new.name else None)
    if status == "changed" and old.canonical_json == new.canonical_json and not any(
            touched(changed, rel) for rel in _reads(base, head, old, new)):
        change.status = "unchanged"  # the fast path: nothing it reads changed
        return change
    change.fields = field_changes(old.canonical, new.canonical)
    change.render_diff = render_diff(old, new)
    change.stages = stage_changes(base, head, old, new, changed)
    change.artifact = artifact_deltas(base.lock(old), head.lock(new), new)
    if status == "changed" and not change.fields and not change.stages:
        change.status = "unchanged"
    return change


def _signature(lock: dict[str, Any]) -> tuple:
    """A lock file's stage keys without the publish step (whose key names the recipe)."""
    return tuple((s.get("stage"), s.get("key")) for s in lock.get("stages", []) if s.get("stage") != "publish")


def compare(base: Side, head: Side, changed: set[str]) -> list[RecipeChange]:
    """Every recipe of either side, in HEAD's order then BASE's removed ones."""
    removed = [n for n in base.recipes if n not in head.recipes]
    added = [n for n in head.recipes if n not in base.recipes]
    renamed: dict[str, str] = {}  # new name -> old name
    for new_name in added:
        new = head.recipes[new_name]
        for old_name in removed:
            old = base.recipes[old_name]
            if old_name in renamed.values():
                continue
            same_lock = bool(_signature(base.lock(old))) and _signature(base.lock(old)) == _signature(head.lock(new))
            if _without_name(old.canonical) == _without_name(new.canonical) or same_lock:
                renamed[new_name] = old_name
                break
    out = []
    for name, recipe in head.recipes.items():
        if name in renamed:
            out.append(compare_recipe(base, head, base.recipes[renamed[name]], recipe, changed, "renamed"))
        elif name in base.recipes:
            out.append(compare_recipe(base, head, base.recipes[name], recipe, changed))
        else:
            change = RecipeChange(name, "added", recipe.rel_file, render_diff=render_diff(None, recipe))
            change.fields = field_changes({}, recipe.canonical)
            change.stages = [StageChange(p.name, ["new recipe"]) for p in plan(recipe.canonical)]
            out.append(change)
    for name in removed:
        if name not in renamed.values():
            recipe = base.recipes[name]
            out.append(RecipeChange(name, "removed", recipe.rel_file, render_diff=render_diff(recipe, None)))
    return out


# --- the cache (HEAD = working tree) -------------------------------------------------
def add_cache_state(ws: Workspace, base: Side, changes: list[RecipeChange], head: Side) -> None:
    """For each rerunning stage of an affected recipe: is its result already in the cache
    (the resolver's status), and what the plans could not see (code, toolchain,
    environment), from the stored record of BASE's key (keys.diff_records)."""
    from tpubuild.engine import Engine, new_runs
    from tpubuild.keys import diff_records

    affected = [c for c in changes if c.affected]
    if not affected:
        return
    engine = Engine(ws)
    for change in affected:
        recipe = head.recipes[change.name]
        old = base.recipes.get(change.old_name or change.name)
        old_keys = {s["stage"]: s["key"] for s in base.lock(old).get("stages", [])} if old else {}
        states = {s.name: s for s in engine.resolver.resolve(new_runs([recipe])[0])}
        for stage in change.stages:
            state = states.get(stage.stage)
            stage.cached = state is not None and state.status == "cached"
            old_key = old_keys.get(stage.stage)
            if state is None or state.record is None or old_key is None or old_key == state.key:
                continue
            stored = engine.store.get(old_key)
            if stored is None:
                continue
            unseen = [line for line in diff_records(stored.record, state.record)
                      if line.startswith(("the stage's code", "toolchain ", "environment variable ", "schema", "scheme"))]
            stage.causes += unseen
    engine.stat.save()
