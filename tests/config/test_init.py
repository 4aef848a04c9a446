"""`tpubuild init` and a cache git never sees (issue 42 item 2): in an empty directory,
`git init && tpubuild init`, a recipe, `tpubuild build`, `git add -A` stages nothing of the
cache or of out/; in an existing one nothing is overwritten; and a build that creates the
cache directory makes it ignore itself, with or without init."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli import tpubuild

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
IGNORE_EVERYTHING = "# Written by tpubuild: nothing in this directory belongs in version control.\n*\n"
OUT_LINES = "# Published versions (tpubuild init; `tpubuild init --track-outputs` keeps them in git)\n/out/\n"
NEXT_STEPS = """\
next: write a recipe, e.g. recipes/my_model.yaml:
    model:
      export: {script: models/my_model.py, function: export}   # writes a SavedModel to its argument
    converter:
      tpu_functions:
        - function_alias: tpu_func   # tf.saved_model.SaveOptions(function_aliases={"tpu_func": ...})
  then `tpubuild validate` and `tpubuild build`; versions appear in out/my_model/<N>/."""

# A tiny model, exported by the recipe's script, as a user's first recipe would be.
SCRIPT = '''\
import tensorflow as tf


class Tiny(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def tpu_func(self, x):
        return tf.matmul(x, self.w)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.tpu_func(x) + 1.0}


def export(output_dir):
    model = Tiny()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}))
'''
RECIPE = """\
model:
  export: {script: tiny.py, function: export}
converter:
  tpu_functions:
    - function_alias: tpu_func
verify: {samples: 4}
"""


def run(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **GIT_ENV})


def staged(ws: Path) -> list[str]:
    """What `git add -A` stages in `ws`."""
    assert run(ws, "git", "add", "-A").returncode == 0
    return run(ws, "git", "diff", "--cached", "--name-only").stdout.splitlines()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert run(ws, "git", "init", "-q").returncode == 0
    return ws


def test_init_in_an_empty_directory_then_a_build_stages_nothing_of_the_cache_or_outputs(repo: Path) -> None:
    done = tpubuild(repo, "init", env=GIT_ENV)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "created tpubuild.yaml\ncreated recipes/\n"
        "created .tpubuild/.gitignore (the cache and tpubuild's state stay out of git)\n"
        "created .gitignore (ignores out/, the published versions)\n" + NEXT_STEPS + "\n")
    assert (repo / ".tpubuild" / ".gitignore").read_text() == IGNORE_EVERYTHING
    assert (repo / ".gitignore").read_text() == OUT_LINES
    # The workspace file is commented and loads: every key at its default.
    text = (repo / "tpubuild.yaml").read_text()
    assert text.startswith("# The tpubuild workspace: ") and 'recipes: ["recipes/*.yaml"]' in text
    assert tpubuild(repo, "validate", env=GIT_ENV).returncode == 0

    (repo / "recipes" / "tiny.py").write_text(SCRIPT)
    (repo / "recipes" / "tiny.yaml").write_text(RECIPE)
    built = tpubuild(repo, "build", env=GIT_ENV)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (repo / "out" / "tiny" / "1" / "saved_model.pb").is_file()
    assert (repo / ".tpubuild" / "cache" / "v1" / "keys" / str(os.getuid())).is_file()  # the private record key
    # The cache, the key, the state and the published version: none of it reaches git.
    assert sorted(staged(repo)) == [".gitignore", "recipes/tiny.lock.yaml", "recipes/tiny.py", "recipes/tiny.yaml",
                                    "tpubuild.yaml"]


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_init_in_an_existing_workspace_keeps_every_file_and_a_build_ignores_a_new_cache(repo: Path) -> None:
    """A workspace written by hand (its cache elsewhere than .tpubuild/): the first build
    makes the state and cache directories ignore themselves; `init` later keeps the files
    and appends out/ to the project's .gitignore."""
    (repo / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\ncache_dir: build-cache\n")
    (repo / "recipes").mkdir()
    (repo / "recipes" / "tiny.py").write_text(SCRIPT)
    (repo / "recipes" / "tiny.yaml").write_text(RECIPE)
    (repo / ".gitignore").write_text("*.pyc")  # no newline at its end
    os.chmod(repo / ".gitignore", 0o640)
    built = tpubuild(repo, "build", env=GIT_ENV)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (repo / "build-cache" / ".gitignore").read_text() == IGNORE_EVERYTHING
    assert (repo / ".tpubuild" / ".gitignore").read_text() == IGNORE_EVERYTHING
    # Without init, out/ is the user's to ignore or to commit; nothing else of the build shows.
    assert sorted(p for p in staged(repo) if not p.startswith("out/")) == [
        ".gitignore", "recipes/tiny.lock.yaml", "recipes/tiny.py", "recipes/tiny.yaml", "tpubuild.yaml"]
    assert run(repo, "git", "reset", "-q").returncode == 0

    before = (repo / "tpubuild.yaml").read_text()
    done = tpubuild(repo, "init", env=GIT_ENV)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[:4] == [
        "kept tpubuild.yaml (it exists)", "kept recipes/", "kept .tpubuild/.gitignore",
        "appended /out/ to .gitignore (its other lines kept)"]
    assert (repo / "tpubuild.yaml").read_text() == before
    assert (repo / ".gitignore").read_text() == "*.pyc\n" + OUT_LINES
    assert os.stat(repo / ".gitignore").st_mode & 0o777 == 0o640
    assert not any(p.startswith(("out/", "build-cache/", ".tpubuild/")) for p in staged(repo))
    # Again: nothing to do, nothing changed.
    again = tpubuild(repo, "init", env=GIT_ENV)
    assert again.stdout.splitlines()[3] == "kept .gitignore (it ignores out/ already)"
    assert (repo / ".gitignore").read_text() == "*.pyc\n" + OUT_LINES


def test_init_track_outputs_leaves_outputs_to_git_and_a_file_in_the_way_is_a_usage_error(tmp_path: Path) -> None:
    done = tpubuild(tmp_path, "init", "new", "--track-outputs", env=GIT_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:3] == [
        "created new/tpubuild.yaml", "created new/recipes/",
        "created new/.tpubuild/.gitignore (the cache and tpubuild's state stay out of git)"]
    assert not (tmp_path / "new" / ".gitignore").exists()
    (tmp_path / "file").write_text("")
    refused = tpubuild(tmp_path, "init", "file", env=GIT_ENV)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == "Error: Invalid value for '[DIRECTORY]': Directory 'file' is a file."


def test_no_workspace_error_names_init(tmp_path: Path) -> None:
    done = tpubuild(tmp_path, "list", env=GIT_ENV)
    assert done.returncode == 2
    assert done.stderr == (
        f"error: no tpubuild.yaml in {tmp_path} or any parent directory: `tpubuild init` writes one here (where the "
        "recipes are, where outputs and the cache go), or pass --workspace PATH\n")
