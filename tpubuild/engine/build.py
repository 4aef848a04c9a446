"""Building recipes: resolve each stage's key, take it from the store or run it in a
worker, publish, write the lock file. One `RecipeRun` per recipe; doit orders the stages
(tasks.py) and runs independent recipes in parallel."""

from __future__ import annotations

import glob
import os
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tpubuild import __version__
from tpubuild.engine.hashing import FileEntry, hash_bytes, tree_digest
from tpubuild.engine.keys import canonical_dumps, key_record, stage_key, tensorflow_version
from tpubuild.engine.lockfile import lock_document, read_lock, write_lock
from tpubuild.engine.statcache import StatCache
from tpubuild.engine.store import StageEntry, Store
from tpubuild.errors import StageError
from tpubuild.pipeline import STAGES, TRANSFORMS, PlannedStage, plan

STATUSES = ("built", "cached", "failed", "skipped")


@dataclass
class Row:
    recipe: str
    stage: str
    status: str
    key: str | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "stage": self.stage, "status": self.status, "key": self.key,
                "seconds": round(self.seconds, 3)}


@dataclass
class Output:
    """A finished stage: its output tree, where it is on disk, and what later keys hash."""

    tree: str
    directory: Path
    digest: str
    summary: dict[str, Any]
    entry: StageEntry | None  # None for `source` (the user's directory, not in the store)
    files: list[FileEntry]


@dataclass
class RecipeRun:
    recipe: Any  # tpubuild.config.Recipe
    plan: list[PlannedStage]
    rows: list[Row] = field(default_factory=list)
    outputs: dict[str, Output] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    external: dict[str, str] = field(default_factory=dict)  # input name -> hash (lock `inputs`)
    error: str | None = None
    version: int | None = None

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def failed(self) -> bool:
        return self.error is not None


class Engine:
    """Shared state of one command: workspace, store, stat cache, workers, printer."""

    def __init__(self, ws: Any, jobs: int = 1, printer: Callable[[RecipeRun, Row], None] | None = None,
                 errors: Callable[[str], None] | None = None):
        self.ws = ws
        self.jobs = jobs
        self.store = Store(ws.cache_dir)
        self.stat = StatCache(ws.state_dir / "statcache.json")
        self.printer = printer or (lambda run, row: None)
        self.errors = errors or (lambda message: None)
        self.pool: Any = None
        self.pool_lock = threading.Lock()

    # --- inputs and keys ------------------------------------------------------------
    def expand(self, recipe: Any, patterns: list[str]) -> list[str]:
        """Workspace-relative files named by `patterns` (globs expanded, sorted)."""
        found: list[str] = []
        for pattern in patterns:
            if glob.has_magic(pattern):
                matches = sorted(glob.glob(os.path.join(recipe.root, pattern), recursive=True))
                found.extend(Path(os.path.relpath(m, recipe.root)).as_posix() for m in matches if os.path.isfile(m))
            elif os.path.isfile(os.path.join(recipe.root, pattern)):
                found.append(pattern)
            else:
                raise StageError(f"input file {pattern} does not exist")
        return sorted(set(found))

    def source_tree(self, recipe: Any) -> tuple[str, list[FileEntry], Path]:
        rel = recipe.canonical["model"]["saved_model"]
        directory = Path(recipe.root) / rel
        if not directory.is_dir():
            raise StageError(f"model.saved_model: {rel} is not a directory")
        if not (directory / "saved_model.pb").is_file():
            raise StageError(f"model.saved_model: {rel} holds no saved_model.pb")
        tree, files = self.stat.tree(directory)
        return tree, files, directory

    def external_inputs(self, run: RecipeRun) -> dict[str, str]:
        """The hashes of everything the recipe reads from the workspace (lock `inputs`)."""
        inputs: dict[str, str] = {}
        for planned in run.plan:
            if planned.name == "source":
                inputs[f"dir:{planned.options['saved_model']}"] = self.source_tree(run.recipe)[0]
            for rel in self.expand(run.recipe, planned.files):
                inputs[f"file:{rel}"] = self.stat.file_hash(os.path.join(run.recipe.root, rel))
        return inputs

    def stage_inputs(self, run: RecipeRun, planned: PlannedStage) -> dict[str, str]:
        inputs = {f"stage:{name}": out.digest for name, out in run.outputs.items()}
        for rel in self.expand(run.recipe, planned.files):
            inputs[f"file:{rel}"] = self.stat.file_hash(os.path.join(run.recipe.root, rel))
        return inputs

    def record_for(self, run: RecipeRun, planned: PlannedStage) -> dict[str, Any]:
        spec = STAGES[planned.name]
        if planned.name == "source":
            tree = self.source_tree(run.recipe)[0]
            inputs = {f"dir:{planned.options['saved_model']}": tree}
        else:
            inputs = self.stage_inputs(run, planned)
        return key_record(planned.name, spec.version, planned.options, inputs)

    # --- running one stage ----------------------------------------------------------
    def run_stage(self, run: RecipeRun, planned: PlannedStage) -> bool:
        """The doit action of one stage. Failures are recorded on `run`, never raised, so
        doit goes on with the other recipes; later stages of this recipe are skipped."""
        start = time.monotonic()
        if run.failed:
            self._row(run, Row(run.name, planned.name, "skipped", None, 0.0))
            return True
        key = None
        try:
            record = self.record_for(run, planned)
            key = stage_key(record)
            run.keys[planned.name] = key
            if planned.name == "source":
                status = self._source(run, planned, key)
            elif planned.name == "publish":
                status = self._publish(run, key)
            else:
                status = self._transform(run, planned, key, record)
        except StageError as exc:
            run.error = f"{run.recipe.rel_file}: stage {planned.name}: {exc}"
            self.errors(run.error)
            status = "failed"
        except Exception as exc:  # a bug in tpubuild: the recipe fails, the build goes on
            run.error = f"{run.recipe.rel_file}: stage {planned.name}: internal error: {type(exc).__name__}: {exc}"
            self.errors(run.error + "\n" + traceback.format_exc().rstrip())
            status = "failed"
        self._row(run, Row(run.name, planned.name, status, key, time.monotonic() - start))
        if planned.name == "publish" and status != "failed":
            self._write_lock(run)
        return True

    def _row(self, run: RecipeRun, row: Row) -> None:
        run.rows.append(row)
        self.printer(run, row)

    def _source(self, run: RecipeRun, planned: PlannedStage, key: str) -> str:
        tree, files, directory = self.source_tree(run.recipe)
        run.outputs["source"] = Output(tree, directory, tree, {}, None, files)
        return "cached"

    def _transform(self, run: RecipeRun, planned: PlannedStage, key: str, record: dict) -> str:
        entry = self.store.get(key)
        status = "cached"
        if entry is None or not self.store.verify(entry, self.stat):
            entry = self._execute(run, planned, key, record)
            status = "built"
            for warning in entry.warnings:
                self.errors(f"{run.recipe.rel_file}: stage {planned.name}: warning: {warning}")
        else:
            self.store.touch(key)
        directory = self.store.checkout(entry)
        digest = hash_bytes(f"{entry.tree}\n{canonical_dumps(entry.summary)}".encode())
        run.outputs[planned.name] = Output(entry.tree, directory, digest, entry.summary, entry, entry.files)
        return status

    def _execute(self, run: RecipeRun, planned: PlannedStage, key: str, record: dict) -> StageEntry:
        spec = STAGES[planned.name]
        model = self.model_output(run)
        work = self.store.new_workdir(planned.name)
        out_dir = work / "out"
        out_dir.mkdir()
        inputs = {name: str(out.directory) for name, out in run.outputs.items()}
        if "export" in run.outputs:
            inputs["source"] = str(run.outputs["export"].directory)
        request = {
            "entry": spec.entry,
            "stage": planned.name,
            "recipe": run.name,
            "recipe_file": str(run.recipe.file),
            "workspace": str(run.recipe.root),
            "input_dir": str(model.directory if model else run.recipe.root),
            "output_dir": str(out_dir),
            "options": planned.options,
            "inputs": inputs,
            "results": {name: _result(out) for name, out in run.outputs.items()},
        }
        try:
            reply = self.workers().run(request)
            if not reply["ok"]:
                message = reply["error"]
                if reply.get("bug"):
                    message = f"internal error: {message} (traceback in {self.ws.state_dir / 'logs'})"
                raise StageError(message)
            return self.store.put(key, planned.name, out_dir, reply["summary"], reply["warnings"], record, self.stat)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def model_output(self, run: RecipeRun) -> Output | None:
        """The newest SavedModel of the chain: the last transform stage's output."""
        for name in reversed(list(run.outputs)):
            if name in TRANSFORMS:
                return run.outputs[name]
        return None

    def workers(self) -> Any:
        with self.pool_lock:
            if self.pool is None:
                from tpubuild.engine.workers import WorkerPool

                self.pool = WorkerPool(self.jobs, self.ws.state_dir / "logs")
            return self.pool

    # --- publish and lock -----------------------------------------------------------
    def publish_files(self, run: RecipeRun) -> list[tuple[FileEntry, Path]]:
        """The published tree: the final model, plus the files the report stage wrote."""
        model = self.model_output(run)
        assert model is not None
        if model.entry is None:  # the user's own directory: copy it into the store first
            self.store.ingest_copies(model.files, model.directory)
        files = {f.path: f for f in model.files}
        report = run.outputs.get("report")
        for f in report.files if report else []:
            if f.path in files:
                raise StageError(f"report file {f.path} would overwrite a file of the model")
            files[f.path] = f
        return [(f, self.store.object_path(f.hash)) for f in sorted(files.values(), key=lambda f: f.path)]

    def _publish(self, run: RecipeRun, key: str) -> str:
        from tpubuild.engine import versions

        files = self.publish_files(run)
        content = tree_digest([f for f, _ in files])
        recipe_dir = Path(self.ws.output_dir) / run.name
        versions.clean_temp(recipe_dir)
        newest = versions.newest_matching(recipe_dir, content, self.stat)
        run.outputs["publish"] = Output(content, recipe_dir, content, {}, None, [f for f, _ in files])
        if newest is not None:
            run.version = newest
            return "cached"
        manifest = {
            "recipe": run.name,
            "recipe_file": run.recipe.rel_file,
            "recipe_digest": run.recipe.digest,
            "content": content,
            "files": {f.path: f.hash for f, _ in files},
            "stages": [
                {"stage": name, "key": run.keys.get(name), "output": out.tree}
                for name, out in run.outputs.items() if name != "publish"
            ],
            "inputs": self.external_inputs(run),
            "tpubuild": __version__,
            "tensorflow": tensorflow_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git_commit": git_commit(self.ws.root),
            "report": run.outputs["report"].summary if "report" in run.outputs else {},
        }
        run.version = versions.publish(recipe_dir, files, manifest, self.ws.keep_versions, self.stat)
        return "built"

    def lock_for(self, run: RecipeRun) -> dict[str, Any]:
        stages = [
            {"stage": p.name, "version": STAGES[p.name].version, "key": run.keys[p.name],
             "output": run.outputs[p.name].tree}
            for p in run.plan
        ]
        return lock_document(run.name, run.recipe.digest, tensorflow_version(), __version__,
                             self.external_inputs(run), stages, run.outputs["publish"].tree, run.version)

    def _write_lock(self, run: RecipeRun) -> None:
        write_lock(run.recipe.lock_file, self.lock_for(run))

    # --- the no-op fast path ----------------------------------------------------------
    def up_to_date(self, run: RecipeRun) -> bool:
        """Whether the lock file proves nothing to do: same recipe, inputs, tools, stages,
        every stage output still in the store and the published version intact."""
        from tpubuild.engine import versions

        lock = read_lock(run.recipe.lock_file)
        if not lock_matches(lock, run, self):
            return False
        stages = lock["stages"]
        for entry in stages:
            if entry["stage"] not in ("source", "publish") and not self.store.has(entry["key"]):
                return False
        version = lock.get("published_version")
        recipe_dir = Path(self.ws.output_dir) / run.name
        if version is None or versions.newest_matching(recipe_dir, lock["output"], self.stat) != version:
            return False
        run.version = version
        for entry in stages:
            run.keys[entry["stage"]] = entry["key"]
            self._row(run, Row(run.name, entry["stage"], "cached", entry["key"], 0.0))
        return True


def lock_matches(lock: dict[str, Any] | None, run: RecipeRun, engine: Engine) -> bool:
    """Whether building would leave the lock file's inputs as they are (`--check`)."""
    return not lock_changes(lock, run, engine)


def lock_changes(lock: dict[str, Any] | None, run: RecipeRun, engine: Engine) -> list[str]:
    """Why building would change the lock file; empty when it would not."""
    if lock is None:
        return ["no lock file"]
    reasons = []
    if lock.get("recipe_digest") != run.recipe.digest:
        reasons.append("the recipe changed")
    if lock.get("tensorflow") != tensorflow_version() or lock.get("tpubuild") != __version__:
        reasons.append("the TensorFlow or tpubuild version changed")
    planned = [(p.name, STAGES[p.name].version) for p in run.plan]
    if [(s.get("stage"), s.get("version")) for s in lock.get("stages", [])] != planned:
        reasons.append("the stages changed")
    try:
        current = engine.external_inputs(run)
    except StageError as exc:
        return reasons + [str(exc)]
    old = lock.get("inputs", {})
    for name in sorted(set(current) | set(old)):
        if current.get(name) != old.get(name):
            reasons.append(f"input {name.split(':', 1)[1]} changed")
    return reasons


def new_runs(recipes: list[Any]) -> list[RecipeRun]:
    return [RecipeRun(r, plan(r.canonical)) for r in recipes]


def git_commit(root: Path) -> str | None:
    """The workspace's git HEAD, when it is a git checkout (recorded in the manifest)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build(
    ws: Any,
    recipes: list[Any],
    jobs: int = 1,
    printer: Callable[[RecipeRun, Row], None] | None = None,
    errors: Callable[[str], None] | None = None,
    lock_wait: float = 3600.0,
) -> tuple[list[RecipeRun], Engine]:
    """Build `recipes` under the workspace lock; recipes already up to date (per their
    lock file) never reach doit, which keeps a no-op build fast."""
    from tpubuild.engine.wslock import WorkspaceLock

    engine = Engine(ws, jobs, printer, errors)
    runs = new_runs(recipes)
    lock = WorkspaceLock(ws.state_dir)
    lock.acquire(lock_wait, notify=engine.errors)
    try:
        todo = [run for run in runs if not engine.up_to_date(run)]
        if todo:
            from tpubuild.engine.tasks import run_tasks

            engine.store.clean_tmp()
            try:
                code = run_tasks(engine, todo, jobs, ws.state_dir / "doit-deps.json")
            finally:
                if engine.pool is not None:
                    engine.pool.close()
            for run in todo:  # doit itself failing is a bug; never report it as success
                if len(run.rows) < len(run.plan) and not run.failed:
                    run.error = f"{run.recipe.rel_file}: internal error: doit stopped (exit code {code})"
                    engine.errors(run.error)
        engine.stat.save()
    finally:
        lock.release()
    return runs, engine


def _result(out: Output) -> dict[str, Any]:
    """What later stages see of an earlier one: its summary, with its warnings (the
    checks' findings) so the report can show them even when the stage was cached."""
    warnings = out.entry.warnings if out.entry else []
    return {**out.summary, "warnings": list(warnings)} if warnings else out.summary
