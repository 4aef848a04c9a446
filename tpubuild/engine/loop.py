"""Building recipes: each (recipe, stage) is a doit task whose up-to-date test is the
resolver's record lookup (engine/resolver.py); an out-of-date stage runs in a worker,
its declared inputs are checked again after it ran, and only then is its record stored.
Publishing and lock files are written from the same records.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tpubuild import __version__
from tpubuild.digests import ABSENT, StatCache, installed_dist, toolchain, worker_env
from tpubuild.engine.cache import LayeredCache, LocalLayer, RemoteLayer
from tpubuild.engine.resolver import (
    Output,
    Pending,
    RecipeRun,
    Resolver,
    changed_inputs,
    measured_flags,
    new_runs,
    published_targets,
    run_inputs,
    without_targets,
)
from tpubuild.errors import StageError
from tpubuild.keys import StageEntry
from tpubuild.lock import lock_document, planning_digest, rewrite_reason, write_lock
from tpubuild.pipeline import ENGINE_STEPS, TARGET_STAGES, PlannedStage, entry, spec
from tpubuild.provenance.digests import dependency_digests
from tpubuild.publish import split_by_target
from tpubuild.report.formats import human_bytes
from tpubuild.store import Store
from tpubuild.store import register as register_used

if TYPE_CHECKING:
    from tpubuild.config.workspace import Workspace

__all__ = ["Engine", "RecipeRun", "Row", "build", "new_runs"]

DEFAULT_STAGE_TIMEOUT = 3600.0


@dataclass
class Row:
    recipe: str
    stage: str
    status: str
    key: str | None
    seconds: float
    remote: bool = False  # a `cached` stage whose record came from the remote cache
    peak_rss_bytes: int | None = None  # a `built` stage's worker: its peak resident set size in that stage
    # A stage run by a worker: `seconds` is its own work, timed in the worker; this is the
    # rest of the wait for its reply: a free slot (-j), a new worker's process start and
    # TensorFlow import (workers/import_clock.py), on Ray the task's scheduling and transfers.
    worker_startup_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        startup = self.worker_startup_seconds
        return {"recipe": self.recipe, "stage": self.stage, "status": self.status, "key": self.key,
                "seconds": round(self.seconds, 3), "remote": self.remote, "peak_rss_bytes": self.peak_rss_bytes,
                "worker_startup_seconds": None if startup is None else round(startup, 3)}


@dataclass
class WorkerTime:
    """A stage's time as its worker measured it, and what waiting for that worker added."""

    seconds: float | None = None  # the stage's own work; None: no worker reply (Ray failures, old workers)
    startup: float | None = None

    @classmethod
    def of(cls, reply: dict[str, Any], waited: float) -> WorkerTime:
        own = reply.get("seconds")
        if not isinstance(own, (int, float)):
            return cls(None, None)
        return cls(float(own), max(0.0, waited - own))

    def or_since(self, start: float) -> float:
        """The stage's own seconds, else the engine's clock since `start`."""
        return self.seconds if self.seconds is not None else time.monotonic() - start


# An own-worker stage whose worker, kept after it, runs the recipe's next such stage:
# report after verify. Report makes the same CPU twin of the same input as verify (kept in
# the worker's scratch: tpu/twin.py cpu_twin) and saves a worker's TensorFlow import. Its
# peak in verify's worker, ResNet50 bf16 with TensorFlow imported without JAX
# (workers/lean_import.py): see benchmarks/real_models.py; the goal, 3x the model +
# TensorFlow's own, holds.
HANDOFF = {"verify": "report"}


def _handoff_token(run: RecipeRun, stage: str) -> str:
    return f"{run.name}:{stage}"


class Engine:
    """Shared state of one command: workspace, store, stat cache, resolver, workers, printer."""

    def __init__(self, ws: Workspace, jobs: int = 1, printer: Callable[[RecipeRun, Row], None] | None = None,
                 errors: Callable[[str], None] | None = None,
                 started: Callable[[RecipeRun, str], None] | None = None,
                 notes: Callable[[str], None] | None = None):
        self.ws = ws
        self.jobs = jobs
        self.store = Store(ws.cache_dir)
        self.stat = StatCache(ws.state_dir / "statcache.json")
        self.resolver = Resolver(ws, self.store, self.stat)
        self.printer = printer or (lambda run, row: None)
        self.errors = errors or (lambda message: None)
        self.started = started or (lambda run, stage: None)
        self.notes = notes or (lambda line: None)  # what the build did beside its stages (stdout)
        self.pool: Any = None
        self.pool_lock = threading.Lock()
        self.state_lock = threading.RLock()  # resolver, stat cache and store index are shared by doit threads
        self.pending: dict[tuple[str, str], Pending] = {}
        self.keep_going = False  # build --keep-going: a failed target does not stop its recipe's publish
        self.relock = False  # build --relock: lock files rewritten with this machine's measured figures
        self.timeout = float(getattr(ws, "stage_timeout", None) or DEFAULT_STAGE_TIMEOUT)
        self.link_type = getattr(ws, "link_type", None) or "copy"
        self.executor = getattr(ws, "executor", None) or "local"  # or "ray": workers/ray.py
        from tpubuild.workers import own_worker_min_bytes

        self.own_worker_min = own_worker_min_bytes()  # a bad value stops the build before it starts
        self.remote: Any = None  # remote/cache.py RemoteCache, when the build has one
        # Where stage records are looked up, and built ones recorded (engine/cache.py).
        self.cache = LayeredCache([LocalLayer(self.resolver, self.state_lock)])
        self._ahead: Any = None  # the thread that computes the source's standard digests (_digests_ahead)
        self._ahead_futures: dict[str, Any] = {}  # recipe name -> its source's

    # --- the remote cache -----------------------------------------------------------
    def attach_remote(self, url: str, push: bool = True) -> None:
        """Use the remote cache at `url` for this build (imports fsspec and the backend)."""
        from tpubuild.digests import (
            key_id,
            load_public_key,
            signing_key_from_environment,
        )
        from tpubuild.remote import RemoteCache

        keys = [load_public_key(path, "remote_cache.trusted_keys") for path in getattr(self.ws, "remote_trusted_keys", [])]
        signing = signing_key_from_environment() if push else None
        self.remote = RemoteCache(url, push, report=self.errors, signing_key=signing,
                                  trusted={key_id(key): key for key in keys},
                                  timeouts=getattr(self.ws, "remote_timeouts", None))
        self.remote.connect()
        self.cache.layers.append(RemoteLayer(self.remote, self.resolver, self.state_lock, self.errors))

    def _digests_ahead(self, run: RecipeRun, entry: StageEntry) -> None:
        """Compute the in-toto digests of a new source snapshot now, in a thread, while the
        stages after it run in workers: publish needs them (provenance/digests.py
        compute_ahead), and they are the same bytes' whenever they are read."""
        from concurrent.futures import ThreadPoolExecutor

        from tpubuild.provenance.digests import compute_ahead

        with self.pool_lock:
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpubuild-digests")
            self._ahead_futures[run.name] = self._ahead.submit(compute_ahead, entry.files, self.store.object_path)

    def finish_digests(self, wait: bool = True) -> None:
        """Wait for the digests computed ahead (they read store objects); on an interrupt,
        drop the ones not started."""
        if self._ahead is not None:
            self._ahead.shutdown(wait=wait, cancel_futures=not wait)
            self._ahead = None

    # --- doit: the up-to-date test and the action of one (recipe, stage) task --------
    def _failed_target(self, run: RecipeRun, planned: PlannedStage) -> str | None:
        """With --keep-going: the failed target whose chain `planned` belongs to."""
        return next((t for t in run.failed_targets if planned.name in TARGET_STAGES[t]), None)

    def uptodate(self, run: RecipeRun, planned: PlannedStage) -> bool:
        """Resolve the stage's key from its current inputs; True (and the output taken
        from the store) when a record with that key exists and its objects are intact,
        locally or, with a remote cache, there (then it is fetched: `cached`, remote)."""
        start = time.monotonic()
        with self.state_lock:
            if self._failed_target(run, planned):
                self.row(run, Row(run.name, planned.name, "skipped", None, 0.0))
                return True  # nothing to run: the chain's build stage failed
            try:
                if planned.name == "publish":
                    if run.failed_targets:
                        # --keep-going: publish what verified, without the failed targets.
                        run.plan[-1] = without_targets(run.plan[-1], set(run.failed_targets))
                    return self._publish_uptodate(run, start)
                pending = self.resolver.record_for(run, planned)
            except StageError as exc:  # an input is missing: the action reports it
                self.pending[(run.name, planned.name)] = Pending(None, None, error=str(exc))
                return False
            except Exception as exc:  # a bug in tpubuild or a full disk: this recipe fails, the build goes on
                self.pending[(run.name, planned.name)] = Pending(None, None, error=_unexpected(exc),
                                                                 detail=traceback.format_exc())
                return False
        try:  # outside the state lock: with a remote cache, -j N threads download at once
            entry, layer = self.cache.lookup(run, planned, pending)
        except Exception as exc:  # a bug in tpubuild or a full disk: this recipe fails, the build goes on
            with self.state_lock:
                self.pending[(run.name, planned.name)] = Pending(None, None, error=_unexpected(exc),
                                                                 detail=traceback.format_exc())
            return False
        fetched = layer == RemoteLayer.name
        with self.state_lock:
            if entry is None:
                self.pending[(run.name, planned.name)] = pending
                if planned.name == "source":
                    self._prestart_worker(run)
                return False
            self.store.touch(entry.key)
        if planned.name in HANDOFF.values() and self.pool is not None and self.executor == "local":
            self.pool.release(_handoff_token(run, planned.name))  # a worker kept for it: not needed
        directory = self.store.checkout(entry)
        run.outputs[planned.name] = self.resolver.output_of(planned, entry, directory)
        self.row(run, Row(run.name, planned.name, "cached", entry.key, time.monotonic() - start, remote=fetched))
        return True

    def _prestart_worker(self, run: RecipeRun) -> None:
        """A new source changes the key of every stage after it: those stages will run, in
        workers, so the first worker starts importing TensorFlow now, while this process
        copies the source into the store (WorkerPool.prestart). Not for Ray, whose nodes
        start their own; not for a recipe whose every later step runs in this process."""
        if self.executor == "local" and any(p.name not in ENGINE_STEPS for p in run.plan):
            self.workers().prestart()

    def action(self, run: RecipeRun, planned: PlannedStage) -> bool:
        """Run the stage (doit calls this only when `uptodate` said no). False fails the
        task, and doit then skips the tasks that depend on it."""
        if run.failed:
            return False
        start = time.monotonic()
        pending = self.pending.pop((run.name, planned.name))
        if pending.error:
            return self._fail(run, planned, pending.error, start, pending.detail)
        self.started(run, planned.name)
        timing = WorkerTime()  # the source snapshot and publish run in this process
        try:
            peak_rss = None
            if planned.name == "source":
                entry = self._snapshot_source(run, planned, pending)
                self._digests_ahead(run, entry)
            elif planned.name == "publish":
                self._publish(run)
                self.row(run, Row(run.name, "publish", "built", self.resolver.publish_key(run, run.outputs["publish"].tree),
                                   time.monotonic() - start))
                return True
            else:
                entry, peak_rss, timing = self._execute(run, planned, pending)
        except StageError as exc:
            return self._fail(run, planned, str(exc), start, exc.detail, timing if exc.timing is None else exc.timing)
        except Exception as exc:  # a bug in tpubuild or a full disk: the recipe fails, the build goes on
            return self._fail(run, planned, _unexpected(exc), start, traceback.format_exc())
        self.cache.record(entry)
        directory = self.store.checkout(entry)
        run.outputs[planned.name] = self.resolver.output_of(planned, entry, directory)
        for warning in entry.warnings:
            self.errors(f"{run.recipe.rel_file}: stage {planned.name}: warning: {warning}")
        self.row(run, Row(run.name, planned.name, "built", entry.key, timing.or_since(start),
                          peak_rss_bytes=peak_rss, worker_startup_seconds=timing.startup))
        return True

    def _fail(self, run: RecipeRun, planned: PlannedStage, message: str, start: float,
              detail: str | None = None, timing: WorkerTime | None = None) -> bool:
        """Record a failed stage; returns what doit is told (False: its dependents stop).
        With --keep-going a target chain's failure is that target's alone: doit goes on,
        the chain's other stage is skipped and publish leaves the target out."""
        line = f"{run.recipe.rel_file}: stage {planned.name}: {message}"
        target = next((t for t, chain in TARGET_STAGES.items() if chain and planned.name in chain), None)
        self.errors(line + (f"\n{detail.rstrip()}" if detail and os.environ.get("TPUBUILD_DEBUG") else ""))
        timing = timing or WorkerTime()
        self.row(run, Row(run.name, planned.name, "failed", None, timing.or_since(start),
                          worker_startup_seconds=timing.startup))
        if self.keep_going and target is not None:
            run.failed_targets[target] = line
            return True
        run.error = line
        return False

    def row(self, run: RecipeRun, row: Row) -> None:
        """Record a stage's outcome in its recipe's rows and print it."""
        with self.state_lock:
            run.rows.append(row)
        self.printer(run, row)

    # --- running stages -------------------------------------------------------------
    def _snapshot_source(self, run: RecipeRun, planned: PlannedStage, pending: Pending) -> StageEntry:
        """Copy the user's SavedModel into the store, each file checked against the hash
        the key took: later stages read the snapshot, never the user's directory."""
        rel = planned.options["saved_model"]
        key, record = _keyed(pending)
        tree, files, directory = self.resolver.source_tree(run.recipe)
        if tree != record["inputs"][f"dir:{rel}"]:
            raise StageError(f"model.saved_model: {rel} changed while it was being read (build again)")
        with self.state_lock:
            return self.store.put_files(key, "source", files, directory, record, self.stat)

    def _execute(self, run: RecipeRun, planned: PlannedStage,
                 pending: Pending) -> tuple[StageEntry, int | None, WorkerTime]:
        """Run the stage in a worker and store its output; (entry, the worker's peak RSS in
        it, its time). A StageError raised after the worker replied carries the time too."""
        stage = spec(planned.name)
        key, record = _keyed(pending)
        work = self.store.new_workdir(planned.name)
        out_dir = work / "out"
        out_dir.mkdir()
        from tpubuild.workers import stage_request

        request = stage_request(
            entry(planned.name), planned.name, str(run.recipe.root), str(out_dir), planned.options,
            {role: str(run.outputs[name].directory) for role, name in planned.consumes.items()},
            {name: _result(run.outputs[name]) for name in planned.summaries},
        )
        # A worker of its own only where it pays (see WorkerPool.run); when a later stage
        # of this recipe will want one, a spare starts beside this stage.
        big = sum(f.size for name in set(planned.consumes.values()) for f in run.outputs[name].files) \
            >= self.own_worker_min
        if stage.runs_models:
            request["own_worker"] = big
        later = run.plan[run.plan.index(planned) + 1:]
        wanting = [p.name for p in later if p.name not in ENGINE_STEPS and spec(p.name).runs_models
                   and p.name not in run.outputs]
        handing = request.get("own_worker") and self.executor == "local"  # Ray: the next may run elsewhere
        # Only to the very next such stage: a worker kept idle while another stage's worker
        # runs (warmup between verify and report) would hold its memory beside that one.
        if handing and wanting and wanting[0] == HANDOFF.get(planned.name):
            request["keep_for"] = _handoff_token(run, HANDOFF[planned.name])
            wanting.remove(HANDOFF[planned.name])  # it needs no spare
        if handing and planned.name in HANDOFF.values():
            request["take"] = _handoff_token(run, planned.name)
        spare = big and bool(wanting)
        if self.executor == "ray":  # no driver paths reach a node: input trees, and what the key holds
            request["trees"] = {role: [[f.path, f.hash, f.size] for f in run.outputs[name].files]
                                for role, name in planned.consumes.items()}
            request["keyed"] = {field: record[field] for field in ("code", "toolchain", "env")}
            request["declared"] = {k[5:]: v for k, v in record["inputs"].items() if k.startswith("file:")}
        try:
            asked = time.monotonic()
            reply = self.workers().run(request, self.timeout, Path(run.recipe.root) if stage.runs_user_code else None,
                                       spare=spare)
            timing = WorkerTime.of(reply, time.monotonic() - asked)
            if not reply["ok"]:
                message = reply["error"]
                if reply.get("bug"):
                    where = self.ws.display(Path(reply.get("log") or self.ws.state_dir / "logs"))
                    message = f"internal error: {message} (traceback in {where})"
                raise StageError(message, detail=reply.get("detail"), timing=timing)
            changed = changed_inputs(Path(run.recipe.root), pending.file_stats, record["inputs"], self.stat)
            if changed:
                raise StageError(f"input {', '.join(changed)} changed while the stage ran; its result was not "
                                 "recorded (build again)", timing=timing)
            if stage.discovers:
                discovered = reply.get("discovered", {})
                with self.state_lock:
                    key = self.resolver.add_discovered(key, discovered)
                record = dict(record, discovered=discovered)
            with self.state_lock:
                stored = self.store.put(key, planned.name, out_dir, reply["summary"], reply["warnings"], record, self.stat)
            return stored, reply.get("peak_rss_bytes"), timing
        finally:
            self.store.remove_workdir(work)  # by descriptor, from the session's own

    def workers(self) -> Any:
        with self.pool_lock:
            if self.pool is None and self.executor == "ray":
                from tpubuild.workers import RayExecutor

                self.pool = RayExecutor(self.store, self.remote, getattr(self.ws, "ray_address", None),
                                        getattr(self.ws, "ray_resources", None), self.ws.state_dir / "logs")
            if self.pool is None:
                from tpubuild.workers import WorkerPool, next_index

                logs = self.ws.state_dir / "logs"
                self.pool = WorkerPool(self.jobs, logs, worker_env(), getattr(self.ws, "worker_memory_limit", None),
                                       first=next_index(logs))
            return self.pool

    # --- publish and lock -----------------------------------------------------------
    def _publish_uptodate(self, run: RecipeRun, start: float) -> bool:
        files, content, holding = self.resolver.published(run)
        number = holding.number if holding is not None and holding.intact else None
        if holding is not None and not holding.intact:
            # The newest version holds this content, damaged: a build restores it in place from
            # the store (planning and dry runs only say so: the query wrote nothing).
            from tpubuild.publish import repair_newest

            paths = [(f, self.store.object_path(f.hash)) for f in files]
            restored = repair_newest(Path(self.ws.output_dir) / run.name, holding, paths, self.stat, self.link_type)
            for path in restored or []:
                self.errors(f"{run.recipe.rel_file}: restored {self.ws.display(path)} (it no longer matched its manifest)")
            number = holding.number if restored is not None else None
        run.outputs["publish"] = Output.of("publish", self.resolver.publish_key(run, content), content,
                                           Path(self.ws.output_dir) / run.name, files)
        if number is None:
            self.pending[(run.name, "publish")] = Pending(None, None)
            return False
        run.version = number
        self.row(run, Row(run.name, "publish", "cached", run.outputs["publish"].key, time.monotonic() - start))
        return True

    def _publish(self, run: RecipeRun) -> None:
        """A new version, or, when the newest one holds the same model (only the report's
        figures differ), that version with its report, manifest and provenance updated."""
        from tpubuild.publish import (
            newest_same_model,
            publish,
            reservation_file,
            update_version,
        )

        out = run.outputs["publish"]
        with self.state_lock:
            manifest = self.manifest(run, out.tree)
            paths = [(f, self.store.object_path(f.hash)) for f in out.files]
            same = newest_same_model(out.directory, manifest["model"])
            if same is not None:
                update_version(out.directory, same, paths, manifest, self.stat, self.link_type, finish=self._attest)
                run.version, run.updated_in_place = same, True
                return
            run.version = publish(out.directory, paths, manifest, self.ws.keep_versions, self.stat,
                                  link_type=self.link_type,
                                  warn=lambda m: self.errors(f"warning: {m}"), finish=self._attest,
                                  reservation=reservation_file(self.ws.state_dir, out.directory))

    def _attest(self, version_dir: Path, manifest: dict[str, Any], target: str | None = None) -> None:
        """The provenance statement of a version (the main one, or a target version when
        `target` names it), and its signature when the workspace names a signing key
        (tpubuild/provenance/)."""
        from tpubuild.provenance import statement

        statement.write(version_dir, manifest, self.remote.url if self.remote is not None else None, target)
        key = getattr(self.ws, "signing_key", None)
        if key is None:
            return
        if not key.is_file():
            self.errors(f"warning: signing.key {key} not found: {manifest['recipe']} version {manifest['version']} "
                        "published unsigned")
            return
        from tpubuild.provenance.signature import sign

        try:
            sign(version_dir, key, getattr(self.ws, "signing_certificate", None), getattr(self.ws, "signing_chain", []))
        except Exception as exc:  # noqa: BLE001 - the library's own error: one line, nothing published
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StageError(f"signing.key {key}: cannot sign {manifest['recipe']}: {first}") from None

    def manifest(self, run: RecipeRun, content: str) -> dict[str, Any]:
        """What a published version says of itself; the recipe-specific part of the
        artifact (cached outputs never name a recipe)."""
        publish = run.plan[-1]
        targets = published_targets(publish)
        ahead = self._ahead_futures.pop(run.name, None)
        if ahead is not None:  # dependency_digests below takes what it computed, not the files again
            from concurrent.futures import wait

            wait([ahead])  # what it could not compute (or a bug in it) is computed below as ever
        main, by_target = split_by_target(run.outputs["publish"].files, sorted(targets))
        verdicts = dict(zip(targets, publish.summaries))  # plan order: each target's verify stage
        return {
            "recipe": run.name,
            "recipe_file": run.recipe.rel_file,
            "recipe_digest": run.recipe.digest,
            "content": content,
            # The content without the report's files and the targets' verdicts: what decides
            # whether a build publishes a new version (versions.newest_same_model).
            "model": self.resolver.model_digest(run, run.outputs["publish"].files),
            "files": {f.path: f.hash for f in main},
            # Each file's size: `tpubuild verify` compares it before hashing (a file larger
            # than listed is refused unread) and downloads no more (publish/version_check.py).
            "sizes": {f.path: f.size for f in main},
            # Each target version `<recipe>/<target>/<N>/`: its files, build facts and verdict.
            **({"targets": {
                target: {"files": {rel: f.hash for rel, f in by_target[target]},
                         "sizes": {rel: f.size for rel, f in by_target[target]},
                         "build": run.outputs[stage].summary,
                         "verify": run.outputs[verdicts[target]].summary}
                for target, stage in targets.items()}} if targets else {}),
            "stages": [{"stage": name, "key": out.key, "output": out.tree}
                       for name, out in run.outputs.items() if name != "publish"],
            "inputs": run_inputs(run),
            # The same inputs by the digests in-toto consumers read (provenance/digests.py).
            "input_digests": dependency_digests(Path(run.recipe.root), run_inputs(run),
                                                {out.tree: out.files for out in run.outputs.values()},
                                                self.store.object_path),
            "toolchain": toolchain(),
            "tpubuild": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git_commit": git_commit(self.ws.root),
            "report": run.outputs["report"].summary if "report" in run.outputs else {},
        }

    # --- publish destinations -------------------------------------------------------
    def publish_destinations(self, runs: list[RecipeRun]) -> None:
        """Publish the newest local version of each recipe that built (or had nothing to
        do) to its `publish_to:` destination, unless this workspace noted that it holds that
        model already (publish/to_destination.py). A destination that fails is said in one
        line per recipe and not contacted again in this build; the local build stays."""
        import shutil

        from tpubuild.errors import TpubuildError
        from tpubuild.publish import (
            Destination,
            publish_version,
            read_manifest,
            recorded,
            remember,
        )

        scratch = Path(self.ws.state_dir) / "publish-scratch"
        down: set[str] = set()  # destinations that failed: not asked again in this build
        destinations: dict[str, Any] = {}
        for run in runs:
            url = getattr(run.recipe, "publish_to", None)
            if url is None or not run.succeeded or run.version is None:
                continue
            version_dir = Path(self.ws.output_dir) / run.name / str(run.version)
            model = (read_manifest(version_dir) or {}).get("model")
            if recorded(self.ws.state_dir, url, run.name, model):
                continue
            kept = f"{self.ws.display(version_dir)} is kept"
            if url in down:
                run.destination_error = f"{run.recipe.rel_file}: not published to {url} (it failed, said above); {kept}"
                self.errors(run.destination_error)
                continue
            if not destinations:
                shutil.rmtree(scratch, ignore_errors=True)  # a killed build's
                scratch.mkdir(parents=True, exist_ok=True)
            dest = destinations.setdefault(url, Destination(url, getattr(self.ws, "remote_timeouts", None)))
            labels = getattr(run.recipe, "version_labels", {}) or {}
            try:
                outcome = publish_version(
                    dest, run.name, version_dir, scratch, keep=self.ws.keep_versions, pinned=set(labels.values()),
                    attest=self._attest, file_hash=lambda path: self.stat.file_hash(os.fspath(path)),
                    say=self.errors)
            except TpubuildError as exc:  # DestinationError; RemoteSetupError: no backend installed
                line = (str(exc).splitlines() or [type(exc).__name__])[0]
                if getattr(exc, "unreachable", True):
                    down.add(url)
                run.destination_error = f"{run.recipe.rel_file}: not published: {line}; {kept}"
                self.errors(run.destination_error)
                continue
            except OSError as exc:  # the mount's own refusal the backend did not turn into a line
                down.add(url)
                what = f"{exc.strerror or type(exc).__name__}" + (f": {exc.filename}" if exc.filename else "")
                run.destination_error = f"{run.recipe.rel_file}: not published: publish_to {url}: {what}; {kept}"
                self.errors(run.destination_error)
                continue
            run.destination = outcome
            remember(self.ws.state_dir, url, run.name, model, outcome.number)
            for line in outcome.mended:
                self.notes(f"{run.name}: {line}")
            where = f"{outcome.url}/{outcome.number}"
            if outcome.new:
                self.notes(f"published: {run.name} -> {where}")
            else:
                self.notes(f"{run.name}: {where} holds this model already (nothing published there)")
            for number in outcome.pruned:
                self.notes(f"{run.name}: pruned {outcome.url}/{number} (keep_versions: {self.ws.keep_versions})")
        shutil.rmtree(scratch, ignore_errors=True)

    def write_lock(self, run: RecipeRun) -> None:
        path, document = run.recipe.lock_file, lock_for(run, self.stat, self.ws.file)
        # Keys the build's but a malformed or stale file (lock/shape.py): rewritten, said once.
        why = None if self.relock else rewrite_reason(path, self.ws.display, document)
        history = Path(self.ws.state_dir) / "lock-history" / f"{run.name}.json"
        if write_lock(path, document, force=self.relock or why is not None, history=history) and why is not None:
            self.errors(f"{run.recipe.rel_file}: rewrote {self.ws.display(path)}: {why}")


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
                       "measured": output_measured, **({"discovered": discovered} if discovered else {})})
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


def git_commit(root: Path) -> str | None:
    """The workspace's git HEAD, when it is a git checkout (recorded in the manifest)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def lock_problem(engine: Engine, run: RecipeRun, states: list[Any]) -> str | None:
    """Given a resolution whose every stage is cached: None when the lock file already
    records it, else why not. The no-op path and `build --check` share this."""
    from tpubuild.lock import lock_text, parse_lock_keys, same_keys

    publish = states[-1]
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
    return rewrite_reason(run.recipe.lock_file, engine.ws.display, document)


def up_to_date(engine: Engine, run: RecipeRun) -> bool:
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


def memo_files(engine: Engine, run: RecipeRun) -> list[str] | None:
    """Every file and directory the full no-op check of `run` read (lock/memo.py), or
    None when the recipe cannot be memoized (glob inputs, unknown recipe files)."""
    import glob

    from tpubuild.keys import stage_key

    recipe_files = getattr(run.recipe, "files", None)
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
    url = getattr(run.recipe, "publish_to", None)
    if url is not None:  # the note that the destination holds this model: absent, nothing is remembered
        from tpubuild.publish import record_path

        files.append(str(record_path(engine.ws.state_dir, url, run.name)))
    return files


def build(
    ws: Workspace,
    recipes: list[Any],
    jobs: int = 1,
    printer: Callable[[RecipeRun, Row], None] | None = None,
    errors: Callable[[str], None] | None = None,
    lock_wait: float = 3600.0,
    started: Callable[[RecipeRun, str], None] | None = None,
    memo: Any = None,
    since_ns: int | None = None,
    remote: tuple[str, bool] | None = None,
    keep_going: bool = False,
    relock: bool = False,
    planned: Callable[[list[RecipeRun]], None] | None = None,
    notes: Callable[[str], None] | None = None,
) -> tuple[list[RecipeRun], Engine]:
    """Build `recipes` under the workspace lock. With a NoopMemo, every recipe the full
    check finds up to date is remembered (if its files are older than `since_ns`). With
    `remote` (url, push), stages missing locally are looked up in that remote cache and
    stages built here are uploaded to it; a build with nothing to do never contacts it.
    `planned` is told the runs (each with its plan) before any stage is looked at. Each
    recipe with a `publish_to:` destination is then published there (`notes` is told
    what was), a no-op build's too unless the workspace noted the destination holds it."""
    from tpubuild.fs import WorkspaceLock

    engine = Engine(ws, jobs, printer, errors, started, notes)
    engine.keep_going = keep_going
    engine.relock = relock
    runs = new_runs(recipes)
    if planned is not None:
        planned(runs)
    lock = WorkspaceLock(ws.state_dir)
    lock.acquire(lock_wait, notify=engine.errors)
    try:
        todo = []
        for run in runs:
            if up_to_date(engine, run):
                if memo is not None and since_ns is not None:
                    files = memo_files(engine, run)
                    rows = [[row.stage, row.key] for row in run.rows]
                    if files is None or not memo.remember(run.recipe.file, run.name, rows, run.version, files, since_ns):
                        memo.forget(run.recipe.file)
            else:
                todo.append(run)
                if memo is not None:
                    memo.forget(run.recipe.file)
        if todo:
            from tpubuild.engine.tasks import run_tasks

            engine.store.session_dir()  # the cache lock (a deadline, a line naming who holds it); dead sessions go
            if remote is not None:
                engine.attach_remote(*remote)
            if engine.executor == "ray":  # checked and connected once: one error line, not one per stage
                engine.workers()
            clean = False
            try:
                run_tasks(engine, todo, jobs)
                clean = True
            finally:
                if engine.pool is not None:
                    engine.pool.close(kill=not clean)  # Ctrl-C: stop the stages now, not in 10 s
                engine.cache.finish(wait=clean)
                engine.finish_digests(wait=clean)
                if not clean and engine.pool is not None:  # what the lines printed so far point to
                    try:
                        _settle_logs(engine, todo)
                    except OSError:
                        pass  # the error on its way out is the one to say
            for run in todo:
                if run.failed or run.failed_targets:  # no lock file: it would describe a build that did not happen
                    _skip_rest(engine, run)
                elif len(run.outputs) < len(run.plan):  # doit itself failing is a bug; never success
                    run.error = f"{run.recipe.rel_file}: internal error: doit stopped before every stage ran"
                    engine.errors(run.error)
                    _skip_rest(engine, run)
                else:
                    engine.write_lock(run)
            if engine.pool is not None:
                _settle_logs(engine, todo)
        engine.publish_destinations(runs)
        # What each recipe's build used, measured keys included, for gc: a no-op build
        # opens the store's index only when that differs from what it registered last,
        # and one that cannot write it (a read-only shared cache) still succeeds.
        # An index another user of a shared cache made and this one cannot write is said
        # once (store/index.py); a full disk fails a build that wrote the cache (README).
        try:
            register_used(engine.store, ws, runs)
        except OSError as exc:
            if todo and not isinstance(exc, PermissionError):
                raise
            engine.store.index.unusable(exc)
        engine.stat.save()
    finally:
        engine.store.close()
        lock.release()
    return runs, engine


def _unexpected(exc: Exception) -> str:
    """An exception no stage expected: the machine's (a full disk, an I/O error: one line
    naming the path), else a bug in tpubuild."""
    from tpubuild.errors import environment_fault, fault_line

    fault = environment_fault(exc)
    return fault_line(fault) if fault is not None else f"internal error: {type(exc).__name__}: {exc}"


def _settle_logs(engine: Engine, runs: list[RecipeRun]) -> None:
    """Keep the worker logs failure messages of this build point to (workers/logs.py)."""
    from tpubuild.workers import WorkerPool, settle

    pool = engine.pool
    written = [worker.log_path for worker in pool.all] if isinstance(pool, WorkerPool) else []
    failed = {run.name for run in runs if run.failed or run.failed_targets}
    succeeded = {run.name for run in runs if run.name not in failed and len(run.outputs) == len(run.plan)}
    settle(engine.ws.state_dir / "logs", written, failed, succeeded)


def _skip_rest(engine: Engine, run: RecipeRun) -> None:
    done = {row.stage for row in run.rows}
    for planned in run.plan:
        if planned.name not in done:
            engine.row(run, Row(run.name, planned.name, "skipped", None, 0.0))


def _result(out: Output) -> dict[str, Any]:
    """What a later stage sees of an earlier one: its summary, with its warnings (the
    checks' findings) so the report can show them even when the stage was cached."""
    return {**out.summary, "warnings": list(out.warnings)} if out.warnings else out.summary


def _keyed(pending: Pending) -> tuple[str, dict[str, Any]]:
    """The key and key record of a stage about to run: a Pending without them (an input
    that could not be read) failed before it was run."""
    if pending.key is None or pending.record is None:
        raise StageError(pending.error or "the stage's inputs could not be read")
    return pending.key, pending.record
