"""Keras 3 architectures, exported the converter guide's way, built through every stage.

One workspace, built once per session: MobileNetV2 (alpha 0.35, 32x32) with bfloat16 on
the TPU function, a CPU SavedModel and a float16 LiteRT flatbuffer; the same MobileNetV2
with static-range int8 quantization; an Embedding + LSTM classifier with a CPU SavedModel,
a float LiteRT flatbuffer and an XLA AOT library. Keras 3 saves each weight with a second,
never-restored handle (keras-team/keras#19274): every artifact here must load and run in
TF Serving's session-based loader, not only in TF2's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.engine.conftest import build_json, statuses
from tests.realmodels import keras_models
from tests.realmodels.workspaces import model_workspace
from tests.tolerances import REORDERED, assert_close, computes_in, softmax_sum_atol

MODELS = Path(__file__).parent / "keras_models.py"

RECIPES = {
    "keras_mobilenet": """\
name: keras_mobilenet
model:
  export: {script: models/keras_models.py, function: export_mobilenet}
converter:
  tpu_functions:
    - function_alias: tpu_func
  bfloat16_optimization: ENABLED
  bfloat16_optimization_options: {scope: TPU}
verify:
  samples: 8
targets:
  tpu_savedmodel: {}
  cpu_savedmodel: {}
  litert: {quantization: float16}
""",
    "keras_mobilenet_int8": """\
name: keras_mobilenet_int8
model:
  export: {script: models/keras_models.py, function: export_mobilenet}
converter:
  tpu_functions:
    - function_alias: tpu_func
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default:
        generator: recipes.models.keras_models:image_samples
        num_samples: 32
targets:
  tpu_savedmodel: {}
  cpu_savedmodel: {}
""",
    "keras_lstm": """\
name: keras_lstm
model:
  export: {script: models/keras_models.py, function: export_lstm}
converter:
  tpu_functions:
    - function_alias: tpu_func
verify:
  samples: 8
targets:
  tpu_savedmodel: {}
  cpu_savedmodel: {}
  litert: {quantization: none}
  xla_aot: {signatures: [serving_default], batch_sizes: [1]}
""",
}


@pytest.fixture(scope="session")
def keras_built(tmp_path_factory) -> tuple[Path, dict]:
    ws = tmp_path_factory.mktemp("keras") / "ws"
    model_workspace(ws, MODELS, RECIPES)
    # Three real models through every stage and target: minutes on a slow 2-core machine.
    return ws, build_json(ws, timeout=900)


def _session_run(path: Path, tags: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Load as TF Serving's SavedModelBundle does (a v1 Session, restore, init) and run
    serving_default: a weight whose handle the checkpoint never restored fails here."""
    import tensorflow as tf

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, tags, str(path))
        signature = meta_graph.signature_def["serving_default"]
        fetches = {k: v.name for k, v in signature.outputs.items()}
        return session.run(fetches, {signature.inputs[k].name: v for k, v in feed.items()})


@pytest.mark.slow
def test_every_stage_builds_on_keras_3_models(keras_built):
    _, document = keras_built
    for recipe in RECIPES:
        assert set(statuses(document, recipe).values()) == {"built"} | (
            {"cached"} if recipe == "keras_mobilenet_int8" else set()), statuses(document, recipe)


@pytest.mark.slow
def test_the_export_merged_the_duplicate_handles(keras_built):
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.savedmodel.variable_handles import find_duplicate_handles

    ws, _ = keras_built
    for recipe in RECIPES:
        model = SavedModel.load(ws / "out" / recipe / "1")
        assert find_duplicate_handles(model.meta_graph) == [], recipe


@pytest.mark.slow
def test_cpu_savedmodels_run_in_the_session_loader_like_the_source(keras_built):
    import tensorflow as tf

    ws, _ = keras_built
    feeds = {"keras_mobilenet": {"images": keras_models.images(2, seed=9)},
             "keras_mobilenet_int8": {"images": keras_models.images(2, seed=9)},
             "keras_lstm": {"ids": keras_models.token_ids(1, seed=9)}}
    for recipe, feed in feeds.items():
        path = ws / "out" / recipe / "cpu_savedmodel" / "1"
        got = _session_run(path, ["serve"], feed)["probabilities"]
        want = tf.saved_model.load(str(path)).signatures[
            "serving_default"](**{k: tf.constant(v) for k, v in feed.items()})["probabilities"].numpy()
        # Same graph, same weights, two loaders: only kernel scheduling may differ, which
        # reorders roundings of the precision the artifact computes in (these recipes' CPU
        # SavedModels keep bfloat16 where bfloat16_optimization, ENABLED by default, put it).
        assert_close(got, want, REORDERED[computes_in(path)], recipe)
        # A softmax of restored weights: its outputs sum to 1 within its own roundings.
        precision = computes_in(path, op="Softmax")
        np.testing.assert_allclose(got.sum(axis=-1), 1, rtol=0, atol=softmax_sum_atol(precision, keras_models.CLASSES),
                                   err_msg=f"{recipe}: softmax computed in {precision}")


@pytest.mark.slow
def test_tpu_savedmodels_restore_in_the_session_loader(keras_built):
    import tensorflow as tf

    ws, _ = keras_built
    for recipe in RECIPES:
        graph = tf.Graph()
        with tf.compat.v1.Session(graph=graph) as session:
            tf.compat.v1.saved_model.loader.load(session, ["serve"], str(ws / "out" / recipe / "1"))


@pytest.mark.slow
def test_litert_flatbuffers_hold_constants_and_run(keras_built):
    from ai_edge_litert.interpreter import Interpreter

    ws, _ = keras_built
    for recipe, feed in (("keras_mobilenet", keras_models.images(1, seed=4)),
                         ("keras_lstm", keras_models.token_ids(1, seed=4))):
        facts = json.loads((ws / "out" / recipe / "litert" / "1" / "litert.json").read_text())
        assert not {"VAR_HANDLE", "READ_VARIABLE"} & set(facts["ops"]), facts["ops"]
        interpreter = Interpreter(model_path=str(ws / "out" / recipe / "litert" / "1" / "model.tflite"))
        runner = interpreter.get_signature_runner("serving_default")
        (out,) = runner(**{next(iter(runner.get_input_details())): feed}).values()
        assert np.isfinite(out).all() and np.allclose(out.sum(axis=-1), 1, atol=1e-2), (recipe, out)


@pytest.mark.slow
def test_xla_aot_compiled_the_lstm(keras_built):
    ws, document = keras_built
    assert statuses(document, "keras_lstm")["xla_aot_verify"] == "built"
    assert (ws / "out" / "keras_lstm" / "xla_aot" / "1" / "serving_default_b1.o").stat().st_size > 0


def test_session_loader_check_rejects_a_raw_keras_export(tmp_path):
    """What the verify stages now check: Keras 3's raw export fails TF Serving's loader,
    with the variable named, until its handles are merged."""
    from tpubuild.errors import ConversionError
    from tpubuild.savedmodel.variable_handles import normalize_in_place
    from tpubuild.verify.serving_load import check_serving_load

    raw = tmp_path / "raw"
    keras_models.export_lstm(str(raw))
    with pytest.raises(Exception, match="Could not find variable|uninitialized"):
        _session_run(raw, ["serve"], {"ids": keras_models.token_ids(1)})
    with pytest.raises(ConversionError, match="never restored"):
        check_serving_load(raw, ["serve"], "the raw export")
    # TF's LiteRT converter on the raw export keeps the weights as variables, which the
    # litert stage refuses (a flatbuffer that would run on uninitialized weights).
    from tpubuild.errors import StageError
    from tpubuild.targets.litert import convert as litert_convert
    from tpubuild.targets.litert import flatbuffer as litert_inspect
    from tpubuild.targets.litert.stage import _refuse_unfrozen_weights

    ops = litert_inspect.op_counts(litert_convert.convert(raw, ["serve"], ["serving_default"], "none", False, None))
    assert ops.get("VAR_HANDLE") and ops.get("READ_VARIABLE"), ops
    with pytest.raises(StageError, match="still reads variables"):
        _refuse_unfrozen_weights(ops)
    # The XLA AOT compiler's freezer fails on it too; the error quotes the cause, not TF's
    # `Graph execution error:` header.
    from tpubuild.targets.xla_aot import libraries as xla_aot

    (job,) = xla_aot.plan_jobs(["serving_default"], [1])
    (tmp_path / "aot").mkdir()
    result = xla_aot.run_compiler(raw, ["serve"], [job], tmp_path / "aot", lambda line: None)[job.prefix]
    assert "Could not find variable" in result["error"], result
    assert normalize_in_place(raw), "no duplicate handle found in a Keras 3 export"
    _session_run(raw, ["serve"], {"ids": keras_models.token_ids(1)})
    check_serving_load(raw, ["serve"], "the merged export")
    with pytest.raises(ConversionError, match="session-based loader"):
        check_serving_load(tmp_path, ["serve"], "an empty directory")
