"""A run's lock document: what `<recipe>.lock.yaml` records of a build (`lock_for`, with
the artifact's facts), whether the lock file already records it (`lock_problem`, the
no-op path `up_to_date`), writing it (`write_run_lock`), and every file the no-op check
read (`memo_files`, lock/memo.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from tpubuild.digests import ABSENT, StatCache, installed_dist, toolchain
from tpubuild.engine.events import Row
from tpubuild.engine.resolver import (
    Output,
    RecipeRun,
    Resolved,
    Resolver,
    measured_flags,
    published_targets,
    run_inputs,
)
from tpubuild.lock import lock_document, planning_digest, rewrite_reason, write_lock
from tpubuild.pipeline import STAGE_ORDER
from tpubuild.report.formats import human_bytes
from tpubuild.store import Store

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

__all__ = ["LockEngine", "artifact_facts", "lock_for", "lock_problem", "memo_files", "target_facts", "up_to_date",
           "write_run_lock"]


class LockEngine(Protocol):
    """What these need of the engine (engine/loop.py)."""

    ws: Workspace
    store: Store
    stat: StatCache
    resolver: Resolver
    relock: bool
    errors: Callable[[str], None]

    def row(self, run: RecipeRun, row: Row) -> None: ...


def write_run_lock(engine: LockEngine, run: RecipeRun) -> None:
    """Write the lock file of a run that built (rewritten when --relock or it is stale)."""
    path, document = run.recipe.lock_file, lock_for(run, engine.stat, engine.ws.file)
    # Keys the build's but a malformed or stale file (lock/shape.py): rewritten, said once.
    why = None if engine.relock else rewrite_reason(path, engine.ws.display, document, STAGE_ORDER)
    history = Path(engine.ws.state_dir) / "lock-history" / f"{run.name}.json"
    if write_lock(path, document, force=engine.relock or why is not None, history=history) and why is not None:
        engine.errors(f"{run.recipe.rel_file}: rewrote {engine.ws.display(path)}: {why}")


def lock_for(run: RecipeRun, stat: StatCache, ws_file: Path) -> dict[str, Any]:
    """The lock document of a fully resolved run (every stage cached or built)."""
    stages = []
    flags = measured_flags(run.plan)
    for planned, (key_measured, output_measured) in zip(run.plan, flags):
        out = run.outputs[planned.name]
        # What a discovering stage found (its user code's imports, the installed packages
        # it used): with it, `build --check` recomputes the stage's key without the dep
        # file of a cache (engine/lockcheck.py). Nothing found is not written.
        discovered = out.record.get("discovered")
        stages.append({"stage": planned.name, "key": out.key, "output": out.tree, "key_measured": key_measured,
                       "measured": output_measured, **({"discovered": discovered} if discovered else {}),
                       "peak_memory": out.peak_memory})
    # Whether the published model's output may differ between machines.
    model_measured = dict(zip((p.name for p in run.plan), (m for _, m in flags)))[run.plan[-1].consumes["model"]]
    recipe = run.recipe
    document = lock_document(run.name, recipe.digest, toolchain(), run_inputs(run), stages,
                             artifact_facts(run, model_measured))
    document["planning"] = planning_digest(ws_file, stat, recipe.files or [recipe.file], Path(recipe.root),
                                           document, recipe)
    return document


def artifact_facts(run: RecipeRun, model_measured: bool) -> list[tuple[str, Any, bool]]:
    """What the artifact is, for a reviewer reading the lock file's diff: (field, value,
    measured on the building machine). From the report's summary and the rendered options."""
    from tpubuild.digests import hash_bytes
    from tpubuild.errors import TpubuildError
    from tpubuild.render import render

    try:
        options = hash_bytes(render(run.recipe.canonical, "textproto").encode())
    except (TpubuildError, ValueError):
        options = None  # not expressible as ConverterOptions (e.g. generated datasets)
    summary = run.outputs["report"].summary if "report" in run.outputs else {}
    facts: list[tuple[str, Any, bool]] = [("converter_options", options, False)]
    size = (summary.get("size") or {}).get("artifact")
    if size is not None:
        facts += [("size", human_bytes(size), model_measured), ("size_bytes", size, model_measured)]
    if summary.get("parameters"):
        facts.append(("parameters", dict(summary["parameters"]), model_measured))
    cost = summary.get("cost")
    if cost:
        share = f"{100 * cost['tpu'] / cost['total']:.2f}%" if cost.get("total") else "0.00%"
        facts.append(("cost", {"tpu_share": share, "total": cost["total"]}, model_measured))
    if "max_abs_error" in summary:
        facts.append(("max_abs_error", summary["max_abs_error"], True))
    if summary.get("argmax_agreement") is not None:
        facts.append(("argmax_agreement", f"{100 * summary['argmax_agreement']:.1f}%", True))
    facts.append(("warnings", sum(len(out.warnings) for out in run.outputs.values()), False))
    # The build's peak memory: the largest of its stages' (each its worker's peak resident
    # set, measured when it was built; a cached stage keeps its build's figure).
    peaks = [out.peak_memory for out in run.outputs.values() if out.peak_memory is not None]
    if peaks:
        facts += [("peak_memory", human_bytes(max(peaks)), True), ("peak_memory_bytes", max(peaks), True)]
    return facts + target_facts(run)


def target_facts(run: RecipeRun) -> list[tuple[str, Any, bool]]:
    """One fact per published target: its size and verification (measured)."""
    publish = run.plan[-1]
    facts: list[tuple[str, Any, bool]] = []
    for (target, stage), verdict in zip(published_targets(publish).items(), publish.summaries):
        summary = run.outputs[verdict].summary if verdict in run.outputs else {}
        value = {"size_bytes": sum(f.size for f in run.outputs[stage].files)} if stage in run.outputs else {}
        value.update({k: summary[k] for k in ("passed", "max_abs_error") if k in summary})
        facts.append((target, value, True))
    return facts


def lock_problem(engine: LockEngine, run: RecipeRun, states: list[Resolved]) -> str | None:
    """Given a resolution whose every stage is cached: None when the lock file already
    records it, else why not. The no-op path and `build --check` share this."""
    from tpubuild.lock import lock_text, parse_lock_keys, same_keys

    publish = states[-1]
    assert publish.key is not None and publish.output is not None  # cached: resolver.resolve set both
    run.outputs["publish"] = Output.of("publish", publish.key, publish.output, Path(engine.ws.output_dir) / run.name)
    try:
        current = run.recipe.lock_file.read_text()
    except OSError:
        return "no lock file"
    document = lock_for(run, engine.stat, engine.ws.file)
    if engine.relock:  # every byte, measured figures included
        return None if current == lock_text(document) else "the lock file does not record this machine's build"
    if not same_keys(parse_lock_keys(current), document):
        return "the lock file does not record the current build"
    return rewrite_reason(run.recipe.lock_file, engine.ws.display, document, STAGE_ORDER)


def up_to_date(engine: LockEngine, run: RecipeRun) -> bool:
    """The no-op fast path: every stage resolves to a stored record, the newest published
    version holds the result, and the lock file already says so. Reads the same records
    as doit's up-to-date tests; only saves loading doit for recipes with nothing to do."""
    resolved = engine.resolver.resolve(run)
    if any(r.status != "cached" for r in resolved) or lock_problem(engine, run, resolved):
        run.outputs.clear()
        run.version = None
        return False
    for r in resolved:
        engine.row(run, Row(run.name, r.name, "cached", r.key, 0.0))
    return True


def memo_files(engine: LockEngine, run: RecipeRun) -> list[str] | None:
    """Every file and directory the full no-op check of `run` read (lock/memo.py), or
    None when the recipe cannot be memoized (glob inputs, unknown recipe files)."""
    import glob

    from tpubuild.keys import stage_key

    recipe_files = run.recipe.files
    if not recipe_files or run.version is None:
        return None
    root = Path(run.recipe.root)
    files = [str(p) for p in recipe_files] + [str(run.recipe.lock_file)]
    for planned in run.plan:
        if any(glob.has_magic(pattern) for pattern in planned.files):
            return None
        out = run.outputs[planned.name]
        if planned.name == "publish":
            continue
        if planned.name == "source":
            directory = root / planned.options["saved_model"]
            for dirpath, dirnames, filenames in os.walk(directory):
                files.append(dirpath)
                files.extend(os.path.join(dirpath, n) for n in filenames)
        files.extend(str(root / rel) for rel in planned.files)
        for rel, digest in out.record.get("discovered", {}).items():
            if rel.startswith("dist:"):  # an upgrade replaces the dist-info directory
                installed = installed_dist(rel[len("dist:"):])
                files.append(installed[1] if installed else str(root / rel))
            elif digest == ABSENT:  # a file created there changes its directory's stat
                parent = (root / rel).parent
                while not parent.is_dir() and parent != root:
                    parent = parent.parent
                files.append(str(parent))
            else:
                files.append(str(root / rel))
        files.append(str(engine.store.entry_path(out.key)))
        if "discovered" in out.record:  # the dep file that led from the declared key to this record
            declared = {k: v for k, v in out.record.items() if k != "discovered"}
            files.append(str(engine.resolver.depfile(stage_key(declared))))
    recipe_dir = Path(engine.ws.output_dir) / run.name
    files.append(str(recipe_dir))
    version_dirs = [recipe_dir / str(run.version)]
    for target in published_targets(run.plan[-1]):  # each target version too: a deleted one must rerun publish
        files.append(str(recipe_dir / target))
        version_dirs.append(recipe_dir / target / str(run.version))
    for version_dir in version_dirs:
        for dirpath, dirnames, filenames in os.walk(version_dir):
            files.append(dirpath)
            files.extend(os.path.join(dirpath, n) for n in filenames)
    url = run.recipe.publish_to
    if url is not None:  # the note that the destination holds this model: absent, nothing is remembered
        from tpubuild.publish import record_path

        files.append(str(record_path(engine.ws.state_dir, url, run.name)))
    return files
