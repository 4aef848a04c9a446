"""Every export path users take gives the same bytes in any process.

The export stage's output is the first key every later stage depends on: if two runs of
the same script differ, a comment edit of the script rebuilds and republishes everything.
Keras 3's `model.export()` and `ExportArchive` saved their `_all_variables` list in memory-
address order (savedmodel/alias_variables.py); jax2tf and orbax wrote source paths, line
numbers and autograph's random temporary file names into their StableHLO
(savedmodel/reproducible.py). Each path is exported by the real export stage in two
processes with other hash seeds, one perturbed so that TensorFlow's per-process counters
and the objects' memory addresses differ as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.cli import REPO
from tests.realmodels.export_every_path import available


def _export_all(out: Path, seed: int, perturbed: bool) -> dict[str, dict[str, str]]:
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "tests.realmodels.export_every_path", str(out)] + (["--perturb"] if perturbed else [])
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_export_path_is_byte_identical_in_two_processes(tmp_path):
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda run: _export_all(tmp_path / str(run[0]), *run),
                                 [(1, False), (2, True)])
    names = available()
    assert sorted(first) == sorted(second) == sorted(names)
    assert {"keras_sequential", "keras_functional", "keras_subclassed", "keras_export_archive",
            "keras_hub"} <= set(names)
    for name in names:
        assert first[name] == second[name], (name, first[name], second[name])
        assert "saved_model.pb" in first[name] and "variables/variables.index" in first[name], name


def test_keras_exports_keep_one_object_per_weight(tmp_path):
    """The alias list is gone from the object graph, the saver and the checkpoint; what
    the model computes, and TF Serving's session loader, are unchanged."""
    import numpy as np
    import tensorflow as tf

    from tests.realmodels import keras_exports
    from tpubuild.savedmodel.alias_variables import drop_alias_lists_in_place
    from tpubuild.savedmodel.variable_handles import normalize_in_place
    from tpubuild.verify.serving_load import check_serving_load

    raw = tmp_path / "functional"
    keras_exports.export_functional(str(raw))
    images = keras_exports.images(3, seed=4)
    want = tf.saved_model.load(str(raw)).signatures["serving_default"](tf.constant(images))
    normalize_in_place(raw)
    keys_before = set(tf.train.load_checkpoint(str(raw / "variables" / "variables")).get_variable_to_shape_map())
    assert any(k.startswith("_all_variables/") for k in keys_before)
    # Conv2D kernel and bias, BatchNormalization's four, Dense kernel and bias, and the
    # Dropout's seed state that no endpoint reads (so not in the list).
    assert drop_alias_lists_in_place(raw) == 1 + 8  # the list and its eight aliases
    keys_after = set(tf.train.load_checkpoint(str(raw / "variables" / "variables")).get_variable_to_shape_map())
    assert keys_after == {k for k in keys_before if not k.startswith("_all_variables/")}
    assert drop_alias_lists_in_place(raw) == 0  # idempotent
    check_serving_load(raw, ["serve"], "the export without aliases")  # every variable restored
    loaded = tf.saved_model.load(str(raw))
    assert not hasattr(loaded, "_all_variables")
    got = loaded.signatures["serving_default"](tf.constant(images))
    for key, value in want.items():
        # The same graph and the same weights in the same process: only kernel choice differs.
        np.testing.assert_allclose(got[key].numpy(), value.numpy(), rtol=1e-6, atol=1e-6)
