"""The one user-facing exception family; anything else escaping is a bug."""

from __future__ import annotations

from dataclasses import dataclass


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
    """A stage could not produce its output: bad model, failed check (exit code 1)."""

    exit_code = 1


class ConversionError(StageError):
    """The SavedModel cannot be converted as the recipe asks (unknown alias, TPU-incompatible op...)."""
