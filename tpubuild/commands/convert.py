"""`tpubuild convert SRC_DIR OUT_DIR`: convert one SavedModel directly, without the build engine."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(
    "convert",
    short_help="Convert one SavedModel now, as a recipe or options file says.",
    epilog="\b\nExamples:\n  python recipes/models/toy.py exported/toy    a SavedModel: the example workspace's toy\n"
    "  tpubuild convert exported/toy converted/toy --recipe recipes/toy.yaml\n"
    "  echo 'tpu_functions: [{function_alias: tpu_func}]' > converter.yaml\n"
    "  tpubuild convert exported/toy converted/toy-tpu --options-file converter.yaml",
)
@click.argument("src_dir", type=click.Path(path_type=Path, file_okay=False))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--recipe", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A recipe YAML; its converter section is applied to SRC_DIR.")
@click.option("--options-file", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A YAML file holding a bare ConverterOptions-like `converter:` section.")
def command(src_dir: Path, out_dir: Path, recipe: Path | None, options_file: Path | None) -> int:
    """Run the recipe's transform stages (quantize, tpu, bfloat16, io_shape, batch) on
    SRC_DIR and publish the result at OUT_DIR, which must be absent or empty.

    No cache and no version numbers: that is `tpubuild build`. The model given as
    SRC_DIR is used even when the recipe names another one.
    """
    from tpubuild.config.recipe import load_converter_options_file, load_recipe_file
    from tpubuild.convert import convert

    if (recipe is None) == (options_file is None):
        raise click.UsageError("give exactly one of --recipe FILE or --options-file FILE")
    loaded = load_recipe_file(recipe) if recipe else load_converter_options_file(options_file, saved_model=src_dir)
    result = convert(src_dir, out_dir, loaded.canonical, loaded.root, loaded.file,
                     log=lambda message: click.echo(message, err=True))
    for run in result.ran:
        for warning in run.warnings:
            click.echo(f"warning: {run.name}: {warning}", err=True)
    done = ", ".join(run.name for run in result.ran) or "no stage"
    click.echo(f"converted {src_dir} -> {out_dir} ({done})")
    return 0
