from __future__ import annotations

from pathlib import Path

import click


@click.command(
    "serving-config",
    short_help="Write TF Serving's model config (ModelServerConfig text proto) naming the recipes' base paths.",
    epilog="\b\nExamples:\n  tpubuild serving-config                        every recipe, on stdout\n"
    "  tpubuild serving-config toy -o models.config   one recipe, into a file for --model_config_file",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the config to FILE (atomically) instead of standard output.")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], output: Path | None) -> int:
    """Print TF Serving's `ModelServerConfig` (text proto, for
    `tensorflow_model_server --model_config_file=FILE`) with one model per RECIPE (names,
    globs or recipe files; none = all): its name, its base path on its `publish_to:`
    destination (`<publish_to>/<recipe>`; the local `<output_dir>/<recipe>` for a recipe
    without one) and platform tensorflow.

    A recipe's `serving: {version_labels: {stable: 3, canary: 4}}` becomes version_labels,
    and the model's version policy is then `specific` over exactly those versions (TF
    Serving labels only loaded versions): a deploy is this file's diff, reviewed in the
    same pull request as the recipe. Without labels TF Serving serves the newest version.
    Reads no destination and no model; TensorFlow is not imported.
    """
    from tpubuild.atomic import write_text_atomic
    from tpubuild.commands._common import recipes_from
    from tpubuild.publish import model_server_config

    ws, recipes = recipes_from(ctx, recipe_patterns)
    text = model_server_config(recipes, ws.output_dir)
    if output is None:
        click.echo(text, nl=False)
        return 0
    write_text_atomic(output, text)
    click.echo(f"wrote {output} ({len(recipes)} model{'s' if len(recipes) != 1 else ''})")
    return 0
