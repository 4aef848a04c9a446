"""The worker process: runs stages one request at a time, as the pool (workers/pool.py)
asks, over one JSON line per request on stdin and one per reply on a private copy of
stdout; what stages print goes to the worker's log file. A stage's key covers this module
and what it imports (keys/code.py RUNTIME_MODULES), never the pool or the build loop.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# The module a spare worker imports before it reads its first request (WorkerPool._start_spare).
PREIMPORT = "TPUBUILD_PREIMPORT"
# And the op libraries it loads after it (JSON: the stages' `op_libraries` entries, modules only).
PRELOAD_LIBRARIES = "TPUBUILD_PRELOAD_LIBRARIES"
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
        reference_dir=Path(request["reference_dir"]) if request.get("reference_dir") else None,
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


def gib(size: int | None) -> str:
    return f"{(size or 0) / 2**30:.3g} GiB"


def _out_of_memory(exc: BaseException) -> dict[str, Any]:
    """A stage that allocated past the worker's memory: one line, and the worker is not
    reused (what failed to allocate may have left it half-built)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    limit = f"the worker memory limit ({gib(_MEMORY_LIMIT[0])}, worker_memory_limit in tpubuild.yaml)" \
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
    # A crash in native code (TensorFlow's kernels, a user's op library) ends the worker
    # with a signal and no Python traceback: faulthandler writes the Python stack of every
    # thread to the log first, so the pool's one line and the log name where it was.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    _die_with_parent()
    _limit_memory(sys.argv[1:])
    from tpubuild.quiet import quiet_from_environment

    if quiet_from_environment():  # before any stage imports TensorFlow
        # The log is a file the user reads after a failure: TF's C++ errors belong in it
        # (an abort's last words, MLIR diagnostics), its info and warnings do not.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    from tpubuild.workers import import_clock

    # TensorFlow's import is this worker's start-up, not its first stage's work: timed
    # apart (before imports.install, whose finder must stay in front of the clock's).
    clock = import_clock.install()
    record_root = os.environ.get("TPUBUILD_RECORD_IMPORTS")
    if record_root:
        from tpubuild.workers import import_record as imports

        imports.install(Path(record_root))
    else:  # tpubuild's own stages only: JAX after TensorFlow, when a stage wants it
        from tpubuild.workers import lean_import

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
    # What a stage keeps for the next one lives in tpubuild.handoff, the module stages import
    # (this one runs as `python -m`: `__main__`, whose globals no stage sees).
    from tpubuild import handoff, io_counters

    for line in sys.stdin:
        request = json.loads(line)
        print(f"--- stage {request['stage']} (pid {os.getpid()})", file=sys.stderr, flush=True)
        _reset_peak_rss()
        children_before = _rusage_peak("RUSAGE_CHILDREN")
        io_before = io_counters.read()
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
            from tpubuild.workers import import_record as imports

            reply["discovered"] = imports.discovered()
        reply["peak_rss_bytes"] = _stage_peak(children_before)
        reply["io"] = io_counters.since(io_before)  # what the stage read and wrote
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
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a log on a full disk: the stage's reply said so already
    os._exit(0)


if __name__ == "__main__":
    main()
