"""verify's source side, started beside the stages before verify (verify/reference.py).

With the local executor and `-j 1`, a recipe's stages run one at a time, and the transforms
before verify (tpu, bfloat16, io_shape) are graph edits that keep one core busy. verify then
loads and runs two models, the source and the artifact, on every sample: for a large model
most of the build (BERT-base with tensorflow_text, issue 48: 9.2 s of 20.7). The source's
half needs only the source and verify's samples, both there before the first transform:
so when the first stage after the source starts, a worker of its own (outside `-j`'s
slots) loads the source and runs it on verify's samples, on the core the transforms leave
idle, and verify is handed the directory it writes (`reference_dir`).

Only where it pays and fits: a second CPU; a source of REFERENCE_BESIDE_MIN_BYTES or more
(below, TensorFlow's own start-up and per-model memory cost more than the run saves); `-j 1`
(with more jobs, the other cores run stages); and memory for it. The worker is a second
process holding a loaded model while the stage beside it runs, so it starts only when the
machine's available memory (memory.py available_memory_bytes, /proc/meminfo MemAvailable or
TPUBUILD_MEMORY_AVAILABLE) holds both, with a margin: beside_bytes for the worker, the
largest estimate of the stages it runs beside (StageSpec.memory, what the pool's memory gate
counts), and MEMORY_MARGIN. Else verify computes the source's outputs itself, one model at a time
(stages/verify.py), and the build's output says why. The knob
TPUBUILD_REFERENCE_BESIDE_MIN_BYTES moves the size (tests set 0); neither knob changes an
output, so no key: verify uses the outputs only when they are for exactly its own samples,
and runs the source itself otherwise.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpubuild.pipeline import ENGINE_STEPS, PlannedStage, spec
from tpubuild.stages.base import MODEL, SOURCE

if TYPE_CHECKING:
    from tpubuild.engine.resolver import RecipeRun
    from tpubuild.store import Store
    from tpubuild.workers import RayExecutor, WorkerPool

VERIFY = "verify"
ENTRY = "tpubuild.stages.verify:prefetch_reference"
REFERENCE_BESIDE_ENV = "TPUBUILD_REFERENCE_BESIDE_MIN_BYTES"


@dataclass
class _Started:
    workdir: Path
    future: Future[None]
    token: str

    @property
    def directory(self) -> Path:
        return self.workdir / "out"


# From this size of source on, the prefetch pays (BERT-base, 420 MiB, issue 48: verify 9.2 s
# of a 20.7 s build); below, TensorFlow's start-up in one more process costs about what it
# saves. Issue 54, benchmarks/real_models.py on 2 cores, ResNet50 (100 MiB) with and without
# it in one session: its bf16 recipe (8 samples) 16.7 s wall against 18.3 s, build peak RSS
# 883 MiB against 933 (verify loads no source), CPU 25.1 s against 19.2; its batched recipe
# (16 samples) 18.1 s against 22.0 s, verify 6.8 s against 10.7. So from 64 MiB on, where a
# model's verify runs in a worker of its own (workers/pool.py OWN_WORKER_MIN_BYTES) too.
REFERENCE_BESIDE_MIN_BYTES = 64 * 2**20

# The worker's peak: a process that imported TensorFlow, loaded the source and ran it on
# verify's samples one at a time. Measured (VmHWM of a fresh process after `import
# tensorflow`, then after tf.saved_model.load and the samples' calls; size on disk):
# ResNet50 (100 MiB): 809 MiB, then 1,057 MiB; BERT-base with tensorflow_text (419 MiB):
# 926 MiB, then 1,521 MiB; and the worker's max RSS in benchmarks/large_models.py (issue
# 54, dense stacks, 8 samples): 2 GiB source 2,689 MiB, 8 GiB source 8,915 MiB. So the
# loaded model counts once (restore reads each tensor into its variable), plus what its
# runs allocate: up to 1.5x a small model (ResNet50's activations, +148 MiB) and no more
# than 512 MiB measured at any size (BERT +176 MiB, the dense stacks +-0.3 GiB). The
# earlier 2.5x the model was ResNet50's ratio applied to every size: 6,070 MiB for a 2 GiB
# source that took 2,689, which kept the worker from starting where it fits.
TF_BASELINE_BYTES = 950 * 2**20
RUN_FACTOR = 1.5
RUN_CAP_BYTES = 512 * 2**20
# Above both estimates: what the estimates miss, and the page cache the kernel would have to
# give back (MemAvailable counts it as available).
MEMORY_MARGIN = 1024 * 2**20


def beside_bytes(source_bytes: int) -> int:
    """The peak memory of the worker that runs the source beside the transforms."""
    return int(TF_BASELINE_BYTES + source_bytes + min(RUN_FACTOR * source_bytes, RUN_CAP_BYTES))


def beside_fits(source_bytes: int, available: int | None, running_bytes: int) -> tuple[bool, str]:
    """Whether the worker fits beside the stages it runs beside, the largest of whose own
    estimates (StageSpec.memory) is `running_bytes`, and the line that says so."""
    worker = beside_bytes(source_bytes)
    needed = worker + running_bytes + MEMORY_MARGIN
    mib = 2**20
    if available is None:
        return False, "the machine's available memory is unknown (no /proc/meminfo; TPUBUILD_MEMORY_AVAILABLE)"
    said = (f"{available / mib:,.0f} MiB available, {needed / mib:,.0f} MiB needed (the worker ~{worker / mib:,.0f} "
            f"MiB, the stages beside it up to ~{running_bytes / mib:,.0f} MiB, a margin of {MEMORY_MARGIN / mib:,.0f} MiB)")
    return available >= needed, said


class ReferenceBeside:
    """The prefetches of one build, by recipe name."""

    def __init__(self, store: Store, jobs: int, executor: str, timeout: float | None,
                 notes: Callable[[str], None] | None = None):
        from tpubuild.memory import available_memory_bytes
        from tpubuild.workers import bytes_knob

        self.store = store
        self.timeout = timeout
        self.notes = notes or (lambda line: None)
        self.min_bytes = bytes_knob(REFERENCE_BESIDE_ENV, REFERENCE_BESIDE_MIN_BYTES)  # a bad value: said at start
        available_memory_bytes()  # a bad TPUBUILD_MEMORY_AVAILABLE: said at start too
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.enabled = executor == "local" and jobs == 1 and cpus >= 2
        self.started: dict[str, _Started | None] = {}  # None: decided not to start
        self.lock = threading.Lock()
        self.threads: ThreadPoolExecutor | None = None

    def start(self, run: RecipeRun, planned: PlannedStage, pool: WorkerPool | RayExecutor) -> None:
        """Start the prefetch for `run` if `planned` is a stage before its verify, verify is
        still to come, and its source and the other inputs verify reads besides the model
        are there (a dataset stage's output)."""
        if not self.enabled or run.name in self.started:
            return
        verify = next((p for p in run.plan if p.name == VERIFY), None)
        if verify is None or VERIFY in run.outputs or planned.name in ENGINE_STEPS \
                or run.plan.index(planned) >= run.plan.index(verify):
            return
        roles = {role: name for role, name in verify.consumes.items() if role != MODEL}
        if SOURCE not in roles or any(name not in run.outputs for name in roles.values()):
            return
        source_bytes = sum(f.size for f in run.outputs[roles[SOURCE]].files)
        if source_bytes < self.min_bytes:
            return
        from tpubuild.workers import WorkerPool, stage_request

        if not isinstance(pool, WorkerPool):
            return
        from tpubuild.memory import available_memory_bytes

        # The worker runs beside every stage from this one to verify: the largest of their
        # own estimates (StageSpec.memory), each from the source's sizes (no stage before
        # verify makes a model larger than its input: graph edits, a cast to half the bytes).
        from tpubuild.stages.base import ModelSizes

        source = run.outputs[roles[SOURCE]]
        between = [spec(p.name).memory_estimate for p in run.plan[run.plan.index(planned):run.plan.index(verify)]
                   if p.name not in ENGINE_STEPS]
        running_bytes = max(estimate.bytes(ModelSizes.for_estimate(estimate, [(source.files, source.directory)]))
                            for estimate in between)
        fits, said = beside_fits(source_bytes, available_memory_bytes(), running_bytes)
        if not fits:
            self.started[run.name] = None  # decided for this build: verify runs the source itself
            self.notes(f"{run.name}: verify's source side does not run beside the earlier stages: {said}; "
                       "verify runs it, one model at a time")
            return
        self.notes(f"{run.name}: verify's source side runs beside the earlier stages: {said}")
        workdir = self.store.new_workdir("verify-reference")
        directory = workdir / "out"
        directory.mkdir()
        request = stage_request(ENTRY, VERIFY, str(run.recipe.root), str(directory), verify.options,
                                {role: str(run.outputs[name].directory) for role, name in roles.items()}, {})
        token = f"{run.name}:{VERIFY}:reference"
        with self.lock:
            if self.threads is None:
                self.threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tpubuild-reference")
            future = self.threads.submit(self._prefetch, pool, request, directory, token)
            self.started[run.name] = _Started(workdir, future, token)

    def _prefetch(self, pool: WorkerPool, request: dict[str, Any], directory: Path, token: str) -> None:
        """Run the prefetch; whatever ends it without its result, FAILED says so, for verify
        waits for one or the other (verify/reference.py take)."""
        from tpubuild.atomic import write_atomic
        from tpubuild.verify.reference import DONE, ENDED, FAILED

        why = "stopped"
        try:
            reply = pool.run_beside(request, self.timeout, token)
            why = "" if reply.get("ok") else str(reply.get("error"))
        except BaseException as exc:  # noqa: BLE001 - verify runs the source itself; the worker's log says why
            why = f"{type(exc).__name__}: {exc}"
        finally:
            # run_beside has closed its worker by now, whatever ended it: ENDED says so to
            # verify, which loads its models only then (verify/reference.py wait_ended).
            try:
                if not (directory / DONE).exists():
                    write_atomic(directory / FAILED, (why or "no result").encode())
                write_atomic(directory / ENDED, b"")
            except OSError:
                pass  # the directory is gone: its verify has ended

    def directory(self, run: RecipeRun) -> Path | None:
        """The directory handed to verify (request `reference_dir`), when one was started."""
        started = self.started.get(run.name)
        return None if started is None else started.directory

    def finish(self, run_name: str, pool: WorkerPool | RayExecutor | None) -> None:
        """verify ended, or will not run: stop the prefetch if it still runs, remove its directory."""
        started = self.started.pop(run_name, None)
        if started is None:
            return
        from tpubuild.workers import WorkerPool

        if isinstance(pool, WorkerPool):
            pool.stop_beside(started.token)
        started.future.result()  # it never raises (_prefetch); FAILED is written by now
        try:
            self.store.remove_workdir(started.workdir)
        except OSError:
            pass  # the session's directory goes with the session (store/sessions.py)

    def close(self, pool: WorkerPool | RayExecutor | None) -> None:
        """The build ends: every prefetch whose verify was cached or never ran."""
        for name in list(self.started):
            self.finish(name, pool)
        if self.threads is not None:
            self.threads.shutdown(wait=True)
