"""Every `Examples:` line of every verb's --help runs as written in the example workspace,
after one build (issue 42 item 3): a user who copies one gets no usage error.

The lines are read from the help texts themselves, so an example added later is run too.
Each verb's lines run in order, in a copy of the built workspace of its own (`clean` must
not take `verify`'s version away), through bash, with `tpubuild` and `python` the ones of
this test run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.cli import tpubuild
from tests.example_workspace import copy_built_examples
from tpubuild.cli import VERBS, cli

# Programs an example line may start with. `docker` is shown, not run: what it would be
# given, `$(tpubuild ...)`, is.
RUN = ("tpubuild", "python", "echo")
SHOWN = ("docker",)


def help_text(verb: str) -> str:
    """`tpubuild VERB --help`, as click prints it."""
    group = click.Context(cli, info_name="tpubuild")
    command = cli.get_command(group, verb)
    return command.get_help(click.Context(command, info_name=verb, parent=group))


def example_lines(text: str) -> list[str]:
    """The command lines of the Examples block: those at its first line's indentation (a
    backslash joins the next line); deeper lines are what the command prints."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(r"\s*Examples?:", line)), None)
    if start is None:
        return []
    block = [line for line in lines[start + 1:] if line.strip()]
    indent = len(block[0]) - len(block[0].lstrip())
    commands: list[str] = []
    joined = ""
    for line in block:
        if joined:
            joined += " " + line.strip()
        elif len(line) - len(line.lstrip()) == indent:
            joined = line.strip()
        else:
            continue  # the output shown under a command
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        commands.append(re.split(r"\s{2,}", joined)[0])  # two spaces or more: the comment beside it
        joined = ""
    return commands


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tpubuild` and `python` of this test run, first on PATH."""
    folder = tmp_path_factory.mktemp("bin")
    for name, command in (("tpubuild", f'"{sys.executable}" -m tpubuild'), ("python", f'"{sys.executable}"')):
        (folder / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (folder / name).chmod(0o755)
    return folder


def run(line: str, cwd: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    if line.startswith("tpubuild list --json") and shutil.which("jq") is None:
        line = line.split("|")[0] + "| python -m json.tool > /dev/null"  # what jq would need: JSON
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def test_every_verb_has_examples_and_each_line_is_a_command() -> None:
    for verb in VERBS:
        lines = example_lines(help_text(verb))
        assert lines, f"tpubuild {verb} --help shows no example"
        for line in lines:
            assert line.split()[0] in RUN + SHOWN, f"tpubuild {verb} --help: {line!r} is not a command line"
    # The reader sees what a user sees: build's, with the comment beside a line taken off.
    assert "tpubuild build -j 2 'quantized*'" in example_lines(help_text("build"))


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
@pytest.mark.parametrize("verb", list(VERBS))
def test_each_help_example_runs_in_the_built_example_workspace(verb: str, built_examples: Path, bin_dir: Path,
                                                               tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    copy_built_examples(built_examples, ws)
    for line in example_lines(help_text(verb)):
        if line.split()[0] in SHOWN:
            commands = re.findall(r"\$\((tpubuild [^)]*)\)", line)
            assert commands, line
        else:
            commands = [line]
        for command in commands:
            done = run(command, ws, bin_dir)
            # Not only no usage error (2): every example succeeds, and says nothing of a fault.
            assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_explain_error_takes_the_quantize_stage_of_an_int8_recipe_and_says_why(built_examples: Path,
                                                                             tmp_path: Path) -> None:
    """issue 42: quantized_tpu_func runs quantize and bfloat16; the default is the stage that
    changes numbers most, and the first line says which and why."""
    ws = copy_built_examples(built_examples, tmp_path / "ws")  # explain-error writes scratch under .tpubuild/
    done = tpubuild(ws, "explain-error", "quantized_tpu_func")
    assert (done.returncode, done.stderr) == (0, "")
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(
        r"recipes/quantized_tpu_func\.yaml: recipe quantized_tpu_func: stage quantize \(of its stages quantize and "
        r"bfloat16, the one that changes numbers most: int8; --stage bfloat16 explains the other\), verify's int8 "
        r"tolerance \(rtol 0\.05, atol 0\.001\), serving_default: 16 samples \(representative_dataset\)", first), first
    assert done.stdout.splitlines()[1].startswith("  the quantize stage's output against the source: max rel error ")
