"""The one user-facing exception family; anything else escaping is a bug."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any


class TpubuildError(Exception):
    """An error the user can fix; the CLI prints it as one or more lines, no traceback."""

    exit_code = 2

    def lines(self) -> list[str]:
        """What the CLI prints, one line each; located errors override this."""
        return [f"error: {self}"]


@dataclass(frozen=True, order=True)
class Location:
    """A place in a config file; `path` is workspace-relative where possible."""

    path: str
    line: int = 0  # 1-based; 0 means "the file as a whole"
    col: int = 0  # 1-based

    def __str__(self) -> str:
        if self.line:
            return f"{self.path}:{self.line}:{self.col}"
        return self.path


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One problem in one config file: `path:line:col: json.path: message`."""

    loc: Location
    json_path: str
    message: str

    def __str__(self) -> str:
        if self.json_path:
            return f"{self.loc}: {self.json_path}: {self.message}"
        return f"{self.loc}: {self.message}"


class ConfigError(TpubuildError):
    """Every problem found in the configuration, reported together (exit code 2)."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(set(diagnostics))
        super().__init__("\n".join(str(d) for d in self.diagnostics))

    def lines(self) -> list[str]:
        return [str(d) for d in self.diagnostics]


class UsageError(TpubuildError):
    """Bad command-line usage: an unknown target, a missing workspace (exit code 2)."""


class StageError(TpubuildError):
    """A stage could not produce its output: bad model, failed check (exit code 1).
    `detail`: a traceback for `--debug` and the worker log; `timing`: the worker's
    WorkerTime (workers/pool.py) of the attempt, when one ran."""

    exit_code = 1

    def __init__(self, message: str, detail: str | None = None, timing: Any = None):
        super().__init__(message)
        self.detail = detail
        self.timing = timing


class ConversionError(StageError):
    """The SavedModel cannot be converted as the recipe asks (unknown alias, TPU-incompatible op...)."""


# The machine, not the input or tpubuild: a full disk or quota, a file over the size
# limit, a read-only file system, an I/O error. Met anywhere (the cache, out/, the logs,
# the cache index, a stage), each is one line naming the path, exit 1.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def environment_fault(exc: BaseException | None) -> OSError | None:
    """The environment OSError behind `exc` (itself, or what it was raised from or while
    handling), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def fault_line(fault: OSError) -> str:
    """`No space left on device: PATH`: the error, and where."""
    where = f": {fault.filename}" if fault.filename else ""
    return f"{os.strerror(fault.errno)}{where}" if fault.errno else f"{fault}{where}"


def file_kind(mode: int) -> str:
    """What a file is, in words ("a symbolic link", "a directory", "a FIFO (named pipe)")."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "a special file"
