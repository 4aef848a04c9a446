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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild import io_counters
from tpubuild.digests import StatCache, worker_env
from tpubuild.engine.beside import ReferenceBeside
from tpubuild.engine.cache import LayeredCache, LocalLayer, RemoteLayer
from tpubuild.engine.events import BuildEvents, Row, WorkerTime
from tpubuild.engine.history import failed_figures, record_attempts
from tpubuild.engine.lockdoc import memo_files, up_to_date, write_run_lock
from tpubuild.engine.options import BuildOptions
from tpubuild.engine.resolver import (
    Output,
    Pending,
    RecipeRun,
    Resolver,
    changed_inputs,
    new_runs,
    without_targets,
)
from tpubuild.engine.timeline import traced_planning, worker_ran
from tpubuild.engine.version import RunVersion
from tpubuild.errors import StageError
from tpubuild.keys import StageEntry
from tpubuild.pipeline import ENGINE_STEPS, TARGET_STAGES, PlannedStage, entry, spec
from tpubuild.store import Store
from tpubuild.store import register as register_used
from tpubuild.trace_events import span

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from tpubuild.config.recipe import Recipe
    from tpubuild.config.workspace import Workspace
    from tpubuild.remote import RemoteCache
    from tpubuild.workers import RayExecutor, WorkerPool

__all__ = ["BuildEvents", "BuildOptions", "Engine", "RecipeRun", "Row", "build", "new_runs"]

# An own-worker stage whose worker, kept after it, runs the recipe's next such stage:
# report after verify. Report makes the same CPU twin of the same input as verify (kept in
# the worker's scratch: tpu/twin.py cpu_twin) and saves a worker's TensorFlow import. Its
# peak in verify's worker, ResNet50 bf16 with TensorFlow imported without JAX
# (workers/lean_import.py): see benchmarks/real_models.py; the goal, 3x the model +
# TensorFlow's own, holds.
HANDOFF = {"verify": ("report",)}
# warmup runs no model (stages/warmup.py): a pool stage, before verify, in the transforms'
# worker, which it hands on to verify like the transform before it would. After verify, in
# its worker, it had peaked on top of the CPU twin kept for report (ResNet50 batched, issue
# 54: verify 987 MiB, warmup 1,026, the goal 964).
# Besides HANDOFF, a stage of the shared pool (tpu, bfloat16, io_shape: no `runs_models`)
# hands its worker on to the very next step of the plan when that step runs models (verify
# after io_shape): that stage then starts in a worker that has imported TensorFlow (and
# the recipe's op libraries) instead of a spare that imports it again beside the transforms.
# ResNet50 bf16, farm-bench medians of 3 cold builds: 13.6 s of CPU instead of 19.1, peak
# RSS 928 MiB instead of 912, under the goal of 3x the model + TensorFlow's own (957).


def _handoff_token(run: RecipeRun, stage: str) -> str:
    return f"{run.name}:{stage}"


class Engine(RunVersion):
    """Shared state of one command: workspace, store, stat cache, resolver, workers, events.
    A run's version and its publish are engine/version.py's (a mixin: the same state)."""

    def __init__(self, ws: Workspace, options: BuildOptions | None = None, events: BuildEvents | None = None):
        options = options or BuildOptions()
        events = events or BuildEvents()
        self.ws = ws
        self.jobs = options.jobs
        self.store = Store(ws.cache_dir)
        self.stat = StatCache(ws.state_dir / "statcache.json")
        self.resolver = Resolver(ws, self.store, self.stat)
        self.events = events
        self.printer, self.errors, self.started, self.notes = events.printer, events.errors, events.started, events.notes
        self.pool: WorkerPool | RayExecutor | None = None
        self.pool_lock = threading.Lock()
        self.state_lock = threading.RLock()  # resolver, stat cache and store index are shared by doit threads
        self.pending: dict[tuple[str, str], Pending] = {}
        self.keep_going = options.keep_going  # a failed target does not stop its recipe's publish
        self.relock = options.relock  # lock files rewritten with this machine's measured figures
        self.timeout = ws.stage_timeout
        self.link_type = ws.link_type
        self.executor = ws.executor  # or "ray": workers/ray.py
        from tpubuild.workers import own_worker_min_bytes

        self.own_worker_min = own_worker_min_bytes()  # a bad value stops the build before it starts
        self.remote: RemoteCache | None = None  # when the build has one
        # Where stage records are looked up, and built ones recorded (engine/cache.py).
        self.cache = LayeredCache([LocalLayer(self.resolver, self.state_lock)])
        # verify's source side, started beside the stages before it (engine/beside.py).
        self.beside = ReferenceBeside(self.store, self.jobs, self.executor, self.timeout, self.notes)
        # The thread that computes the standard digests of stored objects (_digests_ahead).
        self._ahead: ThreadPoolExecutor | None = None

    # --- the remote cache -----------------------------------------------------------
    def attach_remote(self, url: str, push: bool = True) -> None:
        """Use the remote cache at `url` for this build (imports fsspec and the backend)."""
        from tpubuild.digests import (
            key_id,
            load_public_key,
            signing_key_from_environment,
        )
        from tpubuild.remote import RemoteCache

        keys = [load_public_key(path, "remote_cache.trusted_keys") for path in self.ws.remote_trusted_keys]
        signing = signing_key_from_environment() if push else None
        remote = RemoteCache(url, push, report=self.errors, signing_key=signing,
                             trusted={key_id(key): key for key in keys}, timeouts=self.ws.remote_timeouts)
        self.remote = remote
        remote.connect()
        self.cache.layers.append(RemoteLayer(remote, self.resolver, self.state_lock, self.errors))

    def _digests_ahead(self, run: RecipeRun, entry: StageEntry) -> None:
        """Compute the in-toto digests of a stage's output objects now, in a thread, while
        the stages after it run in workers: publish needs them (provenance/digests.py
        compute_ahead: the source's for its dependencies, the artifact's for the subjects),
        and they are the same bytes' whenever they are read. One thread, in stage order:
        an object a later stage passes on unchanged is computed once."""
        from concurrent.futures import ThreadPoolExecutor

        from tpubuild.provenance.digests import compute_ahead, start_ahead

        with self.pool_lock:
            if self._ahead is None:
                start_ahead()
                self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpubuild-digests",
                                                 initializer=_in_the_background)
            self._ahead.submit(compute_ahead, entry.files, self.store.object_path, self.store.known_object)

    def finish_digests(self, wait: bool = True) -> None:
        """Stop the digests computed ahead: every version was published (publish read what
        they had not computed), so what is left is wanted by no one. The pass under way
        stops at its next chunk; `wait`, for it to end (it reads store objects)."""
        if self._ahead is not None:
            from tpubuild.provenance.digests import stop_ahead

            stop_ahead()
            self._ahead.shutdown(wait=wait, cancel_futures=True)
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
                    return self.publish_uptodate(run, start)
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
        if planned.name == "verify":
            self.beside.finish(run.name, self.pool)  # a prefetch for it, if one was started: not needed
        if self.pool is not None:  # a worker kept for this stage (HANDOFF, _hands_on): not needed
            from tpubuild.workers import WorkerPool

            if isinstance(self.pool, WorkerPool):  # the local executor's (Ray's: not one to keep)
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
            from tpubuild.workers import WorkerPool

            pool = self.workers()
            if isinstance(pool, WorkerPool):  # always, with the local executor
                pool.prestart()

    def _hands_on(self, planned: PlannedStage, upcoming: str, big: bool) -> bool:
        """Whether `planned`'s worker is kept for `upcoming`, the next step of the plan, a
        stage that runs models: verify's for report (HANDOFF, when verify has a worker of
        its own: `big`), and a pool stage's (no `runs_models`) for any (its own input may be
        under own_worker_min_bytes where the next one's is not: io_shape's bfloat16 model
        and verify's source)."""
        stage = spec(planned.name)
        if stage.runs_user_code:  # a fresh worker, closed after it
            return False
        if stage.runs_models:
            return big and upcoming in HANDOFF.get(planned.name, ())
        return True

    def _handed_a_worker(self, run: RecipeRun, name: str) -> bool:
        """Whether stage `name` will be handed the worker of the step before it, which is
        still to run (_hands_on), so needs no spare started for it."""
        if self.executor != "local":
            return False
        index = next(i for i, p in enumerate(run.plan) if p.name == name)
        before = next((p for p in reversed(run.plan[:index]) if p.name not in ENGINE_STEPS), None)
        if before is None or before.name in run.outputs:
            return False
        stage = spec(before.name)
        if stage.runs_user_code:
            return False
        return name in HANDOFF.get(before.name, ()) if stage.runs_models else True

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
            # What this thread reads and writes for the stage (its own counters: another
            # thread may store another recipe's stage meanwhile); a worker's are added.
            io_before = io_counters.read(io_counters.THREAD)
            if planned.name == "source":
                entry = self._snapshot_source(run, planned, pending)
                self._digests_ahead(run, entry)
                io = io_counters.since(io_before, io_counters.THREAD)
            elif planned.name == "publish":
                self.publish_version(run)
                self.row(run, Row(run.name, "publish", "built", self.resolver.publish_key(run, run.outputs["publish"].tree),
                                   time.monotonic() - start, io=io_counters.since(io_before, io_counters.THREAD)))
                return True
            else:
                entry, peak_rss, timing, worker_io = self._execute(run, planned, pending)
                io = io_counters.add(worker_io, io_counters.since(io_before, io_counters.THREAD))
                self._digests_ahead(run, entry)
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
                          peak_rss_bytes=peak_rss, worker_startup_seconds=timing.startup, io=io))
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
                 pending: Pending) -> tuple[StageEntry, int | None, WorkerTime, dict[str, int] | None]:
        """Run the stage in a worker and store its output; (entry, the worker's peak RSS in
        it, its time, what the worker read and wrote in it: io_counters). A StageError
        raised after the worker replied carries the time too."""
        stage = spec(planned.name)
        key, record = _keyed(pending)
        self.beside.start(run, planned, self.workers())  # verify's source side, if this stage comes before it
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
        handing = self.executor == "local"  # Ray: the next may run elsewhere
        # Only to the very next such stage: a worker kept idle while another stage's worker
        # runs would hold its memory beside that one.
        upcoming = next((p.name for p in later if p.name not in ENGINE_STEPS), None)
        if handing and wanting and wanting[0] == upcoming and self._hands_on(planned, upcoming, big):
            request["keep_for"] = _handoff_token(run, upcoming)
        if handing:  # a worker handed on to this stage, if one was (WorkerPool.run: else as before)
            request["take"] = _handoff_token(run, planned.name)
        reference_dir = self.beside.directory(run) if planned.name == "verify" else None
        if reference_dir is not None:
            request["reference_dir"] = str(reference_dir)
        # A stage that will be handed a worker needs no spare.
        wanting = [name for name in wanting if not self._handed_a_worker(run, name)]
        spare = big and bool(wanting)
        if self.executor == "ray":  # no driver paths reach a node: input trees, and what the key holds
            request["trees"] = {role: [[f.path, f.hash, f.size] for f in run.outputs[name].files]
                                for role, name in planned.consumes.items()}
            request["keyed"] = {field: record[field] for field in ("code", "toolchain", "env")}
            request["declared"] = {k[5:]: v for k, v in record["inputs"].items() if k.startswith("file:")}
        memory = self._memory_estimate(run, planned)
        try:
            asked = time.monotonic()
            reply = self.workers().run(request, self.timeout, Path(run.recipe.root) if stage.runs_user_code else None,
                                       spare=spare, memory=memory,
                                       waiting=lambda waits: self.events.waiting(run, planned.name, waits))
            worker_ran(run.name, planned.name, key, reply, asked, time.monotonic())  # build --profile's events
            timing = WorkerTime.of(reply, time.monotonic() - asked)
            if not reply["ok"]:
                failed_figures(run, planned.name, out_dir)  # verify's measured errors, for report --html
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
                stored = self.store.put(key, planned.name, out_dir, reply["summary"], reply["warnings"], record, self.stat,
                                        peak_memory=_peak(reply.get("peak_rss_bytes")))
            return stored, reply.get("peak_rss_bytes"), timing, reply.get("io")
        finally:
            self.store.remove_workdir(work)  # by descriptor, from the session's own
            if planned.name == "verify":
                self.beside.finish(run.name, self.pool)

    def _memory_estimate(self, run: RecipeRun, planned: PlannedStage) -> int:
        """The stage's estimated peak memory from its input model's size (StageSpec.memory);
        one that exceeds the machine's memory is said in one line before it starts, and runs
        anyway (the pool starts it once nothing else runs: workers/pool.py MemoryGate)."""
        from tpubuild.memory import total_memory_bytes
        from tpubuild.report.formats import human_bytes
        from tpubuild.stages.base import DATASET, ModelSizes

        stage = spec(planned.name)
        consumed = [(run.outputs[name].files, run.outputs[name].directory)
                    for role, name in planned.consumes.items() if role != DATASET]
        sizes = ModelSizes.for_estimate(stage.memory_estimate, consumed)
        if sizes is None and stage.runs_user_code:  # export: the model it made last time, once it made one
            earlier = self._earlier_output(run, planned.name)
            sizes = ModelSizes.of([earlier]) if earlier else None
        estimate = stage.memory_estimate.bytes(sizes)
        machine = total_memory_bytes()
        if machine is not None and estimate > machine and self.executor == "local":
            self.errors(f"{run.recipe.rel_file}: stage {planned.name}: warning: its memory estimate "
                        f"{human_bytes(estimate)} exceeds this machine's memory ({human_bytes(machine)}); "
                        "it runs anyway, when no other stage runs")
        return estimate

    def _earlier_output(self, run: RecipeRun, stage: str) -> list[Any] | None:
        """The files stage `stage` of `run` made in the build its lock file records, when
        the store still holds that record (a size to estimate by; None: not known)."""
        from tpubuild.lock import read_lock_keys

        recorded = read_lock_keys(run.recipe.lock_file) or {}
        key = next((s.get("key") for s in recorded.get("stages") or []
                    if isinstance(s, dict) and s.get("stage") == stage), None)
        if not isinstance(key, str):
            return None
        with self.state_lock:
            entry = self.store.get(key)
        return entry.files if entry is not None else None

    def workers(self) -> WorkerPool | RayExecutor:
        with self.pool_lock:
            if self.pool is None and self.executor == "ray":
                from tpubuild.workers import RayExecutor

                self.pool = RayExecutor(self.store, self.remote, self.ws.ray_address, self.ws.ray_resources,
                                        self.ws.state_dir / "logs")
            if self.pool is None:
                from tpubuild.workers import WorkerPool, next_index

                logs = self.ws.state_dir / "logs"
                self.pool = WorkerPool(self.jobs, logs, worker_env(), self.ws.worker_memory_limit,
                                       first=next_index(logs))
            return self.pool


def build(ws: Workspace, recipes: list[Recipe], options: BuildOptions | None = None,
          events: BuildEvents | None = None) -> tuple[list[RecipeRun], Engine]:
    """Build `recipes` under the workspace lock (`options`: engine/options.py). Each recipe
    the full check finds up to date is remembered in `options.memo`; stages missing locally
    are looked up in `options.remote`, a build with nothing to do never contacting it.
    `events.planned` is told the runs (each with its plan) before any stage is looked at.
    Each recipe with a `publish_to:` destination is then published there (`events.notes`
    is told what was), a no-op build's too unless the workspace noted the destination
    holds it."""
    from tpubuild.fs import WorkspaceLock

    options = options or BuildOptions()
    events = events or BuildEvents()
    engine = Engine(ws, options, events)
    started = time.time()
    memo, since_ns = options.memo, options.since_ns
    runs = new_runs(recipes)
    events.planned(runs)
    lock = WorkspaceLock(ws.state_dir)
    lock.acquire(options.lock_wait, notify=engine.errors)
    try:
        todo = []
        for run in runs:
            if traced_planning(up_to_date, engine, run):
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
            if options.remote is not None:
                engine.attach_remote(*options.remote)
            if engine.executor == "ray":  # checked and connected once: one error line, not one per stage
                engine.workers()
            clean = False
            try:
                run_tasks(engine, todo, options.jobs)
                clean = True
            finally:
                engine.beside.close(engine.pool)  # prefetches whose verify was cached or never ran
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
                    with span(f"{run.name}: lock file", cat="work", recipe=run.name):
                        write_run_lock(engine, run)
            if engine.pool is not None:
                _settle_logs(engine, todo)
            record_attempts(ws, todo, started)  # each recipe's build, for report --html (engine/history.py)
        with span("publishing to destinations", cat="publish"):
            engine.publish_destinations(runs)
        # What each recipe's build used, measured keys included, for gc: a no-op build
        # opens the store's index only when that differs from what it registered last,
        # and one that cannot write it (a read-only shared cache) still succeeds.
        # An index another user of a shared cache made and this one cannot write is said
        # once (store/index.py); a full disk fails a build that wrote the cache (README).
        try:
            with span("registering the keys used in the store's index", cat="work"):
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


def _in_the_background() -> None:
    """The calling thread at the lowest CPU priority (Linux: a thread's nice value is its
    own, setpriority on its thread id): the digests computed ahead take what the stages'
    workers leave of the cores, instead of a share of them (issue 54: an 8 GiB source's
    SHA-256, ~5 s of a core, ran beside bfloat16's cast on this 2-core machine)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # another system: the thread runs at the process's priority
        pass


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


def _peak(value: Any) -> int | None:
    """A worker's measured peak RSS as its reply says it (None: not measured)."""
    return value if isinstance(value, int) and value > 0 else None


def _keyed(pending: Pending) -> tuple[str, dict[str, Any]]:
    """The key and key record of a stage about to run: a Pending without them (an input
    that could not be read) failed before it was run."""
    if pending.key is None or pending.record is None:
        raise StageError(pending.error or "the stage's inputs could not be read")
    return pending.key, pending.record
