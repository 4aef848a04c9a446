"""The canonical converter case: strings tokenized by tensorflow_text on the CPU, a BERT
encoder (keras_hub, from a config) on the TPU. It builds only with `op_libraries`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli import tpubuild
from tests.engine.conftest import build_json, statuses
from tests.realmodels import bert_text

RECIPE = """\
name: bert
model:
  export: {script: models/bert_text.py, function: export}
%sconverter:
  tpu_functions:
    - function_alias: tpu_func
verify:
  representative_datasets:
    serving_default: {tfrecord_file_path: data/bert.tfrecord}
"""


@pytest.fixture(scope="session")
def bert_workspace(tmp_path_factory) -> tuple[Path, str, dict]:
    """The recipe built first without op_libraries (stderr kept), then with them."""
    ws = tmp_path_factory.mktemp("bert") / "ws"
    (ws / "recipes" / "models").mkdir(parents=True)
    (ws / "recipes" / "data").mkdir()
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    shutil.copy(Path(bert_text.__file__), ws / "recipes" / "models" / "bert_text.py")
    bert_text.write_samples(str(ws / "recipes" / "data" / "bert.tfrecord"))
    (ws / "recipes" / "bert.yaml").write_text(RECIPE % "")
    without = tpubuild(ws, "build")
    assert without.returncode == 1, without.stderr
    (ws / "recipes" / "bert.yaml").write_text(RECIPE % "op_libraries: [tensorflow_text]\n")
    return ws, without.stderr, build_json(ws)


@pytest.mark.slow
def test_without_op_libraries_the_missing_op_is_one_line_naming_the_setting(bert_workspace):
    _, stderr, _ = bert_workspace
    # The first stage that needs the op registered says so: verify, which runs the model
    # (tpu's XLA check reads only the TPU function's closure, which has no text op).
    missing = [line for line in stderr.splitlines() if "CaseFoldUTF8" in line]
    assert missing == [("recipes/bert.yaml: stage verify: op CaseFoldUTF8 is not registered: add its library to "
                        "op_libraries, e.g. tensorflow_text")], stderr
    assert "internal error" not in stderr and "Traceback" not in stderr


@pytest.mark.slow
def test_with_op_libraries_it_builds_verifies_on_strings_and_passes_the_runtime_rules(bert_workspace):
    ws, _, document = bert_workspace
    assert set(statuses(document, "bert").values()) == {"built"}, statuses(document, "bert")
    report = json.loads((ws / "out" / "bert" / "1" / "tpubuild-report.json").read_text())
    # Verified on the string samples, through the tokenizer, against the source.
    assert report["verify"]["passed"] is True
    assert report["verify"]["samples"]["serving_default"] == {"count": 8, "from": "representative_dataset"}
    assert report["hlo"], "the TPU function's HLO was not lowered by the MLIR bridge"


@pytest.mark.slow
def test_the_published_model_serves_strings_with_the_library_loaded(bert_workspace):
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the tokenizer's ops, as the serving binary must

    from tpubuild.tpu.twin import make_cpu_twin
    from tpubuild.verify.serving_load import check_serving_load

    ws, _, _ = bert_workspace
    artifact = ws / "out" / "bert" / "1"
    check_serving_load(artifact, ["serve"], "the BERT TPU SavedModel")
    twin = ws.parent / "twin"
    twin.mkdir(exist_ok=True)
    make_cpu_twin(artifact, twin, ["serve"])
    out = tf.saved_model.load(str(twin)).signatures["serving_default"](
        text=tf.constant(bert_text.sentences(3, seed=5)))["pooled"].numpy()
    assert out.shape == (3, 16) and np.isfinite(out).all()
