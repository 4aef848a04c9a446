from __future__ import annotations

from pathlib import Path

import click

from tpubuild.commands._common import recipes_from
from tpubuild.errors import UsageError


@click.command(
    "render",
    short_help="Print a recipe's ConverterOptions for the official converter.",
    epilog="\b\nExamples:\n"
    "  tpubuild render toy                    the text proto\n"
    "  tpubuild render recipes/toy.yaml --format json\n"
    "  docker run --mount type=bind,source=$PWD,target=/ws ... \\\n"
    "      --input_model_dir=/ws/models/toy --output_model_dir=/ws/out/toy \\\n"
    "      --converter_options_string=\"$(tpubuild render toy --path-prefix /ws)\"",
)
@click.argument("recipe", metavar="RECIPE")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["textproto", "textproto-v2", "json", "yaml"]),
    default="textproto",
    show_default=True,
    help="textproto: the guide's ConverterOptions text proto (schemas/converter_options.proto); "
    "textproto-v2: today's ConverterOptionsV2 (schemas/converter_options_v2.proto), which has no "
    "quantization; json, yaml: the recipe's canonical converter section.",
)
@click.option(
    "--path-prefix",
    default="",
    help="Write dataset paths as this prefix and their workspace-relative path: where the "
    "converter sees the workspace (e.g. its mount point in the container). Without it they are "
    "relative to the current directory, where the converter reads them from.",
)
@click.pass_context
def command(ctx: click.Context, recipe: str, fmt: str, path_prefix: str) -> int:
    """Print RECIPE's converter options, a recipe name (or a glob matching one) or a
    recipe file. TensorFlow is not imported.

    The text proto is what the Cloud TPU Inference Converter takes as
    --converter_options_string, the message the recipe writes: each field its layers
    (tpubuild.yaml's defaults, its `extends` bases, itself) set, as they set it, and no
    other (a field left out means the converter's default, which is tpubuild's); so a
    recipe `tpubuild import` wrote renders back to the text it was imported from.
    Quantization goes under external_feature_configs { quantization_options { ... } } and
    dataset paths are relative to the current directory unless --path-prefix is given.

    Only ConverterOptions are printed, in every format: `verify:`, `targets:` and
    tpubuild's own extensions (allow_unquantized) are not converter options
    (`tpubuild list` shows each recipe's targets).
    """
    from tpubuild.render import Spelling, render

    found = _one_recipe(ctx, recipe)
    spelling = Spelling(found.written_converter, found.root, Path.cwd(), found.absolute_paths)
    click.echo(render(found.canonical, fmt, source=found.rel_file, path_prefix=path_prefix, spelling=spelling), nl=False)
    return 0


def _one_recipe(ctx: click.Context, pattern: str):
    path = Path(pattern)
    if path.suffix in (".yaml", ".yml") and _is_file(path):
        from tpubuild.config.recipe import load_recipe_file
        from tpubuild.config.workspace import load_workspace

        workspace = load_workspace(override=ctx.obj.workspace) if ctx.obj and ctx.obj.workspace else None
        return load_recipe_file(path, workspace)
    _, recipes = recipes_from(ctx, [pattern])
    if len(recipes) > 1:
        names = ", ".join(r.name for r in recipes)
        raise UsageError(f"render takes one recipe; {pattern!r} matches {len(recipes)}: {names}")
    return recipes[0]


def _is_file(path: Path) -> bool:
    """Whether RECIPE names a recipe file; a name too long for the file system or holding a
    null byte cannot, and is then looked up as a recipe name (which fails with a usage error)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
