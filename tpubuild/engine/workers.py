"""Worker processes that run stages: each imports TensorFlow once and runs many stages.

The protocol is one JSON line per request on the worker's stdin and one per reply on a
private copy of its stdout; what stages print goes to the worker's log file instead.
A reply's `seconds` is the stage's own work, timed here without TensorFlow's import
(engine/import_clock.py): the engine reports the rest of its wait as worker start-up.
A worker exits when its parent dies (stdin EOF, and PR_SET_PDEATHSIG on Linux), so a
killed build leaves no stage running behind it.

Workers get a scrubbed environment (keys.worker_env): only what is in every stage key,
plus what a process needs to start. Stages that run user code (export scripts,
dataset generators) get a fresh worker for each run, which records the workspace
modules the user code imports (engine/imports.py) and then exits.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError


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
# One exception, report after verify (engine/build.py HANDOFF): measured again with
# TensorFlow imported without JAX (engine/lean_import.py, 110 MiB less per worker), report
# peaks at 898 MiB in verify's worker (788 in its own), under the goal (957 in that run).
OWN_WORKER_MIN_BYTES = 64 * 2**20
OWN_WORKER_ENV = "TPUBUILD_OWN_WORKER_MIN_BYTES"

# The module a spare worker imports before it reads its first request (WorkerPool._start_spare).
PREIMPORT = "TPUBUILD_PREIMPORT"
# And the op libraries it loads after it (JSON: the stages' `op_libraries` entries, modules only).
PRELOAD_LIBRARIES = "TPUBUILD_PRELOAD_LIBRARIES"
# A worker's private scratch directory (its HOME), removed with it: what one of its stages
# keeps there for a later one (tpu/twin.py cpu_twin) goes with the worker.
WORKER_SCRATCH = "TPUBUILD_WORKER_SCRATCH"

# The memory limit of a worker (tpubuild.yaml `worker_memory_limit`), as RLIMIT_AS: the
# address space the process may map. Off by default, because no default is safe: an idle
# TensorFlow worker maps far more than it uses (measured, TF 2.21 on 2 cores: VmSize
# 2.0 GiB for 0.67 GiB resident), and what it maps grows with the machine, not the model:
# glibc gives each thread that allocates its own malloc arena, reserving 64 MiB of
# address space each (up to 8 per core), and every thread of TF's pools reserves its
# stack (8 MiB). A limit right for 2 cores kills healthy stages on 96. A cgroup memory
# limit counts resident memory instead, but needs a delegated cgroup v2 subtree, which an
# unprivileged build rarely has. So the user who knows the machine sets it: a stage that
# then allocates past it fails with one line naming the stage (MemoryError, TF's
# ResourceExhaustedError), instead of swapping the machine to a halt.
MEMORY_LIMIT_FLAG = "--memory-limit"


# What a stage leaves in its worker for the next stage the engine hands that worker to
# (engine/build.py HANDOFF: verify's loaded CPU twin, for report's HLO). Kept only while
# a stage runs whose request says the worker is handed on (`keep_for`, set by main), so a
# stage that is not handed on pays nothing for it and leaves nothing under another stage's
# peak; outside a worker nothing is kept.
_HANDED_ON: dict[Any, Any] = {}
_HANDING_ON = [False]  # the running stage's request has `keep_for`


def hand_on(key: Any, value: Any) -> bool:
    """Keep `value` for the stage this worker is handed on to; False (nothing kept, the
    caller lets it go) when the worker is not handed on after this stage, or outside a worker."""
    if not _HANDING_ON[0]:
        return False
    _HANDED_ON[key] = value
    return True


def handed_on(key: Any) -> Any:
    """What an earlier stage of this worker kept under `key` (taken), else None."""
    return _HANDED_ON.pop(key, None)


def begin_stage(handing_on: bool) -> None:
    """A stage starts in this worker; `handing_on`: its request says the worker is handed on after it."""
    _HANDING_ON[0] = handing_on


def end_stage() -> None:
    """A stage ended: unless the worker is handed on, let go of what an earlier stage kept
    and this one did not take."""
    if not _HANDING_ON[0] and _HANDED_ON:
        _HANDED_ON.clear()
        from tpubuild.memory import release_memory

        release_memory()


def own_worker_min_bytes() -> int:
    """OWN_WORKER_MIN_BYTES, or TPUBUILD_OWN_WORKER_MIN_BYTES (a scheduling knob: which
    worker runs a stage changes no output); a value that is not a whole number of bytes is
    an error, not a silent default."""
    value = os.environ.get(OWN_WORKER_ENV, "").strip()
    if not value:
        return OWN_WORKER_MIN_BYTES
    if not value.isdigit():
        from tpubuild.errors import UsageError

        raise UsageError(f"{OWN_WORKER_ENV}={value!r}: expected a whole number of bytes (default "
                         f"{OWN_WORKER_MIN_BYTES})")
    return int(value)


class StageTimeout(StageError):
    pass


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

    def run(self, request: dict[str, Any], timeout: float | None, fresh_in: Path | None = None,
            spare: bool = False) -> dict[str, Any]:
        """Run one stage; `fresh_in` (the workspace) asks for a fresh worker that records
        the workspace modules the stage imports and exits afterwards. `own_worker` (a
        `runs_models` stage reading own_worker_min_bytes() or more) asks for a worker of its
        own, closed after it. `spare`: a later stage of this recipe will want a worker of
        its own; one is started now, beside this stage (see _take_spare)."""
        libraries = loaded_libraries(request)
        with self.slots:
            if fresh_in is not None:
                worker = self._fresh(fresh_in)
            elif request.get("own_worker"):
                # Nothing of an earlier stage under its peak: a spare has imported
                # TensorFlow and run nothing. Or the worker an earlier stage handed on.
                worker = self._take_kept(request.get("take"), libraries) or self._take_spare(libraries) \
                    or self._new(self.env)
            else:
                worker = self._acquire(libraries)
            if spare:  # for a later stage of the same recipe: the same op libraries (pipeline.plan)
                self._start_spare(request["options"].get("op_libraries") or [])
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
        """A worker that records the imports of user code (engine/imports.py compiles the
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
    return telling_line(text)


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
                [sys.executable, *safe_path, "-m", "tpubuild.engine.workers",
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
            limit = f" (under worker_memory_limit {_gib(self.memory_limit)})" if self.memory_limit else ""
            raise StageError(
                f"the worker process died (exit code {code}) while running stage {request['stage']}{limit}"
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


def _disk_full(directory: Path) -> str | None:
    """Why a worker that died without last words may have: its log's file system is full
    (a worker that cannot write its log exits 120, flushing it)."""
    try:
        full = os.statvfs(directory).f_bavail == 0
    except OSError:
        return None
    return f"{os.strerror(28)}: {directory}" if full else None


# --- the worker side ---------------------------------------------------------------
def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stdin EOF still ends the worker between stages


def _reset_peak_rss() -> None:
    """Start this stage's peak RSS from what the process holds now, so that a reused
    worker reports each stage's own peak (proc(5), /proc/pid/clear_refs: writing 5 resets
    the peak resident set size, Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux: the figure is the process's peak so far


def _peak_rss_bytes() -> int | None:
    """The peak resident set size since _reset_peak_rss (VmHWM of /proc/self/status), else
    the process's peak (getrusage), for `tpubuild build --json` and the benchmarks."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _rusage_peak("RUSAGE_SELF")


def _rusage_peak(who: str) -> int | None:
    """getrusage's ru_maxrss in bytes: of this process (RUSAGE_SELF), or of the largest
    child process waited for so far (RUSAGE_CHILDREN)."""
    try:
        import resource

        peak = resource.getrusage(getattr(resource, who)).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
    except (ImportError, OSError):
        return None


def _stage_peak(children_before: int | None) -> int | None:
    """The stage's peak RSS: the worker's own (_peak_rss_bytes), or a process the stage
    started and waited for when that peaked higher (xla_aot's tfcompile process, the C++
    compiler of xla_aot_verify). A child's peak is known only when it is above every
    earlier child's of this worker (getrusage keeps one maximum); a lower one is below
    what an earlier stage reported, so it cannot be this stage's peak over the worker's."""
    own = _peak_rss_bytes()
    children = _rusage_peak("RUSAGE_CHILDREN")
    if children is not None and children > (children_before or 0):
        return max(own or 0, children)
    return own


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one stage; the reply says ok, a user error (StageError) or a bug (traceback)."""
    import importlib

    from tpubuild.stages.base import StageContext

    module_name, _, function_name = request["entry"].partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return {"ok": False, "error": f"stage module {module_name} does not exist in this tpubuild"}
        raise
    context = StageContext(
        workspace=Path(request["workspace"]),
        inputs={k: Path(v) for k, v in request["inputs"].items()},
        results=request["results"],
        log=lambda message: print(f"[{request['stage']}] {message}", file=sys.stderr),
    )
    from tpubuild import op_libraries

    libraries = request["options"].get("op_libraries") or []
    try:
        # Before the stage: its ops must be registered when it (or TF) reads the graph.
        op_libraries.load(libraries, Path(request["workspace"]))
    except Exception as exc:  # noqa: BLE001 - the library's own failure, one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"ok": False, "reusable": False, "error": f"op_libraries: loading failed: {type(exc).__name__}: {first}",
                "detail": traceback.format_exc()}
    # Registered ops stay registered: the pool gives this worker only stages that load the
    # same libraries (WorkerPool._acquire, loaded_libraries).
    reply = _run_stage(function, request, context)
    if not reply["ok"]:
        message = op_libraries.unregistered_op_message(str(reply.get("error", "")), libraries)
        if message:
            return {**reply, "error": message, "bug": False}
    return reply


def _run_stage(function: Any, request: dict[str, Any], context: Any) -> dict[str, Any]:
    from tpubuild.errors import TpubuildError

    try:
        result = function(Path(request["input_dir"]), Path(request["output_dir"]), request["options"], context)
    except TpubuildError as exc:
        if isinstance(exc.__context__, MemoryError):  # user code's (export, dataset) said as theirs
            return _out_of_memory(exc)
        return {"ok": False, "error": str(exc), "detail": getattr(exc, "detail", None)}
    except MemoryError as exc:
        return _out_of_memory(exc)
    except Exception as exc:
        if type(exc).__name__ == "ResourceExhaustedError" and _MEMORY_LIMIT[0]:
            return _out_of_memory(exc)
        from tpubuild.errors import environment_fault, fault_line

        fault = environment_fault(exc)
        if fault is not None:  # the machine's (a full disk), not a bug: one line, no traceback
            return {"ok": False, "reusable": False, "error": fault_line(fault), "detail": traceback.format_exc()}
        # TensorFlow's checksums caught corrupted input data (a damaged variables file):
        # the user's file, not a tpubuild bug.
        if type(exc).__name__ == "DataLossError":
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return {"ok": False, "error": f"corrupted input data: {first}", "detail": traceback.format_exc()}
        if "Op type not registered" in str(exc):  # a user's missing library, not a bug
            return {"ok": False, "error": str(exc), "detail": traceback.format_exc()}
        raise
    try:
        json.dumps(result.summary)
    except (TypeError, ValueError) as exc:
        return {"ok": False, "bug": True, "error": f"StageResult.summary is not JSON-serializable: {exc}"}
    return {"ok": True, "summary": result.summary, "warnings": list(result.warnings),
            "discovered": dict(result.discovered)}


_MEMORY_LIMIT: list[int | None] = [None]  # this worker's RLIMIT_AS, when it has one


def _gib(size: int | None) -> str:
    return f"{(size or 0) / 2**30:.3g} GiB"


def _out_of_memory(exc: BaseException) -> dict[str, Any]:
    """A stage that allocated past the worker's memory: one line, and the worker is not
    reused (what failed to allocate may have left it half-built)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    limit = f"the worker memory limit ({_gib(_MEMORY_LIMIT[0])}, worker_memory_limit in tpubuild.yaml)" \
        if _MEMORY_LIMIT[0] else "the memory of this machine"
    return {"ok": False, "reusable": False, "error": f"out of memory: the stage needed more than {limit}: {first}",
            "detail": traceback.format_exc()}


def _limit_memory(argv: list[str]) -> None:
    """Apply `--memory-limit BYTES` (WorkerPool's memory_limit) as RLIMIT_AS: a larger
    allocation fails (MemoryError, TF's ResourceExhaustedError) instead of the machine
    swapping. The hard limit is left as it is."""
    if MEMORY_LIMIT_FLAG not in argv:
        return
    limit = int(argv[argv.index(MEMORY_LIMIT_FLAG) + 1])
    try:
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        _MEMORY_LIMIT[0] = limit
    except (ImportError, OSError, ValueError) as exc:  # not POSIX: said in the worker's log
        print(f"--- worker_memory_limit not applied: {exc}", file=sys.stderr, flush=True)


def main() -> None:
    _die_with_parent()
    _limit_memory(sys.argv[1:])
    from tpubuild.quiet import quiet_from_environment

    if quiet_from_environment():  # before any stage imports TensorFlow
        # The log is a file the user reads after a failure: TF's C++ errors belong in it
        # (an abort's last words, MLIR diagnostics), its info and warnings do not.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    from tpubuild.engine import import_clock

    # TensorFlow's import is this worker's start-up, not its first stage's work: timed
    # apart (before imports.install, whose finder must stay in front of the clock's).
    clock = import_clock.install()
    record_root = os.environ.get("TPUBUILD_RECORD_IMPORTS")
    if record_root:
        from tpubuild.engine import imports

        imports.install(Path(record_root))
    else:  # tpubuild's own stages only: JAX after TensorFlow, when a stage wants it
        from tpubuild.engine import lean_import

        lean_import.install()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stage and TensorFlow prints go to the log, not into the protocol
    sys.stdout = sys.stderr
    # A spare (WorkerPool._start_spare) imports TensorFlow now, as its first stage would;
    # the variable leaves the environment the stages see.
    if os.environ.pop(PREIMPORT, "") == "tensorflow":
        started = time.monotonic()
        import tensorflow  # noqa: F401

        loaded = _preload_libraries(os.environ.pop(PRELOAD_LIBRARIES, ""))
        print(f"--- spare (pid {os.getpid()}): {', '.join(['tensorflow', *loaded])} imported in "
              f"{time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    # Stages reach hand_on through `tpubuild.engine.workers`; run as `python -m`, this
    # module is `__main__`, another instance with its own globals: the state is that one's.
    from tpubuild.engine import workers as handoff  # noqa: PLW0406 - on purpose, see above

    for line in sys.stdin:
        request = json.loads(line)
        print(f"--- stage {request['stage']} (pid {os.getpid()})", file=sys.stderr, flush=True)
        _reset_peak_rss()
        children_before = _rusage_peak("RUSAGE_CHILDREN")
        clock.take()  # a spare's import happened before any stage
        started = time.monotonic()
        handoff.begin_stage(bool(request.get("keep_for")))
        try:
            reply = handle(request)
        except Exception as exc:  # a bug in a stage: report it with its traceback
            traceback.print_exc()
            reply = {"ok": False, "bug": True, "error": f"{type(exc).__name__}: {exc}",
                     "detail": traceback.format_exc()}
        # The stage's own work: from this request to its reply, less TensorFlow's import.
        reply["seconds"] = max(0.0, time.monotonic() - started - clock.take())
        if record_root:
            from tpubuild.engine import imports

            reply["discovered"] = imports.discovered()
        reply["peak_rss_bytes"] = _stage_peak(children_before)
        sys.stderr.flush()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        handoff.end_stage()
    _exit_now(replies)


def _preload_libraries(entries: str) -> list[str]:
    """A spare's op libraries (WorkerPool._start_spare), the modules loaded: its first stage
    loads them again (op_libraries.load; a module is not imported twice) and says what failed."""
    if not entries:
        return []
    from tpubuild import op_libraries

    resolved = json.loads(entries)
    try:
        op_libraries.load(resolved, Path.cwd())
    except Exception as exc:  # noqa: BLE001 - the stage's own load reports it, with its context
        print(f"--- op_libraries not preloaded: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return []
    return [entry["module"] for entry in resolved]


def _exit_now(replies: Any) -> None:
    """End the worker at stdin EOF without Python's finalization. Every reply is written
    and every stage's output is on disk (atomic and durable) before its reply, so nothing
    is left to finish; what finalization does is tear down the objects of every model
    the worker loaded, one by one, and TensorFlow's runtime after them: measured 3.1 s of
    wall time and 0.7 s of CPU for a process that loaded and ran ResNet50 (2 cores), which
    the engine waits for before the next stage of its own worker starts (WorkerPool.run
    closes such a worker) and before the build ends."""
    for stream in (replies, sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a log on a full disk: the stage's reply said so already
    os._exit(0)


if __name__ == "__main__":
    main()
