from __future__ import annotations

import click

from tpubuild.commands._common import workspace_from


@click.command(
    "diff",
    short_help="Show what a change between two git revisions does to each recipe.",
    epilog="\b\nExamples:\n  tpubuild diff                       merge base with main .. working tree\n"
    "  tpubuild diff main HEAD --format markdown   a pull-request comment\n"
    "  tpubuild diff --exit-code           in CI: exit 1 when a recipe is affected",
)
@click.argument("base", required=False)
@click.argument("head", required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text",
              show_default=True, help="text for terminals, markdown for a pull-request comment, json for scripts.")
@click.option("--exit-code", is_flag=True, help="Exit 1 when any recipe is affected (added, changed, removed).")
@click.pass_context
def command(ctx: click.Context, base: str | None, head: str | None, fmt: str, exit_code: bool) -> int:
    """Compare the recipes of git revisions BASE and HEAD.

    BASE defaults to the merge base of HEAD with the default branch (origin/HEAD, main
    or master); HEAD defaults to the working tree. For each recipe: added, removed,
    renamed or changed; the changed fields of its canonical form (after extends and
    workspace defaults), the diff of its rendered ConverterOptions, the stages that
    will rerun with their cause and whether their result is already cached, and the
    artifact figures' deltas where HEAD's lock file records a build. Never imports
    TensorFlow and builds nothing.
    """
    from tpubuild.review.diff import diff
    from tpubuild.review.formats import FORMATS

    ws = workspace_from(ctx)
    changes, base_label, head_label = diff(ws, base, head)
    click.echo(FORMATS[fmt](changes, base_label, head_label), nl=False)
    anything = any(c.affected or c.status == "removed" for c in changes)
    return 1 if exit_code and anything else 0
