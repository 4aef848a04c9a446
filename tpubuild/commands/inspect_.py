from __future__ import annotations

import json
from pathlib import Path

import click


@click.command(
    "inspect",
    short_help="Show a SavedModel's signatures, aliases and functions (to write a recipe).",
    epilog="\b\nExamples:\n  tpubuild inspect out/toy/1                 a published version: its TPU functions\n"
    "  tpubuild inspect out/toy/1 --tags serve --json",
)
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--tags", default=None, help="Comma-separated tag set of the MetaGraphDef (default: the only one, or serve).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def command(path: Path, tags: str | None, as_json: bool) -> int:
    """Tags, signatures with input/output specs, function aliases, concrete functions with
    their callers, which functions XLA can compile, and TPU / batch ops already present.
    In a converted model, the functions that hold the TPUPartitionedCall or BatchFunction
    run on the host by design and are said to, not judged for XLA."""
    _check_saved_model_dir(path)  # before TensorFlow's import: a wrong path is a usage error (exit 2)
    from tpubuild.tpu.inspect import inspect, to_text

    info = inspect(path, tags.split(",") if tags else None)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(to_text(info), nl=False)
    return 0


def _check_saved_model_dir(path: Path) -> None:
    from tpubuild.errors import UsageError

    try:
        if not path.exists():
            raise UsageError(f"{path}: no such directory (give a SavedModel directory)")
        if not path.is_dir():
            raise UsageError(f"{path}: is a file, not a directory (give a SavedModel directory)")
        if not (path / "saved_model.pb").is_file():
            raise UsageError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    except (OSError, ValueError) as exc:  # a name too long, a null byte
        raise UsageError(f"{str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
