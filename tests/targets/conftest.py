"""Targets tests: one tiny SavedModel with foldable constants, a recipe with
`targets: {cpu_savedmodel: {}}` built once per session through the real CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.engine.conftest import build_json
from tests.once import built_once_per_run, once_per_run

RECIPE = """\
name: toy
model: {saved_model: models/fold}
converter:
  batch_options:
    - {num_batch_threads: 1, max_batch_size: 4, batch_timeout_micros: 100, allowed_batch_sizes: [2, 4],
       max_enqueued_batches: 10, experimental: {signature_name: serving_default}}
verify: {samples: 4}
targets:
  cpu_savedmodel: {optimize: %s}
"""


@pytest.fixture(scope="session")
def fold_saved_model(tmp_path_factory) -> Path:
    """y = x @ (w + c) where c = (a * 2 + b) / 3 is made of constants only: Grappler's
    constant folding turns its six nodes into one Const at build time."""
    import numpy as np
    import tensorflow as tf

    class Fold(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            a = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
            b = tf.reshape(tf.range(12, dtype=tf.float32), (4, 3))
            c = tf.transpose(tf.transpose((a * 2.0 + b) / 3.0))
            return {"y": tf.matmul(x, self.w + c)}

    def save(directory: Path) -> None:
        model = Fold()
        tf.saved_model.save(model, str(directory / "fold"), signatures={"serving_default": model.serve})

    # One per run, as `targets_built` that copies it (another process's save has other bytes).
    return once_per_run(tmp_path_factory, "fold_saved_model", save) / "fold"


def write_workspace(ws: Path, model: Path, optimize: bool = True, keep_versions: int | None = None) -> Path:
    (ws / "recipes" / "models").mkdir(parents=True)
    text = 'recipes: ["recipes/*.yaml"]\n' + (f"keep_versions: {keep_versions}\n" if keep_versions else "")
    (ws / "tpubuild.yaml").write_text(text)
    shutil.copytree(model, ws / "recipes" / "models" / "fold")
    (ws / "recipes" / "toy.yaml").write_text(RECIPE % ("true" if optimize else "false"))
    return ws


@pytest.fixture(scope="session")
def targets_built(tmp_path_factory, fold_saved_model) -> tuple[Path, dict]:
    """The toy recipe built once per test run (tests/once.py), and the --json document of
    that build."""
    return built_once_per_run(tmp_path_factory, "targets_built",
                              lambda ws: build_json(write_workspace(ws, fold_saved_model)))


@pytest.fixture
def targets_workspace(targets_built, tmp_path) -> Path:
    """A private copy of the session's built workspace (cache, outputs, lock file)."""
    ws = tmp_path / "ws"
    shutil.copytree(targets_built[0], ws, symlinks=True)
    return ws
