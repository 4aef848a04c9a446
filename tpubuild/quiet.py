"""Keep TensorFlow's own log lines off the user's terminal (unless --debug).

What TensorFlow prints, and what stops each (measured with tensorflow 2.21 on CPU):
  * C++ LOG() lines after start-up ("This TensorFlow binary is optimized ...", "failed call
    to cuInit", NodeDef warnings): TF_CPP_MIN_LOG_LEVEL=3, read when the library loads
    (tsl/platform/default/logging.cc), so it must be in the environment before the import.
  * Lines logged while the shared libraries load, through absl directly ("oneDNN custom
    operations are on" from port.cc, "Could not find cuda drivers" from cudart_stub.cc):
    they ignore TF_CPP_MIN_LOG_LEVEL. So does the line absl's StderrLogSink writes before the
    first of them, once per copy of absl, "WARNING: All log messages before
    absl::InitializeLog() is called are written to STDERR": it is written straight to file
    descriptor 2 when nothing has called absl::InitializeLog(), which Python cannot do. The
    only switch is file descriptor 2 itself, so it points at a temporary file for the
    duration of the first `import tensorflow` (the lines are replayed if the import fails).
  * Python lines: the "tensorflow" logger (tf_logging, which also carries AutoGraph's
    notices) goes to ERROR, and AutoGraph's own verbosity to 0 (AUTOGRAPH_VERBOSITY,
    tensorflow/python/autograph/utils/ag_logging.py).

`quiet_tensorflow()` never imports TensorFlow itself: planning commands stay TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Any, Iterator, MutableMapping

# logging, tempfile and importlib.abc are imported where used: every command imports this
# module (cli.py), and planning commands should cost what their work does (15 ms less).

# Set in the environment by quiet_tensorflow so that child processes (build workers) that
# call quiet_from_environment() stay quiet too.
QUIET_FLAG = "TPUBUILD_QUIET_TENSORFLOW"
QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_CPP_MAX_VLOG_LEVEL": "0",
    "AUTOGRAPH_VERBOSITY": "0",
    QUIET_FLAG: "1",
}


def quiet_tensorflow(env: MutableMapping[str, str] | None = None) -> None:
    """Silence TensorFlow's C++ and Python logging for this process and its children.

    Call it before anything imports TensorFlow. With the default `env` (os.environ) the
    first `import tensorflow` of this process runs with file descriptor 2 redirected and
    the Python loggers are set once it is imported; with another mapping, only that
    mapping is changed (e.g. the environment of a subprocess).
    """
    target = os.environ if env is None else env
    target.update(QUIET_ENV)
    if target is not os.environ:
        return
    if "tensorflow" in sys.modules:
        _quiet_python_loggers()
    elif not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())


def quiet_from_environment() -> bool:
    """In a child process: quiet_tensorflow() if the parent asked for quiet; True if so."""
    if os.environ.get(QUIET_FLAG) == "1":
        quiet_tensorflow()
        return True
    return False


def _quiet_python_loggers() -> None:
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        from absl import (
            logging as absl_logging,  # TF's dependency; absent only without TF
        )

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


@contextlib.contextmanager
def stderr_captured() -> Iterator[None]:
    """Point file descriptor 2 at a temporary file; replay it if the block raises."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            capture.seek(0)
            os.write(2, capture.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class _QuietImport:
    """Runs the first `import tensorflow` with stderr captured, then sets its loggers (a
    meta path finder: the import system calls find_spec, no base class needed)."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the package
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader:
    """The package's loader, its exec_module with stderr captured (PEP 451's two methods)."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        # The package's own loader again, for anything that inspects it later.
        module.__loader__ = module.__spec__.loader = self.loader
        with stderr_captured():
            self.loader.exec_module(module)
        _quiet_python_loggers()


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Redirect fd 2 (C++ and Python logging alike) into a list of lines filled on exit."""
    lines: list[str] = []
    import tempfile

    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())
