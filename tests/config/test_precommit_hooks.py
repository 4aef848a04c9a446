"""The repository's pre-commit hooks (.pre-commit-hooks.yaml, issue 42 item 5): a manifest
pre-commit accepts, hooks that run tpubuild commands, and, with pre-commit installed, the
hooks themselves passing and failing on a real repository."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli import REPO, tpubuild
from tpubuild.cli import VERBS

MANIFEST = REPO / ".pre-commit-hooks.yaml"

# pre-commit's manifest schema (pre_commit/clientlib.py MANIFEST_HOOK_DICT, 4.x), for when
# pre-commit is not installed: the required keys, and each optional one with its type.
REQUIRED = {"id": str, "name": str, "entry": str, "language": str}
OPTIONAL = {"alias": str, "files": str, "exclude": str, "types": list, "types_or": list, "exclude_types": list,
            "additional_dependencies": list, "args": list, "always_run": bool, "fail_fast": bool,
            "pass_filenames": bool, "description": str, "language_version": str, "log_file": str,
            "require_serial": bool, "stages": list, "verbose": bool, "minimum_pre_commit_version": str}
LANGUAGES = {"conda", "coursier", "dart", "docker", "docker_image", "dotnet", "fail", "golang", "haskell", "julia",
             "lua", "node", "perl", "pygrep", "python", "r", "ruby", "rust", "swift", "system", "script",
             "unsupported", "unsupported_script"}


def hooks() -> list[dict]:
    return yaml.safe_load(MANIFEST.read_text())


def test_pre_commit_accepts_the_manifest() -> None:
    try:
        from pre_commit.clientlib import load_manifest
    except ImportError:
        load_manifest = None
    if load_manifest is not None:
        loaded = load_manifest(str(MANIFEST))  # pre-commit's own validation: raises on any problem
        assert [h["id"] for h in loaded] == ["tpubuild-validate", "tpubuild-check"]
        return
    for hook in hooks():  # the documented schema, checked field by field
        assert {k: type(hook.get(k)) for k in REQUIRED} == REQUIRED, hook
        assert set(hook) <= set(REQUIRED) | set(OPTIONAL), set(hook) - set(REQUIRED) - set(OPTIONAL)
        assert all(isinstance(hook[k], OPTIONAL[k]) for k in set(hook) & set(OPTIONAL)), hook
        assert hook["language"] in LANGUAGES
        for key in ("files", "exclude"):
            if key in hook:
                re.compile(hook[key])
    assert [h["id"] for h in hooks()] == ["tpubuild-validate", "tpubuild-check"]


def test_each_hook_runs_a_tpubuild_command_on_the_whole_workspace() -> None:
    for hook in hooks():
        program, verb, *args = shlex.split(hook["entry"])
        assert (program, verb in VERBS) == ("tpubuild", True), hook["entry"]
        # The whole workspace, not the commit's files: any edit can make any lock file stale.
        assert (hook["pass_filenames"], hook["always_run"]) == (False, True)
        # The installation that builds (a lock file's keys cover tpubuild's code and toolchain).
        assert hook["language"] == "system"
    assert [h["entry"] for h in hooks()] == ["tpubuild validate", "tpubuild build --check"]


@pytest.mark.skipif(shutil.which("pre-commit") is None and not os.path.exists(Path(sys.executable).parent / "pre-commit"),
                    reason="pre-commit is not installed")
def test_the_hooks_pass_on_a_current_workspace_and_fail_on_a_stale_lock_file(tmp_path: Path) -> None:
    """`pre-commit try-repo` of this repository's hooks in a new git repository made by `tpubuild init`."""
    bin_dir = Path(sys.executable).parent  # the tpubuild and pre-commit of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PRE_COMMIT_HOME": str(tmp_path / "pc"),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    ws = tmp_path / "ws"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=ws, env=env, capture_output=True, text=True, timeout=300)

    # try-repo clones the hooks' repository with git. This checkout need not be one (a source
    # archive, a copy): the manifest is the only file `language: system` hooks read, so the
    # hooks' repository is a git repository of its own holding it.
    hooks_repo = tmp_path / "hooks"
    hooks_repo.mkdir()
    shutil.copy2(MANIFEST, hooks_repo / MANIFEST.name)
    for args in (("git", "init", "-q"), ("git", "add", "-A"), ("git", "commit", "-qm", "hooks")):
        made = subprocess.run(args, cwd=hooks_repo, env=env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stdout + made.stderr
    ws.mkdir()
    assert run("git", "init", "-q").returncode == 0
    assert tpubuild(ws, "init", base_env=env, timeout=300).returncode == 0
    assert run("git", "add", "-A").returncode == 0 and run("git", "commit", "-qm", "init").returncode == 0
    passed = run("pre-commit", "try-repo", str(hooks_repo), "--all-files")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(r"^tpubuild build --check\.+Passed$", passed.stdout, re.M), passed.stdout
    assert re.search(r"^tpubuild validate\.+Passed$", passed.stdout, re.M), passed.stdout
    # A recipe that was never built has no lock file: the check hook fails and names it.
    (ws / "recipes" / "toy.yaml").write_text("model: {saved_model: ../models/toy}\n")
    (ws / "models" / "toy").mkdir(parents=True)
    (ws / "models" / "toy" / "saved_model.pb").write_bytes(b"")
    assert run("git", "add", "-A").returncode == 0 and run("git", "commit", "-qm", "toy").returncode == 0
    failed = run("pre-commit", "try-repo", str(hooks_repo), "tpubuild-check", "--all-files")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert re.search(r"^tpubuild build --check\.+Failed$", failed.stdout, re.M), failed.stdout
    assert "recipes/toy.yaml: building would change recipes/toy.lock.yaml: no lock file" in failed.stdout.splitlines()
