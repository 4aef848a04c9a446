"""The `tpubuild` command: a click group whose verbs live in `tpubuild.commands.*`.

Verbs are imported lazily (the Olive registry idea) so `tpubuild validate` never pays
for the imports of `tpubuild convert`. Errors derived from TpubuildError become
one line each and an exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import errno
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import click

from tpubuild import __version__
from tpubuild.errors import TpubuildError, environment_fault, fault_line
from tpubuild.quiet import quiet_tensorflow

# verb -> module under tpubuild.commands exporting `command`, in --help order.
VERBS = {
    "init": "init",
    "build": "build",
    "validate": "validate",
    "list": "list_",
    "render": "render",
    "explain": "explain",
    "explain-error": "explain_error",
    "diff": "diff",
    "convert": "convert",
    "import": "import_",
    "inspect": "inspect_",
    "report": "report",
    "clean": "clean",
    "gc": "gc",
    "verify-cache": "verify_cache",
    "verify": "verify",
    "serving-config": "serving_config",
    "schema": "schema",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [verb for verb in VERBS if importlib.util.find_spec(f"tpubuild.commands.{VERBS[verb]}")]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in VERBS:
            return None
        try:
            module = importlib.import_module(f"tpubuild.commands.{VERBS[name]}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tpubuild.commands.{VERBS[name]}":
                return None
            raise
        return module.command

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Click's, plus git's `Did you mean` for a mistyped verb (`biuld` -> `build`)."""
        name = args[0] if args else ""
        if name and name not in VERBS and not name.startswith("-") and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, list(VERBS), n=1)
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)


class Options:
    """Global options every verb receives through click's context object."""

    def __init__(self, workspace: Path | None, debug: bool, verbose: bool = False, quiet: bool = False):
        self.workspace = workspace
        self.debug = debug
        self.verbose = verbose  # more output (build: every stage); TensorFlow's log is --debug's
        self.quiet = quiet  # less output (build: errors, warnings and the summary line)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Run `tpubuild VERB --help` for a verb's options and an example.",
)
@click.version_option(__version__, "--version", prog_name="tpubuild")
@click.option(
    "--workspace",
    "-w",
    type=click.Path(path_type=Path, file_okay=True, dir_okay=True),
    help="The workspace (a directory holding tpubuild.yaml, or the file itself). "
    "Default: the nearest tpubuild.yaml in this directory or above.",
)
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors, and TensorFlow's own log.")
@click.option("--verbose", "-v", is_flag=True,
              help="More output: build and build --dry-run list every stage, cached ones too (also `build -v`).")
@click.option("--quiet", "-q", is_flag=True,
              help="Less output: build prints only errors, warnings and its summary line (also `build -q`).")
@click.pass_context
def cli(ctx: click.Context, workspace: Path | None, debug: bool, verbose: bool, quiet: bool) -> None:
    """tpubuild: build TPU-ready TensorFlow SavedModels from YAML recipes.

    Each model in the workspace has a recipe (recipes/*.yaml) whose `converter:`
    section mirrors the Cloud TPU Inference Converter's ConverterOptions. tpubuild
    rebuilds only the stages whose inputs changed and publishes numbered versions.
    """
    if debug:  # workers and the engine show full tracebacks of stage errors
        os.environ["TPUBUILD_DEBUG"] = "1"
    if verbose and quiet:
        from tpubuild.errors import UsageError

        raise UsageError("-q/--quiet and -v/--verbose cannot be used together")
    ctx.obj = Options(workspace, debug, verbose, quiet)
    if not debug:
        # Before any verb imports TensorFlow; it imports nothing itself (planning stays light).
        quiet_tensorflow()


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        code = cli.main(args=argv, prog_name="tpubuild", standalone_mode=False)
    except TpubuildError as exc:
        if debug:
            raise
        for line in exc.lines():
            click.echo(line, err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        # The build's workers were killed on the way out (the finally of engine/loop.py's build).
        click.echo("tpubuild: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        fault = environment_fault(exc)
        if fault is None or debug:
            raise  # anything else is a bug: keep its traceback
        _report_environment_fault(fault)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _report_environment_fault(fault: OSError) -> None:
    if fault.filename is None and fault.errno == errno.ENOSPC:
        # Most likely stdout itself (`> file` on a full disk): it is unusable, and Python
        # would print a second error flushing it at exit; point it at /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    click.echo(f"error: {fault_line(fault)}", err=True)

