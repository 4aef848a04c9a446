"""`tpubuild diff` tests: a git repository made in a temp dir holding a small built
workspace (three recipes sharing a base through `extends`; a SavedModel recipe with a
verification dataset, one without, and an export-script recipe whose script imports a
helper module). It is built once per session, then copied for each edit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cli import tpubuild
from tests.engine.conftest import EXPORT_SCRIPT, tiny_saved_model  # noqa: F401 (a session fixture)

BASE = """\
# Shared batching of the test recipes.
converter:
  batch_options:
    - num_batch_threads: 1
      max_batch_size: 4
      batch_timeout_micros: 100
      allowed_batch_sizes: [2, 4]
      max_enqueued_batches: 10
      experimental: {signature_name: serving_default}
verify: {samples: 4}
"""

RECIPES = {
    "plain": "# A SavedModel recipe.\nname: plain\nextends: common/base.yaml\nmodel: {saved_model: models/tiny}\n",
    "sampled": (
        "name: sampled\nextends: common/base.yaml\nmodel: {saved_model: models/tiny}\n"
        "verify:\n  samples: 4\n  representative_datasets:\n    serving_default: {tfrecord_file_path: models/samples.tfrecord}\n"
    ),
    "exported": (
        "name: exported\nextends: common/base.yaml\n"
        "model:\n  export: {script: models/tiny_export.py, function: export, deps: [models/helper.py]}\n"
    ),
}


def write_samples(path: Path, value: float) -> None:
    """A verification dataset of four rows, all `value`."""
    from tpubuild.quantize.datasets import write_tfrecord

    write_tfrecord(path, "serving_default", [{"x": np.full((1, 2), value, np.float32)} for _ in range(4)])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def built_repo(tmp_path_factory, tiny_saved_model) -> Path:  # noqa: F811
    """A git repository (branch main) whose one commit holds the built workspace and its lock files."""
    repo = tmp_path_factory.mktemp("diff") / "repo"
    models = repo / "recipes" / "models"
    (repo / "recipes" / "common").mkdir(parents=True)
    (repo / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    (repo / ".gitignore").write_text("/.tpubuild/\n/out/\n")
    (repo / "recipes" / "common" / "base.yaml").write_text(BASE)
    shutil.copytree(tiny_saved_model, models / "tiny")
    (models / "tiny_export.py").write_text(EXPORT_SCRIPT)
    (models / "helper.py").write_text("SCALE = 2.0\n")
    write_samples(models / "samples.tfrecord", 1.0)
    for name, text in RECIPES.items():
        (repo / "recipes" / f"{name}.yaml").write_text(text)
    tpubuild(repo, "build", code=0)
    assert all((repo / "recipes" / f"{name}.lock.yaml").is_file() for name in RECIPES)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "built")
    return repo


@pytest.fixture
def repo(built_repo, tmp_path) -> Path:
    """A private copy of the built repository (git history, cache and all) to edit."""
    copy = tmp_path / "repo"
    shutil.copytree(built_repo, copy, symlinks=True)
    return copy


def diff_json(repo: Path, *args: str) -> dict:
    return json.loads(tpubuild(repo, "diff", *args, "--format", "json", code=0).stdout)


def affected(document: dict) -> dict[str, dict]:
    return {r["name"]: r for r in document["recipes"] if r["affected"]}
