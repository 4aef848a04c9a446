"""The `tpubuild` executable: answers `tpubuild build --check` before the CLI is imported.

CI runs `build --check` on every pull request, in a fresh clone, and it should cost what a
no-op build costs. Importing click and the command modules alone takes about as long as
checking 200 lock files (lock/quickcheck.py), so the exact command lines CI runs,
`tpubuild [-w DIR] build --check`, are answered here when the lock files prove the
workspace up to date. Any other command line, and any check that needs more (a stale or
missing lock file, a recipe with globs), goes to the click CLI (tpubuild/cli.py), which
prints the same line or the stale recipes and their causes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pathlib import Path

_FAST_TRIED = False  # the fast paths declined this process's command: the CLI need not try them again


def main(argv: list[str] | None = None) -> None:
    global _FAST_TRIED
    _FAST_TRIED = False
    args = sys.argv[1:] if argv is None else argv
    for command, answer in _FAST_PATHS:
        workspace = _check_command(args, command)
        if workspace is False:
            continue
        from pathlib import Path

        line = answer(Path(workspace) if workspace is not None else None)
        _FAST_TRIED = line is None  # this process ends in the CLI: it need not try them again
        if line is not None:
            try:
                print(line, flush=True)
                sys.exit(0)
            except OSError:
                pass  # stdout on a full disk, a closed pipe: the CLI says so in its one line
        break
    from tpubuild.cli import main as cli_main

    cli_main(argv)


def fast_paths_declined() -> bool:
    """Whether the fast paths above declined this process's command line (the exact
    `build` or `build --check`): the CLI then goes straight to the full path."""
    return _FAST_TRIED


def up_to_date_line(count: int) -> str:
    """What `build --check` prints when no lock file would change."""
    return f"{count} lock file{'s' if count != 1 else ''} up to date"


def fast_check(workspace: Path | None) -> int | None:
    """How many lock files the no-op memo (lock/memo.py) or the lock files themselves
    (lock/quickcheck.py) prove current, in that order, for `build --check` of the whole
    workspace (`workspace`: the --workspace option); None when neither can, or when main
    tried them already for this process's command: the full check decides."""
    if _FAST_TRIED:
        return None
    from pathlib import Path

    from tpubuild.lock import quick, quick_check

    try:
        start = Path.cwd()
        found = quick(start, workspace, outputs=False)  # what decides the lock files, not the outputs
        count = len(found[1]["recipe_files"]) if found is not None and found[1]["recipe_files"] \
            else quick_check(start, workspace)
    except OSError:
        return None  # a deleted working directory, an unreadable file: the full check says which
    return count


def fast_noop(workspace: Path | None) -> str | None:
    """The summary line of a plain `tpubuild build` that the no-op memo proves has nothing
    to do (lock/memo.py: every input and output stats as when it was last found up to
    date), printed without importing click (20 ms of a 2,000-recipe no-op); None: the CLI
    builds, and decides again."""
    from pathlib import Path

    from tpubuild.lock import quick

    try:
        found = quick(Path.cwd(), workspace)
    except OSError:
        return None
    if found is None or not found[1]["recipe_files"]:
        return None
    from tpubuild.build_words import summary_line, wants_colour

    head = found[1]
    return summary_line(len(head["recipe_files"]), {"cached": head["rows"]}, ("cached",), wants_colour(sys.stdout))


def _check_command(args: list[str], command: str) -> str | None | Literal[False]:
    """The `--workspace` of `[-w DIR | --workspace DIR | --workspace=DIR] COMMAND` (None: no
    option), or False for any other command line."""
    workspace: str | None = None
    if args[:1] in (["-w"], ["--workspace"]) and len(args) >= 2:
        workspace, args = args[1], args[2:]
    elif args[:1] and args[0].startswith("--workspace="):
        workspace, args = args[0][len("--workspace="):], args[1:]
    if args != command.split() or workspace == "":
        return False
    return workspace


def _fast_check_line(workspace: Path | None) -> str | None:
    count = fast_check(workspace)
    return None if count is None else up_to_date_line(count)


# The exact command lines answered here, each with what proves it has nothing to do.
_FAST_PATHS = (("build --check", _fast_check_line), ("build", fast_noop))
