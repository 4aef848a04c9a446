"""Keras 3's own export paths (`model.export()`, `keras.export.ExportArchive`, keras_hub),
built through every stage with the export scripts exactly as Keras's documentation writes them.

One workspace, built once per session (tests/realmodels/keras_exports.py is its export
script). Keras's export saves each inner `tf.Variable` twice and stands a third, copied
variable for each Keras variable (savedmodel/variable_handles.py): every published
version, TPU and CPU, must restore every variable and run in TF Serving's session-based
loader, not only in TF2's `tf.saved_model.load`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli import tpubuild
from tests.engine.conftest import statuses
from tests.realmodels import keras_exports
from tests.realmodels.test_keras_models import _session_run
from tests.realmodels.workspaces import model_workspace
from tests.tolerances import REORDERED, assert_close, computes_in

MODELS = Path(__file__).parent / "keras_exports.py"
BATCHING = """\
  batch_options:
    - {max_batch_size: 4, allowed_batch_sizes: [2, 4], batch_timeout_micros: 1000}
"""
TARGETS = """\
targets:
  tpu_savedmodel: {}
  cpu_savedmodel: {}
verify:
  samples: 4
"""


def _recipe(name: str, function: str, placement: str, converter: str = "") -> str:
    return (f"name: {name}\nmodel:\n  export: {{script: models/keras_exports.py, function: {function}}}\n"
            f"converter:\n  tpu_functions:\n    - {placement}\n{converter}{TARGETS}")


BFLOAT16 = "  bfloat16_optimization: ENABLED\n  bfloat16_optimization_options: {scope: TPU}\n"
RECIPES = {
    # model.export(): the endpoint is a signature (`serve`, `serving_default`); Keras
    # gives no way to pass SaveOptions, so placement is by signature.
    "keras_sequential": _recipe("keras_sequential", "export_sequential", "signature_name: serving_default",
                                BATCHING + BFLOAT16),
    "keras_functional": _recipe("keras_functional", "export_functional", "signature_name: serving_default",
                                BATCHING + BFLOAT16),
    "keras_subclassed_int8": _recipe("keras_subclassed_int8", "export_subclassed", "signature_name: serving_default", """\
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default:
        generator: recipes.models.keras_exports:feature_samples
        num_samples: 64
"""),
    # ExportArchive.write_out takes SaveOptions: the TPU endpoint by its function alias.
    "keras_archive": _recipe("keras_archive", "export_archive", "function_alias: tpu_func", BATCHING + BFLOAT16),
    # Token ids: random integers would index past the 2-row segment embedding, so verify
    # takes its samples from a TFRecord (written by make_workspace).
    "keras_hub": _recipe("keras_hub", "export_keras_hub", "signature_name: serving_default", BATCHING) + """\
  representative_datasets:
    serving_default: {tfrecord_file_path: data/token_ids.tfrecord}
    serve: {tfrecord_file_path: data/token_ids_serve.tfrecord}
""",
}
FEEDS = {
    "keras_sequential": lambda: {"keras_tensor": keras_exports.features(3, seed=9)},
    "keras_functional": lambda: {"keras_tensor": keras_exports.images(3, seed=9)},
    "keras_subclassed_int8": lambda: {"args_0": keras_exports.features(3, seed=9)},
    "keras_archive": lambda: {"x": keras_exports.features(3, seed=9)},
    "keras_hub": lambda: keras_exports.token_inputs(3, seed=9),
}


def make_workspace(ws: Path) -> None:
    model_workspace(ws, MODELS, RECIPES)
    from tpubuild.quantize.datasets import write_tfrecord

    (ws / "recipes" / "data").mkdir()
    for key, file in (("serving_default", "token_ids"), ("serve", "token_ids_serve")):
        rows = keras_exports.token_inputs(4, seed=1)
        write_tfrecord(ws / "recipes" / "data" / f"{file}.tfrecord", key,
                       [{k: v[i:i + 1] for k, v in rows.items()} for i in range(4)])


@pytest.fixture(scope="session")
def keras_exported(tmp_path_factory) -> tuple[Path, dict]:
    ws = tmp_path_factory.mktemp("keras-export") / "ws"
    make_workspace(ws)
    # Five exports, each a fresh worker importing TensorFlow and Keras: about two minutes
    # alone, more on a loaded machine than build_json's default 300 s allows.
    result = tpubuild(ws, "build", "--json", timeout=900)
    assert result.returncode == 0, result.stderr
    return ws, json.loads(result.stdout)


def _published(ws: Path, recipe: str) -> list[Path]:
    """Every published version: the TPU SavedModel and the CPU target's."""
    return [ws / "out" / recipe / "1", ws / "out" / recipe / "cpu_savedmodel" / "1"]


def _input_names(path: Path) -> list[str]:
    from tpubuild.savedmodel.model import SavedModel

    return sorted(SavedModel.load(path).meta_graph.signature_def["serving_default"].inputs)


@pytest.mark.slow
def test_every_keras_export_path_builds_every_stage(keras_exported):
    _, document = keras_exported
    for recipe in RECIPES:
        stages = statuses(document, recipe)
        assert set(stages.values()) == {"built"}, (recipe, stages)
        assert {"tpu", "io_shape", "verify", "cpu_savedmodel_verify"} <= set(stages), (recipe, stages)
    for recipe in ("keras_sequential", "keras_functional", "keras_archive", "keras_hub"):
        assert "batch" in statuses(document, recipe), recipe
    for recipe in ("keras_sequential", "keras_functional", "keras_archive"):
        assert "bfloat16" in statuses(document, recipe), recipe
    assert "quantize" in statuses(document, "keras_subclassed_int8")


@pytest.mark.slow
def test_no_unknown_rank_warning(keras_exported):
    """Keras's endpoints are signature wrappers: the TPU body split from one has no
    object-graph record, and its output shapes come from shape inference."""
    _, document = keras_exported
    warnings = [w for row in document["rows"] for w in row.get("warnings", [])]
    assert not [w for w in warnings if "unknown rank" in w], warnings


@pytest.mark.slow
def test_every_placement_has_its_hlo_and_cost_in_the_report(keras_exported):
    """model.export() is placed by signature: the TPU body split from the signature has no
    object-graph record, and its variables come from the signature's captures
    (tpu/captures.py). No `no HLO` warning; each report holds the body's HLO, taking the
    input at batch size one and every variable it reads, and its cost."""
    from tpubuild.savedmodel.model import SavedModel

    ws, document = keras_exported
    warnings = [w for row in document["rows"] for w in row.get("warnings", [])]
    assert not [w for w in warnings if "HLO" in w], warnings
    for recipe in RECIPES:
        version = ws / "out" / recipe / "1"
        report = json.loads((version / "tpubuild-report.json").read_text())
        (entry,) = report["hlo"].values()
        (row,) = report["cost"]["tpu_functions"]
        assert row["function"] == entry["function"] and row["cost"] > 0, (recipe, report["cost"])
        hlo = (version / entry["file"]).read_text()
        entry_line = next(line for line in hlo.splitlines() if line.startswith("ENTRY "))
        body = SavedModel.load(version).functions[entry["function"]]
        # One HLO parameter per argument of the body: its inputs and its variables.
        assert entry_line.count(": ") == len(body.signature.input_arg), (recipe, entry_line)
        assert "[1," in entry_line, (recipe, entry_line)


@pytest.mark.slow
def test_every_published_version_restores_and_runs_in_the_session_loader(keras_exported):
    import tensorflow as tf

    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.savedmodel.variable_handles import (
        find_duplicate_handles,
        find_unused_handles,
    )
    from tpubuild.verify.serving_load import check_serving_load

    ws, _ = keras_exported
    for recipe, feed_of in FEEDS.items():
        for path in _published(ws, recipe):
            model = SavedModel.load(path)
            assert not find_duplicate_handles(model.meta_graph) and not find_unused_handles(model.meta_graph), path
            check_serving_load(path, ["serve"], str(path))  # every variable restored
            if path.parent.name == recipe:
                continue  # TPU ops: the TPU SavedModel loads here but runs only on a TPU host
            feed = feed_of()
            assert sorted(feed) == _input_names(path), path
            got = _session_run(path, ["serve"], feed)
            want = tf.saved_model.load(str(path)).signatures["serving_default"](
                **{k: tf.constant(v) for k, v in feed.items()})
            precision = computes_in(path)
            for key, value in got.items():
                # Same graph and weights, two loaders: kernels and their fusions may round
                # differently, by units of the precision the artifact computes in (the
                # recipes with bfloat16_optimization keep bfloat16 in their CPU SavedModel).
                if precision == "bfloat16":
                    assert_close(value, want[key].numpy(), REORDERED[precision], f"{path} {key}")
                else:
                    # The tiny BERT's logits (~1e-3) are differences of O(1) activations
                    # (layer norm, GELU), so the float32 bound is absolute: seen 1.5e-5.
                    np.testing.assert_allclose(value, want[key].numpy(), rtol=1e-5, atol=1e-4,
                                               err_msg=f"{path} {key}")
                assert value.shape[0] == 3 and np.isfinite(value).all(), (path, key, value)


def test_a_raw_keras_export_loses_its_unused_handles_and_then_restores_everything(tmp_path):
    """What the export stage fixes: Keras's export leaves, per weight, a handle nothing
    reads or restores (savedmodel/variable_handles.py) beside the duplicate it restores."""
    from tpubuild.errors import ConversionError
    from tpubuild.savedmodel.variable_handles import (
        Duplicate,
        Unused,
        normalize_in_place,
    )
    from tpubuild.verify.serving_load import check_serving_load

    raw = tmp_path / "raw"
    keras_exports.export_sequential(str(raw))
    with pytest.raises(ConversionError, match="never restored"):
        check_serving_load(raw, ["serve"], "the raw export")
    changed = normalize_in_place(raw)
    weights = 4  # two Dense layers: kernel and bias each
    # Dropout's seed generator state is a Keras variable too, but no endpoint captures it:
    # exported once, it has Keras's copy and no unused twin.
    assert sum(isinstance(c, Duplicate) for c in changed) == weights + 1, changed
    assert sum(isinstance(c, Unused) for c in changed) == weights, changed
    assert normalize_in_place(raw) == []  # idempotent
    check_serving_load(raw, ["serve"], "the normalized export")
