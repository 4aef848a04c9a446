"""What a build would do, without doing it (TensorFlow-free): `build --dry-run`,
`explain`, and `build --check` where the lock file alone cannot answer (engine/lockcheck.py).
All of them read stage state through the resolver."""

from __future__ import annotations

from typing import Any

from tpubuild.engine.build import Engine, lock_problem
from tpubuild.engine.keys import diff_records
from tpubuild.engine.lockfile import read_lock
from tpubuild.engine.resolve import RecipeRun, Resolved, new_runs

__all__ = ["Resolved", "explain_lines", "resolve"]


def resolve(ws: Any, recipe: Any, engine: Engine | None = None, run: RecipeRun | None = None) -> list[Resolved]:
    """Each stage's state, with the reasons of every stage that would run."""
    engine = engine or Engine(ws)
    run = run or new_runs([recipe])[0]
    states = engine.resolver.resolve(run)
    lock = read_lock(recipe.lock_file) or {}
    old_keys = {s["stage"]: s["key"] for s in lock.get("stages", [])}
    for state in states:
        if state.status == "pending" and state.record is not None:
            state.reasons = _reasons(engine, run, old_keys.get(state.name), state)
    return states


def _reasons(engine: Engine, run: RecipeRun, old_key: str | None, state: Resolved) -> list[str]:
    if old_key is None:
        return ["not built before (no entry in the lock file)"]
    if old_key == state.key:
        return ["its output is no longer in the cache"]
    old = engine.store.get(old_key)
    if old is None:
        return [f"changed since the last build, whose record is no longer in the cache (key {old_key[:12]})"]
    old_record = {k: v for k, v in old.record.items() if k != "discovered"}
    changes = diff_records(old_record, state.record or {})
    for rel, digest in sorted(old.record.get("discovered", {}).items()):
        now = engine.resolver.current_hash(run, rel)
        if now != digest:
            changes.append(f"imported module {rel}: " + ("removed" if now is None else
                                                          f"content changed ({digest[:12]} -> {now[:12]})"))
    return changes or ["the key changed"]


def _stale(engine: Engine, run: RecipeRun) -> list[str]:
    states = resolve(engine.ws, run.recipe, engine, run)
    waiting = [s for s in states if s.status != "cached"]
    if waiting:
        first = waiting[0]
        verb = "cannot run" if first.status == "failed" else "would run"
        return [f"stage {first.name} {verb} ({'; '.join(first.reasons)})"]
    problem = lock_problem(engine, run, states)
    return [problem] if problem else []


def explain_lines(ws: Any, recipe: Any) -> list[str]:
    """`tpubuild explain`: one line per stage, then one indented line per reason."""
    lines = [f"{recipe.rel_file}: recipe {recipe.name}"]
    engine = Engine(ws)
    states = resolve(ws, recipe, engine)
    engine.stat.save()
    for stage in states:
        what = {"cached": "cached", "pending": "would run", "failed": "cannot run"}[stage.status]
        key = f" (key {stage.key[:16]})" if stage.key else ""
        lines.append(f"  {stage.name}: {what}{key}")
        lines.extend(f"    - {reason}" for reason in stage.reasons)
    return lines
