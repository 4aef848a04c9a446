"""Worker processes that run stages: each imports TensorFlow once and runs many stages.

The protocol is one JSON line per request on the worker's stdin and one per reply on a
private copy of its stdout; what stages print goes to the worker's log file instead.
A worker exits when its parent dies (stdin EOF, and PR_SET_PDEATHSIG on Linux), so a
killed build leaves no stage running behind it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError


class WorkerPool:
    """At most `size` workers, started lazily: a build where everything is cached starts none."""

    def __init__(self, size: int, log_dir: Path):
        self.size = max(1, size)
        self.log_dir = log_dir
        self.idle: queue.Queue[Worker] = queue.Queue()
        self.started = 0
        self.lock = threading.Lock()
        self.all: list[Worker] = []

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        worker = self._acquire()
        try:
            reply = worker.call(request)
        except BaseException:
            worker.close()
            with self.lock:
                self.started -= 1
            raise
        self.idle.put(worker)
        return reply

    def _acquire(self) -> Worker:
        with self.lock:
            if self.idle.empty() and self.started < self.size:
                self.started += 1
                worker = Worker(self.log_dir / f"worker-{len(self.all)}.log")
                self.all.append(worker)
                return worker
        return self.idle.get()

    def close(self) -> None:
        for worker in self.all:
            worker.close()


class Worker:
    def __init__(self, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        with open(log_path, "wb") as log:  # the log of this build's worker only
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tpubuild.engine.workers"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise StageError(
                f"the worker process died (exit code {code}) while running stage {request['stage']}; "
                f"see {self.log_path}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


# --- the worker side ---------------------------------------------------------------
def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stdin EOF still ends the worker between stages


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one stage; the reply says ok, a user error (StageError) or a bug (traceback)."""
    import importlib

    from tpubuild.errors import TpubuildError
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
        recipe_name=request["recipe"],
        recipe_file=Path(request["recipe_file"]),
        inputs={k: Path(v) for k, v in request["inputs"].items()},
        results=request["results"],
        log=lambda message: print(f"[{request['recipe']}:{request['stage']}] {message}", file=sys.stderr),
    )
    try:
        result = function(Path(request["input_dir"]), Path(request["output_dir"]), request["options"], context)
    except TpubuildError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        json.dumps(result.summary)
    except (TypeError, ValueError) as exc:
        return {"ok": False, "bug": True, "error": f"StageResult.summary is not JSON-serializable: {exc}"}
    return {"ok": True, "summary": result.summary, "warnings": list(result.warnings)}


def main() -> None:
    _die_with_parent()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stage and TensorFlow prints go to the log, not into the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        print(f"--- {request['recipe']}: stage {request['stage']} (pid {os.getpid()})", file=sys.stderr, flush=True)
        try:
            reply = handle(request)
        except Exception as exc:  # a bug in a stage: report it with its traceback
            traceback.print_exc()
            reply = {"ok": False, "bug": True, "error": f"{type(exc).__name__}: {exc}"}
        sys.stderr.flush()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
