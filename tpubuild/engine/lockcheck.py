"""`build --check`: would building change a lock file? Answered from the lock files and the
workspace alone, at the cost of a no-op build: no stage record, no dep file, no published
version is read (CI runs it in a fresh clone, whose cache is empty), nor TensorFlow.

A build rewrites a lock file only when a key it records changed (lockfile.same_keys). So
each stage's key is computed the way the resolver computes it (engine/resolve.py
`record_for`): from the recipe's options, the stage code digests, the toolchain, the
hashes of its input files (through the stat cache), and, for an output of an earlier
stage it consumes, the output digest the lock file records for that stage, trusted the
way DVC trusts dvc.lock: when the earlier stage's key matches, building it again makes
that output. A stage that runs user code is keyed on what its code imported, which the
lock file records (`discovered`), each file compared with its content now, as the
resolver does with a dep file. A stage whose key hashes a measured output
(`key_measured`: it differs between machines) is compared by name, as same_keys does.

Where the lock file cannot say (a key that hashes an unmeasured stage's summary, a lock
file written before it recorded `discovered`), that recipe is checked the full way, from
the cache (engine/explain.py `_stale`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.engine.imports import ABSENT
from tpubuild.engine.lockfile import read_lock_keys, same_keys
from tpubuild.engine.resolve import (
    Output,
    Resolved,
    RecipeRun,
    Resolver,
    final_key,
    measured_flags,
    new_runs,
    run_inputs,
)
from tpubuild.engine.statcache import StatCache
from tpubuild.errors import StageError
from tpubuild.pipeline import ENGINE_STEPS, spec


class _FullCheck(Exception):
    """The lock file cannot answer for this recipe: check it from the cache."""


class LockCheck:
    """The state of one `build --check`: the stat cache and code digests every recipe
    shares; an Engine (the cache) only for the recipes that need one."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.stat = StatCache(Path(ws.state_dir) / "statcache.json")
        self.resolver = Resolver(ws, None, self.stat)  # keys only: it never looks in a store
        self._engine: Any = None

    @property
    def engine(self) -> Any:
        """The cache, opened when a stale stage's reasons or a full check need it."""
        if self._engine is None:
            from tpubuild.engine.build import Engine

            self._engine = Engine(self.ws)
        return self._engine

    def problem(self, run: RecipeRun) -> str | None:
        """None when building would leave the recipe's lock file as it is, else why not."""
        lock = read_lock_keys(run.recipe.lock_file)
        if lock is None:
            return "no lock file" if not run.recipe.lock_file.exists() else \
                "the lock file does not record the current build"
        try:
            return self._problem(run, lock)
        except _FullCheck:
            from tpubuild.engine.explain import _stale

            run.outputs.clear()
            return "; ".join(_stale(self.engine, run)) or None

    def _problem(self, run: RecipeRun, lock: dict[str, Any]) -> str | None:
        recorded = {s.get("stage"): s for s in lock.get("stages") or []}
        stages = []
        for planned, (key_measured, _) in zip(run.plan, measured_flags(run.plan)):
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
                return f"stage {planned.name} would run ({'; '.join(self._reasons(run, old, key, record, reasons))})"
            # Later keys hash this output as the lock file records it (trusted: the key matches).
            run.outputs[planned.name] = Output(planned.name, old.get("key"), old.get("output"), Path(), [],
                                               record={**record, **({"discovered": discovered}
                                                                    if discovered is not None else {})})
            stages.append({"stage": planned.name, "key": key, "key_measured": key_measured,
                           **({"discovered": discovered} if discovered is not None else {})})
        document = {"recipe": run.name, "recipe_digest": run.recipe.digest, "inputs": run_inputs(run),
                    "stages": stages}
        if not same_keys(lock, document):
            return "the lock file does not record the current build"
        return None

    def _key(self, run: RecipeRun, planned: Any, old: dict[str, Any], key_measured: bool):
        """(key, key record, discovered, reasons it changed) of the stage as building would
        key it now; a key_measured stage gets only its input files (the lock's `inputs`)."""
        user_code = planned.name not in ENGINE_STEPS and spec(planned.name).runs_user_code
        discovered = old.get("discovered") if user_code else None
        if user_code and not isinstance(discovered, dict):
            raise _FullCheck  # written before lock files recorded imports
        reasons = self._imports_changed(run, discovered or {})
        if key_measured:
            hashes, _ = self.resolver.file_inputs(run, planned)
            return None, {"inputs": hashes}, discovered, reasons
        if planned.summaries:  # the lock file holds outputs, not summaries
            raise _FullCheck
        pending = self.resolver.record_for(run, planned)
        key = final_key(pending.key, discovered) if user_code else pending.key
        return key, pending.record, discovered, reasons

    def _imports_changed(self, run: RecipeRun, discovered: dict[str, str]) -> list[str]:
        """What changed among the files the stage's code imported (as explain says it)."""
        changes = []
        for rel, digest in sorted(discovered.items()):
            now = self.resolver.current_hash(run, rel) or ABSENT
            if now != digest:
                changes.append(f"imported module {rel}: " + ("removed" if now == ABSENT else
                                                              f"content changed ({digest[:12]} -> {now[:12]})"))
        return changes

    def _reasons(self, run: RecipeRun, old: dict[str, Any], key: str | None, record: dict[str, Any],
                 imports: list[str]) -> list[str]:
        """Why the key changed: the difference of the key records when the cache still has
        the old one (a built workspace), else what the lock file lets us name."""
        from tpubuild.engine.explain import _reasons

        engine = self.engine
        if not imports or (old.get("key") and engine.store.get(old["key"]) is not None):
            return _reasons(engine, run, old.get("key"), Resolved(old["stage"], "pending", key, record))
        return imports

    def save(self) -> None:
        self.stat.save()


def check_lines(ws: Any, recipes: list[Any]) -> list[str]:
    """`build --check`: why building would change each stale lock file (empty: none)."""
    check = LockCheck(ws)
    stale = []
    for run in new_runs(recipes):
        problem = check.problem(run)
        if problem:
            stale.append(f"{run.recipe.rel_file}: building would change {ws.display(run.recipe.lock_file)}: {problem}")
    check.save()
    return stale
