"""The quantize stage: TF's quantizer with each method, on CPU, with the summary captured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.stage_helpers import Runner, dense_samples
from tests.tolerances import INT8, assert_close
from tpubuild.errors import ConversionError, StageError
from tpubuild.quantize.datasets import write_tfrecord

TAGS = ["serve"]


def options(method: str, datasets: dict | None = None) -> dict:
    return {
        "tags": TAGS, "method": method, "signature_keys": ["serving_default"], "op_set": "XLA",
        "representative_datasets": datasets or {},
    }


def int8_weights(path: Path) -> int:
    """Elements of int8 constants in the artifact's graph (where the quantizer puts weights)."""
    from tpubuild.savedmodel.model import SavedModel

    model = SavedModel.load(path, TAGS)
    total = 0
    for fdef in model.functions.values():
        for node in fdef.node_def:
            if node.op == "Const" and node.attr["dtype"].type == tf.int8.as_datatype_enum:
                total += int(np.prod([d.size for d in node.attr["value"].tensor.tensor_shape.dim]))
    return total


def run_both(source: Path, artifact: Path, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    x = np.stack([s["x"][0] for s in dense_samples(16, seed=seed)])
    want = tf.saved_model.load(str(source)).signatures["serving_default"](x=tf.constant(x))["logits"]
    got = tf.saved_model.load(str(artifact)).signatures["serving_default"](x=tf.constant(x))["logits"]
    return want.numpy(), got.numpy()


def test_dynamic_range_summary_is_captured(runner: Runner, dense: Path) -> None:
    out, result = runner.run("quantize", dense, options("DYNAMIC_RANGE"))
    assert result.summary["layers"] == {"MatMul": {"quantized": 2, "total": 2}}
    assert result.summary["text"][0] == "-------- Quantization Summary --------"
    assert result.summary["counts"]["quantized_layers_with_quantized_outputs"] == [2, 2]


@pytest.mark.parametrize("method", ["DYNAMIC_RANGE", "WEIGHT_ONLY"])
def test_methods_without_dataset_make_int8_weights(runner: Runner, dense: Path, method: str) -> None:
    out, result = runner.run("quantize", dense, options(method))
    assert result.summary["method"] == method
    assert result.summary["parameters"]["int8"]["elements"] == 64 * 128 + 128 * 10
    # The float32 left is the bias (128) only; no variables survive quantization.
    assert result.summary["parameters"]["float32"]["elements"] == 128
    assert int8_weights(out) == 64 * 128 + 128 * 10
    want, got = run_both(dense, out)
    assert_close(got, want, INT8)  # int8 weights against float32 ones


def test_static_range_calibrates_on_a_tfrecord_file(runner: Runner, dense: Path) -> None:
    write_tfrecord(runner.workspace / "calib.tfrecord", "serving_default", dense_samples(40))
    out, result = runner.run(
        "quantize", dense, options("STATIC_RANGE", {"serving_default": {"tfrecord_file_path": "calib.tfrecord"}})
    )
    assert result.summary["layers"] == {"MatMul": {"quantized": 2, "total": 2}}
    assert result.summary["counts"]["quantize_layers_added"] == 1
    assert result.summary["samples"] == {"serving_default": 40}
    assert result.warnings == [
        "quantization (STATIC_RANGE): representative_datasets.serving_default: calib.tfrecord: "
        "only 40 samples; the converter recommends at least 200 for calibration"
    ]
    assert int8_weights(out) == 64 * 128 + 128 * 10
    # Static ranges hold for inputs like the calibration samples (outliers get clipped).
    want, got = run_both(dense, out, seed=0)
    assert_close(got, want, INT8)  # int8 weights and activations against float32


def test_static_range_uses_the_generated_dataset(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.concatenate([s["x"] for s in dense_samples(200)]))
    runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": {"npz": "calib.npz"}}})
    out, result = runner.run("quantize", dense, options("STATIC_RANGE", {"serving_default": {"npz": "calib.npz"}}))
    assert result.summary["samples"] == {"serving_default": 200}
    assert result.warnings == []
    assert int8_weights(out) > 0


def test_static_range_without_dataset_is_an_error(runner: Runner, dense: Path) -> None:
    with pytest.raises(StageError) as err:
        runner.run("quantize", dense, options("STATIC_RANGE"))
    assert str(err.value) == (
        "quantization (STATIC_RANGE): signature 'serving_default' has no representative dataset; "
        "STATIC_RANGE calibrates on one"
    )


def test_tfrecord_with_wrong_input_names_names_the_input(runner: Runner, dense: Path) -> None:
    write_tfrecord(runner.workspace / "calib.tfrecord", "serving_default", [{"image": np.zeros((1, 64), np.float32)}])
    with pytest.raises(StageError) as err:
        runner.run("quantize", dense, options("STATIC_RANGE", {"serving_default": {"tfrecord_file_path": "calib.tfrecord"}}))
    assert str(err.value) == (
        "quantization (STATIC_RANGE): representative_datasets.serving_default: calib.tfrecord: sample 0: "
        "input 'image' is not an input of the signature; its inputs: x"
    )


def test_quantizer_failure_is_one_line_naming_the_recipe(runner: Runner, dense: Path) -> None:
    # TF's quantizer refuses weight-only with the TF op set: its own error, on one line.
    opts = {**options("WEIGHT_ONLY"), "op_set": "TF"}
    with pytest.raises(ConversionError) as err:
        runner.run("quantize", dense, opts)
    assert str(err.value) == (
        "quantization (WEIGHT_ONLY): TensorFlow's quantizer failed: "
        "TF/Uniform quantized opset does not support weight-only."
    )
