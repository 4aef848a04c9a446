"""What a build would do, without doing it (TensorFlow-free): `build --dry-run`, `explain`.

Keys are resolved stage by stage while the store has the previous stage's output; the
first stage that would run is compared with the run the lock file records, to say
exactly which option or input changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.engine.build import Engine, Output, RecipeRun, new_runs
from tpubuild.engine.hashing import hash_bytes, tree_digest
from tpubuild.engine.keys import canonical_dumps, diff_records, stage_key
from tpubuild.engine.lockfile import read_lock
from tpubuild.errors import StageError


@dataclass
class Resolved:
    name: str
    status: str  # cached | pending (would run) | failed (an input is missing)
    key: str | None
    reasons: list[str] = field(default_factory=list)


def resolve(ws: Any, recipe: Any, engine: Engine | None = None) -> list[Resolved]:
    engine = engine or Engine(ws)
    run = new_runs([recipe])[0]
    lock = read_lock(recipe.lock_file) or {}
    old_keys = {s["stage"]: s["key"] for s in lock.get("stages", [])}
    out: list[Resolved] = []
    blocked: str | None = None
    for planned in run.plan:
        if blocked:
            out.append(Resolved(planned.name, "pending", None, [f"its input {blocked} will be rebuilt first"]))
            continue
        try:
            record = engine.record_for(run, planned)
        except StageError as exc:
            out.append(Resolved(planned.name, "failed", None, [str(exc)]))
            blocked = planned.name
            continue
        key = stage_key(record)
        run.keys[planned.name] = key
        if planned.name == "source":
            tree, files, directory = engine.source_tree(recipe)
            run.outputs["source"] = Output(tree, directory, tree, {}, None, files)
            out.append(Resolved("source", "cached", key, _reasons(engine, old_keys.get("source"), key, record)))
            continue
        if planned.name == "publish":
            out.append(_publish(engine, run, key))
            continue
        entry = engine.store.get(key)
        if entry is None:
            out.append(Resolved(planned.name, "pending", key, _reasons(engine, old_keys.get(planned.name), key, record)))
            blocked = planned.name
            continue
        digest = hash_bytes(f"{entry.tree}\n{canonical_dumps(entry.summary)}".encode())
        directory = engine.store.trees / entry.tree
        run.outputs[planned.name] = Output(entry.tree, directory, digest, entry.summary, entry, entry.files)
        out.append(Resolved(planned.name, "cached", key))
    engine.stat.save()
    return out


def _reasons(engine: Engine, old_key: str | None, key: str, record: dict[str, Any]) -> list[str]:
    if old_key is None:
        return ["not built before (no entry in the lock file)"]
    if old_key == key:
        return [] if engine.store.has(key) or record["stage"] == "source" else ["its output is no longer in the cache"]
    old = engine.store.get(old_key)
    if old is None:
        return [f"changed since the last build, whose record is no longer in the cache (key {old_key[:12]})"]
    return diff_records(old.record, record) or ["the key changed"]


def _publish(engine: Engine, run: RecipeRun, key: str) -> Resolved:
    from tpubuild.engine import versions

    model = engine.model_output(run)
    files = {f.path: f for f in (model.files if model else [])}
    files.update({f.path: f for f in (run.outputs["report"].files if "report" in run.outputs else [])})
    content = tree_digest(list(files.values()))
    recipe_dir = Path(engine.ws.output_dir) / run.name
    if versions.newest_matching(recipe_dir, content, engine.stat) is not None:
        return Resolved("publish", "cached", key)
    return Resolved("publish", "pending", key, ["the newest published version has other content (or none exists)"])


def explain_lines(ws: Any, recipe: Any) -> list[str]:
    """`tpubuild explain`: one line per stage, then one indented line per reason."""
    lines = [f"{recipe.rel_file}: recipe {recipe.name}"]
    for stage in resolve(ws, recipe):
        what = {"cached": "cached", "pending": "would run", "failed": "cannot run"}[stage.status]
        key = f" (key {stage.key[:16]})" if stage.key else ""
        lines.append(f"  {stage.name}: {what}{key}")
        lines.extend(f"    - {reason}" for reason in stage.reasons)
    return lines
