"""`build --check`: would building change a lock file? Answered from the lock files and the
workspace, at the cost of a no-op build: no dep file is read, nor TensorFlow. Where the
cache has a record of this user's for a key the lock file records, the lock file's output
for it must be the record's (else it is stale, lock/shape.py); a fresh clone's cache
has none (CI), and then the lock file's outputs are trusted as below. A lock file no build
wrote (a key given twice, an unknown field or stage) is named with its line.

A build rewrites a lock file only when a key it records changed (lockfile.same_keys), or
when it is malformed or stale (above). So
each stage's key is computed the way the resolver computes it (engine/resolver.py
`record_for`): from the recipe's options, the stage code digests, the toolchain, the
hashes of its input files (through the stat cache), and, for an output of an earlier
stage it consumes, the output digest the lock file records for that stage, trusted the
way DVC trusts dvc.lock: when the earlier stage's key matches, building it again makes
that output. A stage that discovers inputs (user code's imports, the packages the bfloat16 stage used
to rewrite a jax2tf module) is keyed on what it found, which the lock file records
(`discovered`; nothing found is not written), each compared with what is there now, as
the resolver does with a dep file. A stage whose key hashes a measured output
(`key_measured`: it differs between machines) is compared by name, as same_keys does.

Where the lock file cannot say (a key that hashes an unmeasured stage's summary, a lock
file of another layout), that recipe is checked the full way, from the cache
(engine/explain.py `stale_line`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.digests import StatCache
from tpubuild.engine.resolver import (
    Output,
    RecipeRun,
    Resolved,
    Resolver,
    measured_flags,
    new_runs,
    run_inputs,
)
from tpubuild.errors import StageError
from tpubuild.keys import discovered_final_key
from tpubuild.lock import (
    defect,
    older_layout,
    read_lock_keys,
    same_keys,
    stale_output,
    well_formed,
)
from tpubuild.pipeline import ENGINE_STEPS, STAGE_ORDER, spec

if TYPE_CHECKING:
    from tpubuild.config.recipe import Recipe
    from tpubuild.config.workspace import Workspace
    from tpubuild.engine.loop import Engine
    from tpubuild.pipeline import PlannedStage
    from tpubuild.store import Store


class _FullCheck(Exception):
    """The lock file cannot answer for this recipe: check it from the cache."""


class LockCheck:
    """The state of one `build --check`: the stat cache and code digests every recipe
    shares; an Engine (the cache) only for the recipes that need one."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        self.stat = StatCache(Path(ws.state_dir) / "statcache.json")
        self.resolver = Resolver(ws, None, self.stat)  # keys only: it never looks in a store
        self._engine: Engine | None = None
        self._store: Store | None = None  # the cache, read for the outputs of the lock file's keys

    @property
    def engine(self) -> Engine:
        """The cache, opened when a stale stage's reasons or a full check need it."""
        if self._engine is None:
            from tpubuild.engine.loop import Engine

            self._engine = Engine(self.ws)
        return self._engine

    def line(self, run: RecipeRun) -> str | None:
        """None when building would leave the recipe's lock file as it is, else one line
        saying why not (or why it cannot be told)."""
        lock = read_lock_keys(run.recipe.lock_file)
        # A stage the recipe no longer runs is stale, not malformed: only one tpubuild does not have is.
        malformed = self._malformed(run) if lock is None or not well_formed(lock, STAGE_ORDER) else None
        problem: str | None
        if malformed is not None:
            problem = f"malformed: {malformed}"
        elif lock is None:
            problem = "no lock file" if not run.recipe.lock_file.exists() else \
                "the lock file does not record the current build"
        else:
            try:
                problem = self._problem(run, lock)
            except _FullCheck:
                from tpubuild.engine.explain import stale_line

                run.outputs.clear()
                return stale_line(self.engine, run)
        if problem is None:
            return None
        return f"{run.recipe.rel_file}: building would change {self.ws.display(run.recipe.lock_file)}: {problem}"

    def _malformed(self, run: RecipeRun) -> str | None:
        """Where the lock file is one no build wrote (lock/shape.py), or None."""
        try:
            text = run.recipe.lock_file.read_text()
        except OSError:
            return None
        return defect(text, self.ws.display(run.recipe.lock_file), STAGE_ORDER)

    def _cached_output(self, key: str | None) -> str | None:
        """The output the cache records for `key` (a record of this user's), or None: a
        fresh clone's cache has none, and then the lock file's outputs are trusted."""
        if not key:
            return None
        if self._store is None:
            from tpubuild.store import Store

            self._store = Store(self.ws.cache_dir, report=lambda message: None)  # the build says what is damaged
        entry = self._store.get(key)
        return entry.tree if entry is not None else None

    def _problem(self, run: RecipeRun, lock: dict[str, Any]) -> str | None:
        if older_layout(lock):
            return "the lock file records the published version's number (written by an older tpubuild); build to rewrite it"
        recorded = {s.get("stage"): s for s in lock.get("stages") or []}
        stages = []
        for planned, (key_measured, measured) in zip(run.plan, measured_flags(run.plan)):
            old = recorded.get(planned.name)
            if old is None:
                return f"stage {planned.name} would run (not built before (no entry in the lock file))"
            if planned.name == "publish":
                if not key_measured:  # its key hashes the published files, which only the cache has
                    raise _FullCheck
                stages.append({"stage": "publish", "key": None, "key_measured": True})
                continue
            try:
                key, record, discovered, reasons = self._key(run, planned, old, key_measured)
            except (StageError, OSError) as exc:
                message = str(exc) if isinstance(exc, StageError) else f"{exc.strerror}: {exc.filename}"
                return f"stage {planned.name} cannot run ({message})"
            if reasons or not (key_measured or key == old.get("key")):
                if not discovered and planned.name not in ENGINE_STEPS and spec(planned.name).runs_user_code:
                    # User code always imports its own script: nothing recorded is a lock
                    # file written before lock files recorded imports.
                    return (f"stage {planned.name}: the lock file does not record what its code imported "
                            "(written by an older tpubuild); build to rewrite it")
                why = self._reasons(run, lock, old, key, record, reasons)
                return f"stage {planned.name} would run ({'; '.join(why)})"
            made = None if measured else self._cached_output(key)
            if made is not None and made != old.get("output"):  # a measured output differs between machines
                return stale_output(planned.name, old.get("output"), made)
            # Later keys hash this output as the lock file records it (trusted: the key matches,
            # and the cache, when it has the key, made that output).
            run.outputs[planned.name] = Output.of(planned.name, old.get("key"), old.get("output"), Path(),
                                                  record={**record, **({"discovered": discovered}
                                                                       if discovered is not None else {})})
            stages.append({"stage": planned.name, "key": key, "key_measured": key_measured,
                           **({"discovered": discovered} if discovered is not None else {})})
        document: dict[str, Any] = {"recipe": run.name, "recipe_digest": run.recipe.digest,
                                    "inputs": run_inputs(run), "stages": stages}
        if not same_keys(lock, document):
            recorded, now = dict(lock.get("inputs") or {}), document["inputs"]
            changed = [name for name in sorted(set(recorded) | set(now)) if recorded.get(name) != now.get(name)]
            if changed:  # an input no key reads (the recipe's own text: a comment) or a new one
                verb = "added" if changed[0] not in recorded else "removed" if changed[0] not in now else "changed"
                return f"input {changed[0]} {verb}"
            return "the lock file does not record the current build"
        return None

    def _key(self, run: RecipeRun, planned: PlannedStage, old: dict[str, Any], key_measured: bool):
        """(key, key record, discovered, reasons it changed) of the stage as building would
        key it now; a key_measured stage gets only its input files (the lock's `inputs`)."""
        discovers = planned.name not in ENGINE_STEPS and spec(planned.name).discovers
        discovered = (old.get("discovered") or {}) if discovers else None
        if not isinstance(discovered, (dict, type(None))):
            raise _FullCheck  # not a layout lock_text writes
        if key_measured:
            hashes, _ = self.resolver.file_inputs(run, planned)
            record: dict[str, Any] = {"inputs": hashes}
            key = None
        else:
            if planned.summaries:  # the lock file holds outputs, not summaries
                raise _FullCheck
            pending = self.resolver.record_for(run, planned)
            if pending.record is None or pending.key is None:  # an input could not be read
                raise _FullCheck
            record = pending.record
            key = discovered_final_key(pending.key, discovered or {}) if discovers else pending.key
        reasons = self.resolver.discovered_changes(run, discovered or {}, set(record.get("inputs", {})))
        return key, record, discovered, reasons

    def _reasons(self, run: RecipeRun, lock: dict[str, Any], old: dict[str, Any], key: str | None,
                 record: dict[str, Any], imports: list[str]) -> list[str]:
        """Why the key changed: the difference of the key records when the cache still has
        the old one (a built workspace), else what the lock file lets us name."""
        from tpubuild.engine.explain import change_reasons

        if imports and not (old.get("key") and self.engine.resolver.entry(old["key"]) is not None):
            return imports
        return change_reasons(self.engine, run, lock, Resolved(old["stage"], "pending", key, record))

    def save(self) -> None:
        self.stat.save()


def check_lines(ws: Workspace, recipes: list[Recipe]) -> list[str]:
    """`build --check`: why building would change each stale lock file, or why one cannot
    be checked (empty: every one is up to date)."""
    from tpubuild.engine.explain import EMPTY_CACHE

    check = LockCheck(ws)
    lines, unknown = [], 0
    for run in new_runs(recipes):
        line = check.line(run)
        if line is None:
            continue
        if line.endswith(EMPTY_CACHE):
            unknown += 1
        else:
            lines.append(line)
    if unknown:  # said once: every other recipe in that case is in the same one
        count = f"{unknown} lock file{'s' if unknown != 1 else ''}"
        lines.append(f"cannot check {count}: {EMPTY_CACHE}; build, or restore the cache of the build that wrote "
                     + ("them" if unknown != 1 else "it"))
    check.save()
    return lines
