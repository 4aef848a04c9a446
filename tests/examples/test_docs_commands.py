"""The README and docs/ show commands that work (issue 42 item 1): every `tpubuild` line of a
fenced shell block runs in the built example workspace without a usage error, and every
other `tpubuild` command they show (an inline command with no placeholder, a line of a CI
configuration) is one the CLI accepts as written. Also: the README stays a front page, its
links and the docs' lead to files that exist, and the recipe reference names every key the
schema accepts."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.cli import CLI, REPO
from tests.example_workspace import copy_built_examples
from tpubuild.cli import cli

PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
# What a placeholder looks like in a usage line: RECIPE, [--json], <recipe>, a | b.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_.]{1,}\b|[\[\]<>|]")


def fenced_commands(text: str, programs: tuple[str, ...] = ("tpubuild ",)) -> list[str]:
    """The `tpubuild` lines (or those of `programs`) of the page's shell blocks (a `$ `
    prompt taken off, a trailing backslash joining the next line, the comment beside a
    line left out)."""
    found = []
    for block in re.findall(r"```(?:sh|bash|shell|console)\n(.*?)```", text, re.S):
        joined = ""
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ")
            if joined:
                joined += " " + line
            elif line.startswith(programs):
                joined = line
            else:
                continue
            if joined.endswith("\\"):
                joined = joined[:-1].rstrip()
                continue
            found.append(re.split(r"\s+#", joined)[0].strip())
            joined = ""
    return found


def shown_commands(text: str) -> list[str]:
    """Other `tpubuild` commands a page shows: inline ones with an option or an argument and
    no placeholder (`tpubuild diff` alone names a verb), and the lines of CI configurations
    in YAML blocks."""
    found = [m for m in re.findall(r"(?<!`)`(tpubuild [^`\n]+)`(?!`)", text)
             if not PLACEHOLDER.search(m) and len(m.split()) > 2]
    for block in re.findall(r"```ya?ml\n(.*?)```", text, re.S):
        found += [m.group(1).strip() for m in re.finditer(r"(?:run:|^\s*-)\s*(tpubuild [^\n]*)", block, re.M)]
    return found


# The group's own options (tpubuild/cli.py), before the verb.
GLOBAL_FLAGS = ("--debug", "-v", "--verbose", "-q", "--quiet")
GLOBAL_VALUES = ("-w", "--workspace")


def accepted(command: str) -> None:
    """Parse `command` as the CLI does, without running it: a usage error raises."""
    words = shlex.split(command.split(" > ")[0], comments=True)[1:]
    front: list[str] = []
    while words and words[0] in GLOBAL_FLAGS + GLOBAL_VALUES:
        take = 2 if words[0] in GLOBAL_VALUES else 1
        front, words = front + words[:take], words[take:]
    assert words, command
    group = cli.make_context("tpubuild", [*front, words[0]])
    verb = cli.get_command(group, words[0])
    if verb is None:
        raise click.UsageError(f"no such command {words[0]!r}")
    verb.make_context(words[0], words[1:], parent=group)


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    first = readme.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert first[:2] == ["pip install -e . && tpubuild build          # build every example recipe of this workspace",
                         "pip install -e '.[test]' && pytest           # run the test suite"]
    for page in PAGES:
        text = page.read_text()
        # No install line a package index cannot serve: tpubuild is installed from a clone.
        assert not re.search(r"pip install ['\"]?tpubuild\b", text), page


def test_every_link_leads_to_a_file_that_exists() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: {target}"


def test_the_recipe_reference_names_every_key_the_schema_accepts() -> None:
    schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text())
    keys: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            keys.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema.get("properties", {}))
    reference = (REPO / "docs" / "recipes.md").read_text()
    example = re.search(r"## Recipe format\n.*?```yaml\n(.*?)```", reference, re.S).group(1)
    assert sorted(k for k in keys - {"$schema"} if not re.search(rf"\b{re.escape(k)}\b", example)) == []


def test_every_command_shown_is_one_the_cli_accepts() -> None:
    commands = [(page, c) for page in PAGES for c in fenced_commands(page.read_text()) + shown_commands(page.read_text())]
    assert len(commands) > 20
    for page, command in commands:
        try:
            accepted(command)
        except click.ClickException as exc:
            pytest.fail(f"{page.relative_to(REPO)}: {command}: {exc.format_message()}")


# Fenced commands that need what the example workspace has no part of: a Ray cluster's head
# node, a recipe published to a registry or a bucket (serving-config --format kserve reads
# the registry's newest version: tests/publish/test_oci_cli.py runs it against one).
NEEDS_A_CLUSTER = ("--ray-address", "--format kserve")


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_every_fenced_command_runs_in_the_built_example_workspace(built_examples: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    copy_built_examples(built_examples, ws)
    ran = 0
    for page in PAGES:
        # A page's `python` lines too: an example's export script writing the SavedModel
        # the next commands convert (docs/migrating-from-the-converter.md).
        for command in fenced_commands(page.read_text(), ("tpubuild ", "python ")):
            if any(word in command for word in NEEDS_A_CLUSTER):
                continue  # accepted by the CLI: test_every_command_shown_is_one_the_cli_accepts
            program = [sys.executable] if command.startswith("python ") else CLI
            done = subprocess.run([*program, *shlex.split(command)[1:]], cwd=ws,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode in (0, 1) and "Traceback" not in done.stderr, \
                f"{page.relative_to(REPO)}: {command}: exit {done.returncode}\n{done.stderr}"
            ran += 1
    assert ran >= 4
