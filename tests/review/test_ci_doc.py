"""docs/ci.md's workflows: their tpubuild commands, run as written on a real git
repository (a clone with an `origin`, a feature branch and the cache restored)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.cli import REPO
from tests.review.conftest import git
from tests.review.test_diff import OWN_BATCH

DOC = REPO / "docs" / "ci.md"


def workflow_commands() -> dict[str, list[str]]:
    """The shell commands of each workflow that need no forge (not installing, not posting)."""
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]
    github = [step["run"] for step in blocks[0]["jobs"]["review"]["steps"] if "run" in step]
    gitlab = blocks[1]["tpubuild-review"]["script"] + blocks[1]["tpubuild-review"]["after_script"]
    keep = lambda lines: [c for c in lines if ("tpubuild" in c or "git " in c) and "pip install" not in c  # noqa: E731
                          and "api" not in c]
    return {"github": keep(github), "gitlab": keep(gitlab)}


def run(commands: list[str], repo: Path) -> list[subprocess.CompletedProcess]:
    env = dict(os.environ, GITHUB_BASE_REF="main", CI_MERGE_REQUEST_TARGET_BRANCH_NAME="main",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return [subprocess.run(["bash", "-ec", c], cwd=repo, env=env, capture_output=True, text=True) for c in commands]


def test_workflow_commands_on_a_pull_request(built_repo, tmp_path):
    commands = workflow_commands()
    assert [c.split()[:3] for c in commands["github"]] == [["tpubuild", "build", "--check"],
                                                             ["tpubuild", "diff", '"$(git']]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(built_repo), str(clone)], check=True)
    for restored in (".tpubuild/cache", "out"):  # what actions/cache/restore brings back
        shutil.copytree(built_repo / restored, clone / restored)
    git(clone, "checkout", "-q", "-b", "feature")
    with open(clone / "recipes" / "common" / "base.yaml", "a") as f:
        f.write("# a comment only\n")
    git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "comment")
    for forge in ("github", "gitlab"):
        check, *rest = run(commands[forge], clone)
        assert check.returncode == 0, check.stdout + check.stderr
        assert all(r.returncode == 0 for r in rest), [r.stderr for r in rest]
        comment = (clone / "tpubuild-diff.md").read_text()
        assert comment.startswith("**tpubuild diff**: no recipe affected")
        assert comment.endswith("<!-- tpubuild diff -->\n")

    # A recipe edited without rebuilding: the check fails, the comment names the recipe.
    with open(clone / "recipes" / "plain.yaml", "a") as f:
        f.write(OWN_BATCH)
    git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "timeout")
    check, *rest = run(commands["github"], clone)
    assert check.returncode == 1 and "recipes/plain.yaml" in check.stdout + check.stderr
    assert all(r.returncode == 0 for r in rest)
    comment = (clone / "tpubuild-diff.md").read_text()
    assert comment.startswith("**tpubuild diff**: 1 recipe affected: 1 rebuild from batch")
