"""`build --check`: would building change a lock file? Answered from the lock files and the
workspace alone, at the cost of a no-op build: no stage record, no dep file, no published
version is read (CI runs it in a fresh clone, whose cache is empty), nor TensorFlow.

A build rewrites a lock file only when a key it records changed (lockfile.same_keys). So
each stage's key is computed the way the resolver computes it (engine/resolve.py
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

import os
from pathlib import Path
from typing import Any

from tpubuild.engine.lockfile import read_lock_keys, same_keys
from tpubuild.engine.records import discovered_final_key
from tpubuild.engine.resolve import (
    Output,
    Resolved,
    RecipeRun,
    Resolver,
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

    def line(self, run: RecipeRun) -> str | None:
        """None when building would leave the recipe's lock file as it is, else one line
        saying why not (or why it cannot be told)."""
        lock = read_lock_keys(run.recipe.lock_file)
        if lock is None:
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
                if not discovered and planned.name not in ENGINE_STEPS and spec(planned.name).runs_user_code:
                    # User code always imports its own script: nothing recorded is a lock
                    # file written before lock files recorded imports.
                    return (f"stage {planned.name}: the lock file does not record what its code imported "
                            "(written by an older tpubuild); build to rewrite it")
                why = self._reasons(run, lock, old, key, record, reasons)
                return f"stage {planned.name} would run ({'; '.join(why)})"
            # Later keys hash this output as the lock file records it (trusted: the key matches).
            run.outputs[planned.name] = Output(planned.name, old.get("key"), old.get("output"), Path(), [],
                                               record={**record, **({"discovered": discovered}
                                                                    if discovered is not None else {})})
            stages.append({"stage": planned.name, "key": key, "key_measured": key_measured,
                           **({"discovered": discovered} if discovered is not None else {})})
        document = {"recipe": run.name, "recipe_digest": run.recipe.digest, "inputs": run_inputs(run),
                    "stages": stages}
        if not same_keys(lock, document):
            recorded, now = dict(lock.get("inputs") or {}), document["inputs"]
            changed = [name for name in sorted(set(recorded) | set(now)) if recorded.get(name) != now.get(name)]
            if changed:  # an input no key reads (the recipe's own text: a comment) or a new one
                verb = "added" if changed[0] not in recorded else "removed" if changed[0] not in now else "changed"
                return f"input {changed[0]} {verb}"
            return "the lock file does not record the current build"
        return None

    def _key(self, run: RecipeRun, planned: Any, old: dict[str, Any], key_measured: bool):
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
            record = pending.record
            key = discovered_final_key(pending.key, discovered) if discovers else pending.key
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


def check_lines(ws: Any, recipes: list[Any]) -> list[str]:
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


def quick_check(start: Path, override: Path | None) -> int | None:
    """The number of lock files, when every recipe of the workspace is proven up to date
    without loading a recipe or computing a key; None sends `--check` down its full path.

    A lock file's keys were computed from its recipe's files, the workspace file,
    tpubuild's code (schemas included), the toolchain and the key variables, and from the
    inputs its stages read (the lock file's `inputs`) and what they discovered. When all
    of these hash as the lock file records them (`planning` covers the first three), every
    key would come out the same, so building would not change the lock file: the way the
    no-op memo (engine/noop.py) proves a no-op from stats, proved here from content, which
    a fresh clone has. Recipes that name files by glob record no `planning` (a new match
    changes their meaning): any such recipe, or any difference, and the full path decides,
    naming the stage and the cause."""
    import yaml

    from tpubuild.config.finding import WORKSPACE_FILE, discover_files, extends_chain, find_workspace_file, lock_file_of
    from tpubuild.config.workspace import DEFAULT_RECIPE_GLOBS, STATE_DIR
    from tpubuild.engine.keys import toolchain
    from tpubuild.engine.resolve import planning_digest

    if override is not None:
        ws_file = override / WORKSPACE_FILE if override.is_dir() else override
    else:
        ws_file = find_workspace_file(start)
    if ws_file is None or not ws_file.is_file():
        return None
    root = ws_file.parent.resolve()
    try:  # only where the recipes are: a workspace file that hashes as the lock files record was valid
        data = yaml.load(ws_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    globs = (data or {}).get("recipes", list(DEFAULT_RECIPE_GLOBS)) if isinstance(data, dict) or data is None else None
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        return None
    files = discover_files(root, globs)
    if not files:
        return None
    stat = StatCache(root / STATE_DIR / "statcache.json")
    names: set[str] = set()
    for recipe_file in files:
        lock = read_lock_keys(lock_file_of(recipe_file))
        if lock is None or lock.get("recipe") in names or \
                lock.get("planning") != planning_digest(ws_file, stat, extends_chain(recipe_file), root):
            return None
        names.add(lock.get("recipe"))
        if dict(lock.get("toolchain") or {}) != toolchain():
            return None
        inputs = lock.get("inputs") or {}
        if not all(_same(root, stat, name, digest) for name, digest in inputs.items()):
            return None
        for stage in lock.get("stages") or []:
            discovered = stage.get("discovered") or {}
            if not all(_same(root, stat, name, digest) for name, digest in discovered.items()):
                return None
    stat.save()
    return len(files)


def _same(root: Path, stat: StatCache, name: str, digest: Any) -> bool:
    """Whether an input of a lock file (`file:`, `import:`, `dir:` or a
    discovered path or `dist:`) hashes now as recorded, the way the resolver hashes it."""
    from tpubuild.engine.imports import ABSENT
    from tpubuild.engine.keys import installed_dist

    kind, _, rel = name.partition(":")
    if kind == "dist":
        installed = installed_dist(rel)
        return (installed[0] if installed else ABSENT) == digest
    if kind == "dir":
        directory = root / rel
        return directory.is_dir() and stat.tree(directory)[0] == digest
    if kind not in ("file", "import"):  # a discovered path: a file, or absent
        rel = name
    if os.path.isabs(rel):
        return False  # code outside the workspace: the full path compares it
    try:
        return stat.file_hash(str(root / rel)) == digest
    except OSError:
        return digest == ABSENT
