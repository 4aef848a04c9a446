"""`tpubuild schema`: where the installed JSON Schemas are, for editors (issue 30 item 10)."""

from __future__ import annotations

import click

KINDS = {"recipe": "recipe.schema.json", "workspace": "workspace.schema.json"}


@click.command(
    "schema",
    short_help="Print the installed JSON Schema's path (or content) for editor completion.",
    epilog="\b\nExamples:\n  tpubuild schema                       the recipe schema's path\n"
    "  tpubuild schema --modeline            a recipe's first line for the YAML language server\n"
    "  tpubuild schema workspace --content > workspace.schema.json",
)
@click.argument("kind", type=click.Choice(list(KINDS)), default="recipe")
@click.option("--path", "what", flag_value="path", default=True, help="Print the schema file's path (the default).")
@click.option("--content", "what", flag_value="content", help="Print the schema itself (JSON).")
@click.option("--modeline", "what", flag_value="modeline",
              help="Print `# yaml-language-server: $schema=PATH`, to paste as a YAML file's first line.")
def command(kind: str, what: str) -> int:
    """The JSON Schema (2020-12) of a recipe or of tpubuild.yaml, as installed with
    tpubuild: the one `tpubuild validate` checks against. Point an editor with the YAML
    language server at it for completion and hover docs in your own workspace."""
    from tpubuild.config.schema import SCHEMA_DIR

    path = (SCHEMA_DIR / KINDS[kind]).resolve()
    if what == "content":
        click.echo(path.read_text(encoding="utf-8"), nl=False)
    elif what == "modeline":
        click.echo(f"# yaml-language-server: $schema={path}")
    else:
        click.echo(str(path))
    return 0
