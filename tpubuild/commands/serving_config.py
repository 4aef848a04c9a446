from __future__ import annotations

from pathlib import Path

import click


@click.command(
    "serving-config",
    short_help="Write TF Serving's model config (ModelServerConfig), or KServe InferenceServices, of the recipes.",
    epilog="\b\nExamples:\n  tpubuild serving-config                        every recipe, on stdout\n"
    "  tpubuild serving-config toy -o models.config   one recipe, into a file for --model_config_file",
)
@click.argument("recipe_patterns", nargs=-1, metavar="[RECIPE]...")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the config to FILE (atomically) instead of standard output.")
@click.option("--format", "form", type=click.Choice(["tf-serving", "kserve"]), default="tf-serving", show_default=True,
              help="tf-serving: TF Serving's ModelServerConfig; kserve: one KServe InferenceService per recipe (YAML).")
@click.option("--label", default="stable", show_default=True, metavar="NAME",
              help="kserve: the version a recipe's serving.version_labels gives this label is served; a recipe "
                   "without it serves the newest version in its registry.")
@click.pass_context
def command(ctx: click.Context, recipe_patterns: tuple[str, ...], output: Path | None, form: str = "tf-serving",
            label: str = "stable") -> int:
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

    With --format kserve, one KServe InferenceService per recipe (serving.kserve.io/v1beta1,
    modelFormat tensorflow): its storageUri the oci+native:// reference of a modelcar's
    version (oci:// with a base_image), the version its `serving.version_labels` gives
    --label (default stable), else the newest version tpubuild published in the registry
    (read there); a bucket's base path for an s3:// or gs:// destination. A recipe KServe
    cannot serve from (no destination, a mount, a ModelPack artifact) is one line, exit 2.
    """
    from tpubuild.atomic import write_text_atomic
    from tpubuild.commands._common import recipes_from

    ws, recipes = recipes_from(ctx, recipe_patterns)
    if form == "kserve":
        from tpubuild.publish import inference_services, newest_in_registry

        text = inference_services(recipes, label, newest_in_registry(ws.remote_timeouts,
                                                                     say=lambda m: click.echo(m, err=True)))
    else:
        from tpubuild.publish import model_server_config

        text = model_server_config(recipes, ws.output_dir)
    if output is None:
        click.echo(text, nl=False)
        return 0
    write_text_atomic(output, text)
    noun = "InferenceService" if form == "kserve" else "model"
    click.echo(f"wrote {output} ({len(recipes)} {noun}{'s' if len(recipes) != 1 else ''})")
    return 0
