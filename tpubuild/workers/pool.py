"""Worker processes that run stages: each imports TensorFlow once and runs many stages.

The protocol is one JSON line per request on the worker's stdin and one per reply on a
private copy of its stdout; what stages print goes to the worker's log file instead.
A reply's `seconds` is the stage's own work, timed here without TensorFlow's import
(workers/import_clock.py): the engine reports the rest of its wait as worker start-up.
A worker exits when its parent dies (stdin EOF, and PR_SET_PDEATHSIG on Linux), so a
killed build leaves no stage running behind it.

With `-j N`, a stage starts only while the memory estimates of the stages running fit
the memory available (MemoryGate; each stage's estimate is its StageSpec's, from its input
model's size), and always when nothing else runs.

Workers get a scrubbed environment (keys.worker_env): only what is in every stage key,
plus what a process needs to start. Stages that run user code (export scripts,
dataset generators) get a fresh worker for each run, which records the workspace
modules the user code imports (workers/import_record.py) and then exits.
"""

from __future__ import annotations

import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.handoff import WORKER_SCRATCH
from tpubuild.workers.process import (
    MEMORY_LIMIT_FLAG,
    PREIMPORT,
    PRELOAD_LIBRARIES,
    gib,
)


def stage_request(entry: str, stage: str, workspace: str, output_dir: str, options: dict[str, Any],
                  inputs: dict[str, str], results: dict[str, Any]) -> dict[str, Any]:
    """The request a worker runs (JSON on its stdin): the one place its fields are made,
    for the local engine and for Ray nodes alike. `input_dir` is the consumed model
    (role `model`), else the workspace root (stages that start from nothing)."""
    return {
        "entry": entry,
        "stage": stage,
        "workspace": workspace,
        "input_dir": inputs.get("model", workspace),
        "output_dir": output_dir,
        "options": options,
        "inputs": inputs,
        "results": results,
    }


# A stage that loads and runs models (StageSpec.runs_models) reading this much or more runs
# in a worker of its own, closed after it. TensorFlow keeps part of everything a process
# loaded (the functions registered with its runtime, by verify's and report's model loads
# and by the XLA checks of tpu, bfloat16 and io_shape), which neither gc nor malloc_trim
# returns: ~200 MiB after ResNet50's stages, and a stage loading models peaked on top of
# it (ResNet50 bf16: report after verify in one worker 908 MiB, in its own 782; verify
# after io_shape 874, in its own 833; the goal, 3x the model + TF's own, is 844). The price
# is one TensorFlow import (~3 s) per such stage: worth it for models of this size, not
# for small ones, whose leftovers are a few MiB (200 small recipes would pay ~600 imports).
# One exception, report after verify (engine/loop.py HANDOFF): measured again with
# TensorFlow imported without JAX (workers/lean_import.py, 110 MiB less per worker), report
# peaks at 898 MiB in verify's worker (788 in its own), under the goal (957 in that run).
# And the first such stage is handed the worker of the pool stage before it (verify after
# io_shape: engine/loop.py _hands_on): the transforms load no model to run and leave less
# behind, and the spare's second TensorFlow import beside them is saved (ResNet50 bf16,
# farm-bench medians of 3 cold builds: 13.6 s of CPU instead of 19.1, build peak 928 MiB
# instead of 912, the goal 957).
OWN_WORKER_MIN_BYTES = 64 * 2**20
OWN_WORKER_ENV = "TPUBUILD_OWN_WORKER_MIN_BYTES"


def own_worker_min_bytes() -> int:
    """OWN_WORKER_MIN_BYTES, or TPUBUILD_OWN_WORKER_MIN_BYTES (a scheduling knob: which
    worker runs a stage changes no output)."""
    return bytes_knob(OWN_WORKER_ENV, OWN_WORKER_MIN_BYTES)


def bytes_knob(name: str, default: int) -> int:
    """A scheduling knob in bytes from the environment variable `name`, else `default`; a
    value that is not a whole number of bytes is an error, not a silent default."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        from tpubuild.errors import UsageError

        raise UsageError(f"{name}={value!r}: expected a whole number of bytes (default {default})")
    return int(value)


class StageTimeout(StageError):
    pass


class MemoryGate:
    """Starts a stage only while the memory estimates of the stages running fit the memory
    available (StageSpec.memory_estimate). Free memory is the kernel's MemAvailable read
    now, less what each running stage is estimated to take still (its estimate less its
    worker's resident set now: what it already holds, MemAvailable has already counted).
    With TPUBUILD_MEMORY_AVAILABLE (tpubuild/memory.py), that figure stands for what was
    available at the build's start, read once: less every running stage's whole estimate.
    A stage always starts when nothing runs (progress); one that waits is told
    (`waiting(True)` once, `waiting(False)` when it starts) and is re-checked every
    POLL_SECONDS, memory the rest of the machine frees counting too."""

    POLL_SECONDS = 0.5

    def __init__(self) -> None:
        from tpubuild.memory import memory_override

        self.fixed = memory_override()  # the knob: a bad value stops the build before it starts
        self.cond = threading.Condition()
        self.running: dict[int, list[Any]] = {}  # id -> [estimate, the worker's pid or None]
        self.next_id = 0

    def free(self) -> int | None:
        """The memory a stage may start into now (the condition held); None: unknown."""
        from tpubuild.memory import available_memory_bytes, process_rss_bytes

        if self.fixed is not None:
            return self.fixed - sum(estimate for estimate, _ in self.running.values())
        available = available_memory_bytes()
        if available is None:
            return None
        still = 0
        for estimate, pid in self.running.values():
            held = process_rss_bytes(pid) if pid is not None else None
            still += max(0, estimate - (held or 0))
        return available - still

    def enter(self, estimate: int, waiting: Any = None) -> int:
        """Wait until a stage estimated at `estimate` bytes fits; its id, for started/leave."""
        from tpubuild.trace_events import waiting as traced_wait

        with self.cond:
            told = False
            with traced_wait("memory", estimate=estimate):  # build --profile's event
                while self.running:
                    free = self.free()
                    if free is None or estimate <= free:
                        break
                    if not told and waiting is not None:
                        waiting(True)
                        told = True
                    self.cond.wait(self.POLL_SECONDS)
            ident = self.next_id
            self.next_id += 1
            self.running[ident] = [estimate, None]
        if told:
            waiting(False)
        return ident

    def started(self, ident: int, pid: int) -> None:
        with self.cond:
            if ident in self.running:
                self.running[ident][1] = pid

    def leave(self, ident: int) -> None:
        with self.cond:
            self.running.pop(ident, None)
            self.cond.notify_all()


def loaded_libraries(request: dict[str, Any]) -> tuple[str, ...] | None:
    """What a stage's op_libraries leave registered in its worker: the installed modules
    (name and version, fixed for a build), or None when a `.so` is among them (its file may
    change between two stages, so that worker is never reused)."""
    entries = request["options"].get("op_libraries") or []
    if any("module" not in entry for entry in entries):
        return None
    return tuple(sorted(json.dumps(entry, sort_keys=True) for entry in entries))


class WorkerPool:
    """At most `size` workers, started lazily: a build where everything is cached starts none."""

    def __init__(self, size: int, log_dir: Path, env: dict[str, str], memory_limit: int | None = None,
                 first: int = 0):
        self.size = max(1, size)
        self.log_dir = log_dir
        self.first = first  # the first worker's number: logs of earlier builds are never overwritten
        self.env = env
        self.memory_limit = memory_limit  # bytes of address space per worker (RLIMIT_AS), None: none
        self.idle: queue.Queue[Worker] = queue.Queue()
        self.slots = threading.Semaphore(self.size)
        self.lock = threading.Lock()
        self.all: list[Worker] = []
        self.spare: Worker | None = None  # a worker that imported TensorFlow and ran nothing
        # Own workers an earlier stage handed on (request `keep_for`), by the token of the
        # stage that takes it (request `take`); closed with the pool if none does.
        self.kept: dict[str, Worker] = {}
        self.spare_lock = threading.Lock()
        self.beside: dict[str, Worker] = {}  # run_beside's workers, by token
        self.memory = MemoryGate()

    def run(self, request: dict[str, Any], timeout: float | None, fresh_in: Path | None = None,
            spare: bool = False, memory: int = 0, waiting: Any = None) -> dict[str, Any]:
        """Run one stage; `fresh_in` (the workspace) asks for a fresh worker that records
        the workspace modules the stage imports and exits afterwards. `own_worker` (a
        `runs_models` stage reading own_worker_min_bytes() or more) asks for a worker of its
        own, closed after it. `spare`: a later stage of this recipe will want a worker of
        its own; one is started now, beside this stage (see _take_spare). `memory`: the
        stage's estimated peak in bytes; it starts once that fits (MemoryGate), `waiting`
        told while it waits."""
        libraries = loaded_libraries(request)
        with self.slots:
            admitted = self.memory.enter(memory, waiting)
            try:
                return self._run(request, timeout, fresh_in, spare, libraries, admitted)
            finally:
                self.memory.leave(admitted)

    def _run(self, request: dict[str, Any], timeout: float | None, fresh_in: Path | None, spare: bool,
             libraries: tuple[str, ...] | None, admitted: int) -> dict[str, Any]:
        if fresh_in is not None:
            worker = self._fresh(fresh_in)
        elif request.get("own_worker"):
            # Nothing of an earlier stage under its peak: a spare has imported
            # TensorFlow and run nothing. Or the worker an earlier stage handed on.
            worker = self._take_kept(request.get("take"), libraries) or self._take_spare(libraries) \
                or self._new(self.env)
        else:  # the worker an earlier stage handed on to this one, else any idle one
            worker = self._take_kept(request.get("take"), libraries) or self._acquire(libraries)
        if spare:  # for a later stage of the same recipe: the same op libraries (pipeline.plan)
            self._start_spare(request["options"].get("op_libraries") or [])
        self.memory.started(admitted, worker.proc.pid)
        try:
            reply = worker.call(request, timeout)
        except BaseException:
            worker.kill()
            raise
        reply["log"] = str(worker.log_path)  # where a failure's traceback is
        if request.get("keep_for") and reply.get("ok") and reply.get("reusable", True) and libraries is not None:
            worker.libraries = libraries
            with self.lock:
                self.kept[request["keep_for"]] = worker
        elif fresh_in is not None or libraries is None or not reply.get("reusable", True) \
                or request.get("own_worker"):
            worker.close()
        else:
            worker.libraries = libraries
            self.idle.put(worker)
        return reply

    def _new(self, env: dict[str, str]) -> Worker:
        with self.lock:
            worker = Worker(self.log_dir / f"worker-{self.first + len(self.all)}.log", env, self.memory_limit)
            self.all.append(worker)
            return worker

    def _start_spare(self, libraries: list[dict[str, str]] | None = None) -> None:
        """Start a worker that imports TensorFlow and waits, unless one is waiting already.
        A stage of its own worker would otherwise begin with TensorFlow's import (~2.5 s on
        2 cores, as long as the load of a 100 MB model); started while the stages before it
        run, the import is done when that stage comes. At most one spare: with more stages
        of their own at once, the others start theirs. `libraries`: the op libraries the
        stage it is for loads, loaded too (tensorflow_text: 0.2 s); only module entries
        (loaded_libraries), and only a stage loading the same ones takes it (_take_spare)."""
        entries = libraries or []
        preload = loaded_libraries({"options": {"op_libraries": entries}})
        with self.spare_lock:  # two stages asking at once (-j) start one spare
            if self.spare is not None and self.spare.proc.poll() is None:
                return
            env = {PREIMPORT: "tensorflow", **({PRELOAD_LIBRARIES: json.dumps(entries)} if entries and preload else {})}
            worker = self._new(dict(self.env, **env))
            worker.libraries = preload if entries and preload else ()
            with self.lock:
                self.spare = worker

    def _take_spare(self, libraries: tuple[str, ...] | None) -> Worker | None:
        """The spare, if it loaded no op libraries or exactly `libraries` (registered ops
        stay registered: WorkerPool._acquire); else it waits for a stage that does."""
        with self.lock:
            worker = self.spare
            if worker is None or worker.libraries not in ((), libraries):
                return None
            self.spare = None
        if worker.proc.poll() is not None:  # it died waiting: its log says why
            worker.close()
            return None
        return worker

    def _take_kept(self, token: str | None, libraries: tuple[str, ...] | None) -> Worker | None:
        """The worker handed on for `token`, if it is alive and loaded the same op libraries."""
        worker = self.release(token, close=False)
        if worker is not None and (worker.proc.poll() is not None or worker.libraries != libraries):
            worker.close()
            return None
        return worker

    def release(self, token: str | None, close: bool = True) -> Worker | None:
        """Take back the worker handed on for `token` (closed, when no stage will take it)."""
        if token is None:
            return None
        with self.lock:
            worker = self.kept.pop(token, None)
        if worker is not None and close:
            worker.close()
            return None
        return worker

    def _fresh(self, workspace: Path) -> Worker:
        """A worker that records the imports of user code (workers/import_record.py compiles the
        recorded modules from source; installed packages keep their bytecode caches)."""
        return self._new(dict(self.env, TPUBUILD_RECORD_IMPORTS=str(workspace)))

    def _acquire(self, libraries: tuple[str, ...] | None) -> Worker:
        """An idle worker that has loaded exactly `libraries` (or none yet), else a new one.
        A worker's registered ops stay registered: one that loaded other libraries must not
        run this stage (it could succeed there and fail in a fresh worker), so it is closed
        to make room instead."""
        with self.lock:
            waiting = []
            while True:
                try:
                    waiting.append(self.idle.get_nowait())
                except queue.Empty:
                    break
            alive = [w for w in waiting if w.proc.poll() is None]
            match = next((w for w in alive if w.libraries == libraries), None) or \
                next((w for w in alive if w.libraries == ()), None)
            others = [w for w in alive if w is not match]
            if match is None and others:
                others.pop(0).close()
            for worker in others:
                self.idle.put(worker)
        # Else a spare (prestart): it imported TensorFlow and ran nothing, as a new one would.
        return match if match is not None else (self._take_spare(libraries) or self._new(self.env))

    def prestart(self) -> None:
        """Start a spare now, for the first stage that will want a worker: a cold build's
        first worker would otherwise import TensorFlow only when that stage comes (after
        the source is hashed and copied into the store); started first, the import runs
        beside that work. _acquire and own workers take it; a build that then needs no
        worker kills it at close."""
        self._start_spare()

    def run_beside(self, request: dict[str, Any], timeout: float | None, token: str) -> dict[str, Any]:
        """Run one request in a new worker of its own, outside the `size` slots (work a
        later stage will want, done on a core the stages leave idle: engine/beside.py),
        closed after it; `stop_beside(token)` kills it sooner."""
        worker = self._new(self.env)
        with self.lock:
            self.beside[token] = worker
        try:
            return worker.call(request, timeout)
        except BaseException:
            worker.kill()
            raise
        finally:
            with self.lock:
                self.beside.pop(token, None)
            worker.close()

    def stop_beside(self, token: str) -> None:
        """Kill the worker of run_beside(token) if it still runs: its work is not wanted."""
        with self.lock:
            worker = self.beside.get(token)
        if worker is not None:
            worker.kill()

    def close(self, kill: bool = False) -> None:
        for worker in self.all:
            # A spare ran nothing: stopped now, not waited for while it imports TensorFlow.
            worker.kill() if kill or worker is self.spare else worker.close()


def last_words(log_path: Path, stage: str, tail: int = 64 * 1024) -> str | None:
    """The telling line (telling.py) of what a dead worker wrote while running `stage`."""
    from tpubuild.telling import telling_line

    try:
        with open(log_path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - tail))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    marker = text.rfind(f"--- stage {stage} ")
    if marker >= 0:  # what this stage wrote, after its marker line
        text = text[marker:].partition("\n")[2]
    crash = _CRASH.search(text)  # the worker dies at its first
    if crash is None:
        return telling_line(text)
    # Native code that aborts says why first (LLVM ERROR, a failed CHECK): that line, then
    # where faulthandler saw the crash.
    told, site = telling_line(text[:crash.start()]), crash_site(crash, text)
    return f"{told} ({site})" if told else site


_CRASH = re.compile(r"^Fatal Python error: (.+)$", re.MULTILINE)
_FRAME = re.compile(r'^  File "(.+)", line (\d+) in (\S+)$')


def crash_site(found: re.Match[str], text: str) -> str:
    """What faulthandler wrote when native code crashed the worker (workers/process.py
    enables it), its "Fatal Python error" line `found` in `text`: the error and the Python
    frame it happened in, with the innermost frame of tpubuild's own when that is another
    (the stage step that called into the crash)."""
    after = text[found.end():]
    current = after.find("Current thread ")
    lines = after[current:].splitlines()[1:] if current >= 0 else []
    frames = [m.groups() for m in map(_FRAME.match, lines) if m]
    if not frames:
        return found.group(1)

    def where(frame: tuple[str, ...]) -> str:
        return f"{frame[2]} ({frame[0]}:{frame[1]})"

    said = f"{found.group(1)} in {where(frames[0])}"
    own = next((f for f in frames if f"{os.sep}tpubuild{os.sep}" in f[0]), None)
    if own is not None and own != frames[0]:
        said += f", called from {where(own)}"
    return said


class Worker:
    def __init__(self, log_path: Path, env: dict[str, str], memory_limit: int | None = None):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.memory_limit = memory_limit
        self.cleanup: list[str] = []
        self.libraries: tuple[str, ...] = ()  # the op_libraries this worker has loaded (registered ops stay)
        # A private, empty directory as working directory and HOME, and `-P`: the directory
        # the build was started from is not on the worker's sys.path, so a `json.py` or
        # `helper.py` there is never imported (unkeyed, and someone else's code), and no
        # stage reads the user's home (Keras's ~/.keras/keras.json sets floatx and the
        # backend at import; TF and pip read config files there): nothing unkeyed. User code
        # gets the paths it is due from its stage (stages/export.py, stages/dataset.py).
        self.home = Path(tempfile.mkdtemp(prefix=f"{log_path.stem}-home-", dir=log_path.parent))
        self.cleanup.append(str(self.home))  # the worker's scratch, gone with the worker
        env = {**env, "HOME": str(self.home), WORKER_SCRATCH: str(self.home)}
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # 3.10: the empty cwd is all
        with open(log_path, "wb") as log:  # the log of this build's worker only
            self.proc = subprocess.Popen(
                [sys.executable, *safe_path, "-m", "tpubuild.workers.process",
                 *([MEMORY_LIMIT_FLAG, str(memory_limit)] if memory_limit else [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=self.home,
                # Its own process group: a stage timeout kills the stage and its children.
                start_new_session=True,
            )

    def call(self, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        # Wait in steps of a second, with or without a deadline: a Ctrl-C that the kernel
        # delivers to another thread of this process (blake3's hashing threads, the upload
        # pool) does not interrupt a blocking read of the main thread, but Python runs
        # its handler (KeyboardInterrupt) as soon as the main thread wakes.
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.kill()
                raise StageTimeout(
                    f"timed out after {timeout:g} s (stage_timeout); the worker was killed, see {self.log_path}"
                )
            ready, _, _ = select.select([fd], [], [], 1.0 if left is None else min(left, 1.0))
            if ready:
                break
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            cause = last_words(self.log_path, request["stage"]) or _disk_full(self.log_path.parent)
            limit = f" (under worker_memory_limit {gib(self.memory_limit)})" if self.memory_limit else ""
            raise StageError(
                f"the worker process died ({_exit_said(code)}) while running stage {request['stage']}{limit}"
                + (f": {cause}" if cause else "") + f"; see {self.log_path}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._cleanup()

    def kill(self) -> None:
        """Stop the worker and everything it started, now (timeouts, Ctrl-C, errors)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        import shutil

        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)
        self.cleanup = []


def _exit_said(code: int) -> str:
    """A worker's exit status in words: subprocess's negative code is the signal that ended it."""
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def _disk_full(directory: Path) -> str | None:
    """Why a worker that died without last words may have: its log's file system is full
    (a worker that cannot write its log exits 120, flushing it)."""
    try:
        full = os.statvfs(directory).f_bavail == 0
    except OSError:
        return None
    return f"{os.strerror(28)}: {directory}" if full else None
