"""`tpubuild convert SRC_DIR OUT_DIR`: convert one SavedModel directly, without the build engine.

Also the Cloud TPU Inference Converter's own command line (`--input_model_dir`,
`--output_model_dir`, `--converter_options_string`), so that a script running the
converter's image runs with `tpubuild convert` in its place.
"""

from __future__ import annotations

from pathlib import Path

import click

from tpubuild.commands._common import only_one

# How a text proto given on the command line is named in errors.
OPTIONS_STRING = "--converter_options_string"


@click.command(
    "convert",
    short_help="Convert one SavedModel now, as a recipe, options file or converter text proto says.",
    epilog="\b\nExamples:\n  python recipes/models/toy.py exported/toy    a SavedModel: the example workspace's toy\n"
    "  tpubuild convert exported/toy converted/toy --recipe recipes/toy.yaml\n"
    "  echo 'tpu_functions: [{function_alias: tpu_func}]' > converter.yaml\n"
    "  tpubuild convert exported/toy converted/toy-tpu --options-file converter.yaml\n"
    "  tpubuild convert --input_model_dir=exported/toy --output_model_dir=converted/toy-cli \\\n"
    "      --converter_options_string='tpu_functions { function_alias: \"tpu_func\" }'",
)
@click.argument("src_dir", type=click.Path(path_type=Path, file_okay=False), required=False)
@click.argument("out_dir", type=click.Path(path_type=Path), required=False)
@click.option("--recipe", multiple=True, type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A recipe YAML; its converter section is applied to SRC_DIR.")
@click.option("--options-file", multiple=True, type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A YAML file holding a bare ConverterOptions-like `converter:` section.")
@click.option("--input_model_dir", "input_model_dir", multiple=True, type=click.Path(path_type=Path, file_okay=False),
              help="The converter's flag: the SavedModel to convert (SRC_DIR).")
@click.option("--output_model_dir", "output_model_dir", multiple=True, type=click.Path(path_type=Path),
              help="The converter's flag: where the converted model goes (OUT_DIR), outside SRC_DIR.")
@click.option("--converter_options_string", "options_string", multiple=True, metavar="TEXT",
              help="The converter's flag: a ConverterOptions or ConverterOptionsV2 text proto.")
@click.option("--dialect", multiple=True, type=click.Choice(["v1", "v2"]),
              help="Read --converter_options_string as the guide's ConverterOptions (v1) or as ConverterOptionsV2 "
              "(v2); needed only for a text valid in both that means different things in each (convert says so).")
def command(src_dir: Path | None, out_dir: Path | None, recipe: tuple[Path, ...], options_file: tuple[Path, ...],
            input_model_dir: tuple[Path, ...], output_model_dir: tuple[Path, ...], options_string: tuple[str, ...],
            dialect: tuple[str, ...]) -> int:
    """Run the recipe's transform stages (quantize, tpu, bfloat16, io_shape, batch) on
    SRC_DIR and publish the result at OUT_DIR, which must be absent or empty, and outside
    SRC_DIR; its files keep the modes of SRC_DIR's (the umask's for new ones).

    The options come from one of --recipe, --options-file or --converter_options_string
    (a text proto of the guide's ConverterOptions or today's ConverterOptionsV2, as the
    converter's image takes it, with --input_model_dir and --output_model_dir in place of
    SRC_DIR and OUT_DIR). Each is given once: the converter's image would read only one.

    No cache and no version numbers: that is `tpubuild build`. The model given as
    SRC_DIR is used even when the recipe names another one.
    """
    recipe_file, options_path = only_one("--recipe", recipe), only_one("--options-file", options_file)
    options_text = only_one(OPTIONS_STRING, options_string)
    chosen_dialect = only_one("--dialect", dialect)
    src_dir = _one_of("SRC_DIR", src_dir, "--input_model_dir", only_one("--input_model_dir", input_model_dir))
    out_dir = _one_of("OUT_DIR", out_dir, "--output_model_dir", only_one("--output_model_dir", output_model_dir))
    if chosen_dialect and options_text is None:
        raise click.UsageError(f"--dialect says how to read {OPTIONS_STRING}, which is not given")
    given = [name for name, value in (("--recipe FILE", recipe_file), ("--options-file FILE", options_path),
                                      (f"{OPTIONS_STRING} TEXT", options_text)) if value is not None]
    if len(given) != 1:
        raise click.UsageError(f"give exactly one of --recipe FILE, --options-file FILE or {OPTIONS_STRING} TEXT")

    from tpubuild.config.recipe import (
        converter_options_root,
        load_converter_options,
        load_converter_options_file,
        load_recipe_file,
    )
    from tpubuild.convert import convert

    if recipe_file:
        loaded = load_recipe_file(recipe_file)
    elif options_path:
        loaded = load_converter_options_file(options_path, saved_model=src_dir)
    else:
        from tpubuild.converter_text import DIALECTS, decode_text, read_text_proto, rebase_datasets

        assert options_text is not None  # exactly one of the three was given (above)
        text = decode_text(options_text, OPTIONS_STRING)
        imported = read_text_proto(text, OPTIONS_STRING, DIALECTS[chosen_dialect] if chosen_dialect else None)
        # The converter reads dataset paths from its working directory: the same here.
        converter = rebase_datasets(imported.converter, Path.cwd(), converter_options_root(src_dir))
        loaded = load_converter_options(converter, src_dir, OPTIONS_STRING, name="converter_options")
    result = convert(src_dir, out_dir, loaded.canonical, loaded.root, loaded.file,
                     log=lambda message: click.echo(message, err=True))
    for run in result.ran:
        for warning in run.warnings:
            click.echo(f"warning: {run.name}: {warning}", err=True)
    done = ", ".join(run.name for run in result.ran) or "no stage"
    click.echo(f"converted {src_dir} -> {out_dir} ({done})")
    return 0


def _one_of(argument: str, positional: Path | None, flag: str, flagged: Path | None) -> Path:
    if positional is not None and flagged is not None:
        raise click.UsageError(f"give {argument} or {flag}, not both")
    chosen = positional if positional is not None else flagged
    if chosen is None:
        raise click.UsageError(f"missing {argument} (or {flag})")
    return chosen
