"""`tpubuild import FILE`: a converter text proto (either dialect) -> recipes/NAME.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tpubuild.commands._common import workspace_from


@click.command(
    "import",
    short_help="Write a recipe from a converter text proto (ConverterOptions or ConverterOptionsV2).",
    epilog="\b\nExamples:\n"
    "  python recipes/models/toy.py exported/toy    a SavedModel: the example workspace's toy\n"
    "  tpubuild import recipes/converter/toy_v2.pbtxt --saved-model exported/toy    recipes/toy_v2.yaml\n"
    "  tpubuild render toy_v2 --format textproto-v2    the text proto imported, back\n"
    "  tpubuild import recipes/converter/toy_guide.pbtxt --name toy_tuned --saved-model exported/toy",
)
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--saved-model", "saved_model", type=click.Path(path_type=Path, file_okay=False),
              help="The SavedModel the options are for (model.saved_model); default: exported/NAME, "
              "to be edited.")
@click.option("--name", help="The recipe's name and file name (recipes/NAME.yaml); default: FILE's stem.")
@click.pass_context
def command(ctx: click.Context, file: Path, saved_model: Path | None, name: str | None) -> int:
    """Read FILE, a text proto of the guide's ConverterOptions or of today's
    ConverterOptionsV2 (the dialect is told by its fields), and write recipes/NAME.yaml in
    the workspace with the same options, a comment naming FILE, and model.saved_model
    pointing at --saved-model. An existing recipe is never overwritten. A field tpubuild
    cannot carry out is refused, one line each, and nothing is written.
    TensorFlow is not imported.
    """
    from tpubuild.atomic import create_text_exclusive
    from tpubuild.config.names import invalid_name_message, valid_name
    from tpubuild.config.recipe import load_converter_options
    from tpubuild.converter_text import read_text_proto, rebase_datasets
    from tpubuild.errors import ConfigError, UsageError

    ws = workspace_from(ctx)
    name = name or file.name.split(".")[0]
    if not valid_name(name):
        raise UsageError(f"--name: {invalid_name_message(name)}")
    target = ws.root / "recipes" / f"{name}.yaml"
    if target.exists() or target.is_symlink():
        raise UsageError(f"{_shown(target)}: exists; give another --name (import never overwrites a recipe)")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    imported = read_text_proto(text, str(file))
    # Dataset paths in the text are the reader's (this directory's); a recipe's, its file's.
    converter = rebase_datasets(imported.converter, Path.cwd(), target.parent)
    root_converter = rebase_datasets(imported.converter, Path.cwd(), ws.root)
    model = saved_model.resolve() if saved_model else ws.root / "exported" / name
    # Everything a build would check of the options, reported against FILE before writing;
    # not the model's path: the SavedModel may be exported after the import.
    try:
        load_converter_options(root_converter, model, str(file), name, workspace=ws)
    except ConfigError as exc:
        problems = [d for d in exc.diagnostics if not d.json_path.startswith("model")]
        if problems:
            raise ConfigError(problems) from None

    target.parent.mkdir(parents=True, exist_ok=True)
    relative = Path(os.path.relpath(model, target.parent)).as_posix()
    if not create_text_exclusive(target, recipe_text(name, relative, converter, str(file),
                                                     imported.dialect, guessed=saved_model is None)):
        raise UsageError(f"{_shown(target)}: exists; give another --name (import never overwrites a recipe)")
    click.echo(f"wrote {_shown(target)} from {file} ({imported.dialect})")
    return 0


def recipe_text(name: str, saved_model: str, converter: dict, source: str, dialect: str, guessed: bool) -> str:
    import yaml

    body = yaml.safe_dump({"name": name, "model": {"saved_model": saved_model}, "converter": converter},
                          sort_keys=False, default_flow_style=False, allow_unicode=True)
    if guessed:
        body = body.replace(f"  saved_model: {saved_model}\n",
                            f"  saved_model: {saved_model}   # the SavedModel to convert: edit (import --saved-model)\n",
                            1)
    return f"# Imported by `tpubuild import` from {source} (a {dialect} text proto).\n{body}"


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
