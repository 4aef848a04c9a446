"""What a build would do, without doing it (TensorFlow-free): `build --dry-run`,
`build --check`, `explain`. All of them read stage state through the resolver.

The resolver looks a stage up only when every output it reads is known. A stage that
reads the output of a stage that would run is decided by the build once that stage has
run: its key hashes that output, so an unchanged output leaves it cached (early cutoff;
a comment edit of an export script reruns the export, and nothing after it, because the
SavedModel it writes is byte-identical). `explain` predicts that decision: it takes the
key the waiting stage would have if the stages it waits for wrote what the last build
(the lock file) recorded, and looks it up. Found, the stage is "cached if <those stages'>
output is unchanged"; not found, it would run whatever they write, and explain says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from tpubuild.engine.lockdoc import lock_problem
from tpubuild.engine.loop import Engine
from tpubuild.engine.resolver import RecipeRun, Resolved, new_runs
from tpubuild.errors import StageError
from tpubuild.keys import diff_records
from tpubuild.lock import read_lock
from tpubuild.pipeline import ENGINE_STEPS, PlannedStage, spec

if TYPE_CHECKING:
    from tpubuild.config.recipe import Recipe
    from tpubuild.config.workspace import Workspace

__all__ = ["DRY_RUN_ORDER", "STATE_WORDS", "Resolved", "change_reasons", "explain_lines", "resolve", "stage_words",
           "stale_line", "state_word"]

# The words for a stage's state, the same in `explain`, `build --dry-run` and `build --check`
# (`build` itself says built/cached/failed/skipped of what it did): cached, would run (with
# its reasons), or cannot run (an input is missing; the reason says which).
STATE_WORDS = {"cached": "cached", "pending": "would run", "failed": "cannot run"}
# A stage waiting for one that would run (_predict_waiting): cached if what it waits for
# writes the same output again, or skipped after a stage that cannot run.
CACHED_IF_UNCHANGED = "cached if unchanged"
SKIPPED = "skipped"
DRY_RUN_ORDER = ("would run", CACHED_IF_UNCHANGED, "cached", SKIPPED, "cannot run")  # the dry-run summary's order

EMPTY_CACHE = "nothing has been built on this machine yet (the cache is empty)"


class _LastBuild:
    """The build a recipe's lock file records: each stage's key, the inputs, the toolchain."""

    def __init__(self, lock: dict[str, Any]):
        self.keys = {s.get("stage"): s.get("key") for s in lock.get("stages") or [] if isinstance(s, dict)}
        self.inputs = dict(lock.get("inputs") or {})
        self.toolchain = dict(lock.get("toolchain") or {})


def resolve(ws: Workspace, recipe: Recipe, engine: Engine | None = None, run: RecipeRun | None = None) -> list[Resolved]:
    """Each stage's state, with the reasons of every stage that would run, and for each
    stage waiting for one that would run, what the build will decide once it has run."""
    engine = engine or Engine(ws)
    run = run or new_runs([recipe])[0]
    states = engine.resolver.resolve(run)
    last = _LastBuild(read_lock(recipe.lock_file) or {})
    for state in states:
        if state.status == "pending" and state.record is not None:
            state.reasons, state.unknown = _reasons(engine, run, last, state)
    _predict_waiting(engine, run, states, last)
    return states


def _reasons(engine: Engine, run: RecipeRun, last: _LastBuild, state: Resolved) -> tuple[list[str], bool]:
    """Why a stage whose inputs are all known would run, against the lock file's record of
    it, each cause once; and True when that record is not in the cache, so that whether
    the key changed cannot be told (unless the lock file's own inputs show it)."""
    last_key = last.keys.get(state.name)
    if last_key is None:
        return ["not built before (no entry in the lock file)"], False
    if last_key == state.key:
        return [EMPTY_CACHE if engine.store.is_empty() else
                "the same key as the last build, whose output is no longer (intact) in the cache"], True
    old = engine.resolver.entry(last_key)
    if old is None:
        return _without_record(engine, last, state, last_key)
    # A stage that runs user code is stored under a key that also hashes what that code
    # imported (engine/resolver.py): the declared part is compared as a record, the rest here.
    declared = {k: v for k, v in old.record.items() if k != "discovered"}
    changes = diff_records(declared, state.record or {})
    named = set((state.record or {}).get("inputs", {})) | set(declared.get("inputs", {}))
    changes += engine.resolver.discovered_changes(run, old.record.get("discovered", {}), named)
    if not changes:
        return ["the same inputs as the last build, whose output is no longer (intact) in the cache"], True
    return list(dict.fromkeys(changes)), False


def _without_record(engine: Engine, last: _LastBuild, state: Resolved, last_key: str) -> tuple[list[str], bool]:
    """The lock file names a record this cache does not hold (a fresh clone, a gc): only the
    lock file's own input hashes and toolchain can show a change; otherwise say so."""
    record = state.record or {}
    shared = {name: digest for name, digest in record.get("inputs", {}).items() if name in last.inputs}
    then: dict[str, Any] = {"inputs": {name: last.inputs[name] for name in shared}}
    now: dict[str, Any] = {"inputs": shared}
    if record.get("toolchain"):  # the engine's own steps hash no toolchain
        then["toolchain"], now["toolchain"] = last.toolchain, record["toolchain"]
    changes = diff_records(then, now)
    where = EMPTY_CACHE if engine.store.is_empty() else (
        f"the lock file's record of it (key {last_key[:12]}) is not in the cache (built elsewhere, or removed by gc)")
    return [*changes, where], not changes


def _predict_waiting(engine: Engine, run: RecipeRun, states: list[Resolved], last: _LastBuild) -> None:
    """For each stage waiting for a stage that would run: cached if the stages it waits
    for reproduce the output the last build recorded, else why it would run anyway;
    skipped when a stage before it cannot run."""
    planned = {p.name: p for p in run.plan}
    assumed = RecipeRun(run.recipe, run.plan, outputs=dict(run.outputs))
    unchanged: dict[str, tuple[str, ...]] = {}  # stage -> the rerun stages whose unchanged outputs it assumes
    stopped: dict[str, str] = {}  # stage -> the stage that cannot run before it
    for state in states:
        stage = planned[state.name]
        reads = list(dict.fromkeys([*stage.consumes.values(), *stage.summaries]))
        if state.status == "cached":
            continue
        if state.status == "failed":
            stopped[state.name] = state.name
            continue
        if all(name in run.outputs for name in reads):  # decided from known inputs: it would run
            _assume_last_output(engine, assumed, stage, last, unchanged, (state.name,))
            continue
        stop = next((stopped[name] for name in reads if name in stopped), None)
        if stop is not None:
            state.stopped_by, state.reasons = stop, [f"stage {stop} cannot run"]
            stopped[state.name] = stop
            continue
        if not all(name in assumed.outputs for name in reads):
            continue  # nothing known of what an earlier stage will write: the resolver's reason stands
        waits_for = {name for read in reads for name in unchanged.get(read, ())}
        ordered = tuple(p.name for p in run.plan if p.name in waits_for)
        verdict = _decide_assuming(engine, assumed, stage, last)
        if verdict is None:
            continue
        if verdict is True:
            state.cached_if_unchanged, state.reasons = ordered, []
            unchanged[state.name] = ordered
            continue
        state.reasons = verdict  # its own inputs or options changed too
        _assume_last_output(engine, assumed, stage, last, unchanged, (state.name,))


def _decide_assuming(engine: Engine, assumed: RecipeRun, stage: PlannedStage,
                     last: _LastBuild) -> Literal[True] | list[str] | None:
    """Whether `stage` is cached given the assumed earlier outputs (True, and its output
    joins them), else why it would run (or None when that cannot be told)."""
    resolver = engine.resolver
    try:
        if stage.name == "publish":
            holding = resolver.published(assumed)[2]
            return True if holding is not None and holding.intact else [resolver.why_publish(assumed)]
        pending = resolver.record_for(assumed, stage)
        entry = resolver.lookup(assumed, stage, pending)
    except (StageError, OSError):
        return None
    if entry is not None:
        assumed.outputs[stage.name] = resolver.output_of(stage, entry, engine.store.trees / entry.tree)
        return True
    state = Resolved(stage.name, "pending", pending.key, pending.record)
    return _reasons(engine, assumed, last, state)[0]


def _assume_last_output(engine: Engine, assumed: RecipeRun, stage: PlannedStage, last: _LastBuild,
                        unchanged: dict[str, tuple[str, ...]], names: tuple[str, ...]) -> None:
    """A stage that would run: later stages are predicted as if it wrote again what the
    last build recorded (its record in the lock file, when the cache still holds it)."""
    key = last.keys.get(stage.name)
    old = engine.resolver.entry(key) if key and stage.name != "publish" else None
    if old is not None:
        assumed.outputs[stage.name] = engine.resolver.output_of(stage, old, engine.store.trees / old.tree)
        unchanged[stage.name] = names


def change_reasons(engine: Engine, run: RecipeRun, lock: dict[str, Any], state: Resolved) -> list[str]:
    """Why a stage whose key differs from the one its lock file records would run (build
    --check answers from lock files): the records' difference when the cache holds the old
    one, else what the lock file's inputs, toolchain and recipe digest show."""
    last = _LastBuild(lock)
    reasons, _ = _reasons(engine, run, last, state)
    known = [r for r in reasons if not r.endswith(EMPTY_CACHE) and not r.startswith("the lock file's record of it")
             and not r.startswith("the same ")]
    if not known and lock.get("recipe_digest") != run.recipe.digest:
        known.append("the recipe changed")
    return known or ["its key changed (the stage's code, options or an earlier stage's output)"]


def stale_line(engine: Engine, run: RecipeRun) -> str | None:
    """One line on the recipe's lock file, or None when building would not change it."""
    recipe = run.recipe
    lock = engine.ws.display(recipe.lock_file)
    states = resolve(engine.ws, recipe, engine, run)
    first = next((s for s in states if s.status != "cached"), None)
    if first is None:
        problem = lock_problem(engine, run, states)
        return f"{recipe.rel_file}: building would change {lock}: {problem}" if problem else None
    why = "; ".join(first.reasons)
    if first.unknown:
        if why.endswith(EMPTY_CACHE):
            return f"{recipe.rel_file}: cannot check {lock}: {EMPTY_CACHE}"
        return f"{recipe.rel_file}: cannot check {lock}: stage {first.name}: {why}"
    return f"{recipe.rel_file}: building would change {lock}: stage {first.name} {STATE_WORDS[first.status]} ({why})"


def state_word(stage: Resolved) -> str:
    """The stage's state in one word, as the dry-run summary counts it."""
    if stage.status == "pending" and stage.stopped_by:
        return SKIPPED
    if stage.status == "pending" and stage.cached_if_unchanged:
        return CACHED_IF_UNCHANGED
    return STATE_WORDS[stage.status]


def stage_words(stage: Resolved) -> str:
    """What a build will do with the stage, as `explain` and `build --dry-run` say it."""
    waits = stage.cached_if_unchanged
    if state_word(stage) != CACHED_IF_UNCHANGED:
        return state_word(stage)
    if len(waits) == 1:
        return f"cached if {waits[0]}'s output is unchanged"
    return f"cached if the outputs of {', '.join(waits[:-1])} and {waits[-1]} are unchanged"


def _shown_key(stage: Resolved) -> str:
    """The key a build will use: not the declared key of a stage that discovers inputs (user
    code's imports), whose final key also hashes them (known once it has run)."""
    if not stage.key or (stage.status != "cached" and stage.name not in ENGINE_STEPS
                         and spec(stage.name).discovers):
        return ""
    return f" (key {stage.key[:16]})"


def explain_lines(ws: Workspace, recipe: Recipe) -> list[str]:
    """`tpubuild explain`: one line per stage, then one indented line per reason."""
    lines = [f"{recipe.rel_file}: recipe {recipe.name}"]
    engine = Engine(ws)
    states = resolve(ws, recipe, engine)
    engine.stat.save()
    for stage in states:
        lines.append(f"  {stage.name}: {stage_words(stage)}{_shown_key(stage)}")
        lines.extend(f"    - {reason}" for reason in stage.reasons)
    return lines
