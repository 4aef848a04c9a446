"""`tpubuild import FILE`: a converter text proto (either dialect) -> recipes/NAME.yaml."""

from __future__ import annotations

from pathlib import Path

import click

from tpubuild.commands._common import only_one, workspace_from


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
@click.option("--saved-model", "saved_model", multiple=True, type=click.Path(path_type=Path, file_okay=False),
              help="The SavedModel the options are for (model.saved_model), inside the workspace; default: "
              "exported/NAME, to be edited.")
@click.option("--name", multiple=True, help="The recipe's name and file name (recipes/NAME.yaml); default: FILE's stem.")
@click.option("--dialect", multiple=True, type=click.Choice(["v1", "v2"]),
              help="Read FILE as the guide's ConverterOptions (v1) or as ConverterOptionsV2 (v2); needed only for "
              "a text valid in both that means different things in each (import says so).")
@click.pass_context
def command(ctx: click.Context, file: Path, saved_model: tuple[Path, ...], name: tuple[str, ...],
            dialect: tuple[str, ...]) -> int:
    """Read FILE, a text proto of the guide's ConverterOptions or of today's
    ConverterOptionsV2 (the dialect is told by what its fields mean), and write
    recipes/NAME.yaml in the workspace with the same options, a comment naming FILE, and
    model.saved_model pointing at --saved-model. An existing recipe is never overwritten,
    and nothing is written but that file (recipes/ is never reached through a link).

    The recipe is checked as `validate`, `render` and `build` will read it, and rendered
    back: it must give FILE's message again, field for field, in this workspace (a default
    of tpubuild.yaml that FILE leaves unset is set in the recipe so that it does not
    apply, and said). A field tpubuild cannot carry out is refused, one line each, and
    nothing is written. TensorFlow is not imported.
    """
    from tpubuild.config.names import invalid_name_message, valid_name
    from tpubuild.converter_import import claim, model_path, write_recipe
    from tpubuild.converter_text import DIALECTS, read_text_file, read_text_proto
    from tpubuild.errors import UsageError
    from tpubuild.fs import shown

    chosen_name = only_one("--name", name)
    chosen_model = only_one("--saved-model", saved_model)
    chosen_dialect = only_one("--dialect", dialect)
    ws = workspace_from(ctx)
    # An empty --name is a name given, and not a valid one (not "use the default").
    recipe_name = chosen_name if chosen_name is not None else file.name.split(".")[0]
    if not valid_name(recipe_name):
        raise UsageError(f"--name: {invalid_name_message(recipe_name)}")
    slot = claim(ws, recipe_name)
    model = model_path(ws, chosen_model, recipe_name)
    origin = shown(str(file))
    text = read_text_file(file, origin)
    imported = read_text_proto(text, origin, DIALECTS[chosen_dialect] if chosen_dialect else None)
    result = write_recipe(slot, imported, origin, model, guessed=chosen_model is None, cwd=Path.cwd())
    click.echo(f"wrote {_shown(result.path)} from {origin} ({result.dialect})")
    for note in result.notes:
        click.echo(note, err=True)
    return 0


def _shown(path: Path) -> str:
    from tpubuild.fs import shown

    try:
        return shown(str(path.relative_to(Path.cwd())))
    except ValueError:
        return shown(str(path))
