"""The README's incremental-build promises, on the path most users take: a Keras 3
functional model exported with `model.export()`, placed by signature, batched, bfloat16,
in a git repository with its lock file committed.

- a comment edit of the export script reruns `export` alone (its output is byte-identical),
  publishes nothing, and its revert leaves `git status` clean;
- a batch option changed, built and reverted leaves `git status` clean;
- `gc --keep-days 0` then `build` builds nothing;
- no warning on the documented path (the TPU body has its HLO and cost);
- the bfloat16 artifact holds no float32 copy of a converted weight: its variables are at
  most 0.55x the export's (bfloat16 halves every float32 weight; the 0.05 is the
  checkpoint's own index and object graph, ~3 KB beside the 10,000 weights of 40 KB).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import build_json, statuses

SCRIPT = '''\
"""A small CNN, exported the way Keras documents it."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras


def export(output_dir):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(32, 3, padding="same")(inputs)
    x = keras.layers.BatchNormalization()(x)
    shortcut = x
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(32, 3, padding="same")(x)
    x = keras.layers.Add()([x, shortcut])  # a residual connection
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    outputs = keras.layers.Dense(4, activation="softmax")(x)
    keras.Model(inputs, outputs).export(output_dir, verbose=False)
'''
RECIPE = """\
model:
  export: {script: models/cnn.py}
converter:
  tpu_functions: [{signature_name: serving_default}]
  batch_options:
    - {max_batch_size: 4, allowed_batch_sizes: [2, 4], batch_timeout_micros: 1000}
  bfloat16_optimization: ENABLED
verify:
  samples: 4
"""


def _git(ws: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ws, capture_output=True, text=True, check=True)
    return result.stdout


@pytest.fixture(scope="module")
def keras_repo(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("keras-git") / "ws"
    (ws / "recipes" / "models").mkdir(parents=True)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    (ws / ".gitignore").write_text(".tpubuild/\nout/\n")
    (ws / "recipes" / "models" / "cnn.py").write_text(SCRIPT)
    (ws / "recipes" / "cnn.yaml").write_text(RECIPE)
    document = build_json(ws, timeout=900)
    assert set(statuses(document, "cnn").values()) == {"built"}, document
    # The documented path gets no warning: the signature's TPU body has its HLO and cost.
    warnings = [w for row in document["rows"] for w in row.get("warnings", [])]
    assert warnings == [], warnings
    assert list((ws / "out" / "cnn" / "1" / "hlo").iterdir()), "no HLO for the TPU function"
    _git(ws, "init", "-q")
    _git(ws, "-c", "user.email=t@example.com", "-c", "user.name=t", "add", "-A")
    _git(ws, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "cnn")
    return ws


def _versions(ws: Path) -> list[str]:
    return sorted(p.name for p in (ws / "out" / "cnn").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_a_comment_edit_of_a_keras_export_reruns_export_alone_and_its_revert_is_clean(keras_repo):
    ws = keras_repo
    script = ws / "recipes" / "models" / "cnn.py"
    lock = ws / "recipes" / "cnn.lock.yaml"
    committed = lock.read_text()
    script.write_text(SCRIPT.replace("# a residual connection", "# a residual connection, as ResNets have"))
    document = build_json(ws, timeout=900)
    stages = statuses(document, "cnn")
    assert stages.pop("export") == "built", stages
    assert set(stages.values()) == {"cached"}, stages
    assert _versions(ws) == ["1"]
    # The lock file records the script's new content and export's new key, nothing else.
    export_key = next(row["key"] for row in document["rows"] if row["stage"] == "export")
    changed = [line for line in _git(ws, "diff", "-U0", "--", str(lock)).splitlines()
               if line.startswith("+") and not line.startswith("+++")]
    assert changed, "the lock file must record the new script"
    import hashlib

    script_hash = hashlib.sha256(script.read_bytes()).hexdigest()
    for line in changed:
        if line.startswith("+planning:"):
            continue  # its digest covers the stage keys the lock file records
        if line.endswith("# measured on the building machine"):
            continue  # export ran again: its peak_memory is this run's (issue 54 item 5)
        assert export_key in line or "cnn.py" in line or script_hash in line or "recipes/models" in line, line
    _git(ws, "checkout", "--", "recipes/models/cnn.py")
    document = build_json(ws, timeout=900)
    assert set(statuses(document, "cnn").values()) == {"cached"}, document
    assert lock.read_text() == committed
    assert _git(ws, "status", "--porcelain") == ""


@pytest.mark.slow
def test_a_batch_option_changed_and_reverted_leaves_the_checkout_clean(keras_repo):
    ws = keras_repo
    recipe = ws / "recipes" / "cnn.yaml"
    recipe.write_text(RECIPE.replace("batch_timeout_micros: 1000", "batch_timeout_micros: 3000"))
    document = build_json(ws, timeout=900)
    assert statuses(document, "cnn")["batch"] == "built", document
    recipe.write_text(RECIPE)
    document = build_json(ws, timeout=900)
    stages = statuses(document, "cnn")
    # Every stage's record is cached; the reverted model is published again, as the newest
    # number (a server serves the highest), with the committed lock file.
    assert stages.pop("publish") == "built", document
    assert set(stages.values()) == {"cached"}, document
    assert _versions(ws)[-1] == str(document["versions"]["cnn"])
    assert _git(ws, "status", "--porcelain") == ""


@pytest.mark.slow
def test_gc_then_build_is_all_cached(keras_repo):
    """gc keeps what the last build used, the keys of measured stages included."""
    ws = keras_repo
    result = tpubuild(ws, "gc", "--keep-days", "0")
    assert result.returncode == 0, result.stderr
    document = build_json(ws, timeout=900)
    assert set(statuses(document, "cnn").values()) == {"cached"}, document
    assert _git(ws, "status", "--porcelain") == ""


@pytest.mark.slow
def test_the_bfloat16_artifact_keeps_no_float32_copy_of_a_weight(keras_repo):
    import tensorflow as tf

    ws = keras_repo
    lock = json.loads(tpubuild(ws, "build", "--json").stdout)
    keys = {row["stage"]: row["key"] for row in lock["rows"] if row["recipe"] == "cnn"}
    record = ws / ".tpubuild" / "cache" / "v1" / "stages" / keys["export"][:2] / f"{keys['export']}.json"
    export_files = json.loads(record.read_text())["files"]
    export_bytes = sum(size for path, _, size in export_files if path.startswith("variables/"))
    published = ws / "out" / "cnn" / "1" / "variables"
    published_bytes = sum(p.stat().st_size for p in published.iterdir())
    assert published_bytes <= 0.55 * export_bytes, (published_bytes, export_bytes)
    reader = tf.train.load_checkpoint(str(published / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    assert not [k for k in dtypes if k.startswith("_all_variables/")], sorted(dtypes)
    floats = {k: d for k, d in dtypes.items() if d.is_floating}
    # Every weight the TPU function reads is converted; Dropout's seed state is an integer.
    assert floats and all(d == tf.bfloat16 for d in floats.values()), floats


@pytest.mark.slow
def test_a_keras_export_given_as_saved_model_loses_its_aliases_at_placement(tmp_path):
    """A `saved_model:` source is the user's bytes, aliases included: the tpu stage, the
    first to write a model, drops them, so the bfloat16 artifact has no float32 copy."""
    import tensorflow as tf

    from tests.realmodels import keras_exports

    ws = tmp_path / "ws"
    (ws / "recipes").mkdir(parents=True)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    keras_exports.export_functional(str(ws / "models" / "functional"))
    (ws / "recipes" / "f.yaml").write_text(RECIPE.replace("export: {script: models/cnn.py}",
                                                          "saved_model: ../models/functional"))
    build_json(ws, timeout=900)
    reader = tf.train.load_checkpoint(str(ws / "out" / "f" / "1" / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    assert not [k for k in dtypes if k.startswith("_all_variables/")], sorted(dtypes)
    assert all(d == tf.bfloat16 for d in dtypes.values() if d.is_floating), dtypes
