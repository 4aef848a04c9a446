"""The verify stage: source vs artifact on samples, thresholds from the recipe or the defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.stage_helpers import Runner
from tests.tolerances import FLOAT32_REORDERED
from tpubuild.errors import StageError
from tpubuild.quantize.datasets import random_samples, signature_inputs, write_tfrecord
from tpubuild.savedmodel.model import SavedModel

TAGS = ["serve"]


def verify_options(applied: list[str], rtol: float | None = None, atol: float | None = None, datasets=None) -> dict:
    return {
        "tags": TAGS, "applied": applied, "representative_datasets": datasets or {},
        "samples": 8, "seed": 0, "rtol": rtol, "atol": atol,
    }


@pytest.fixture
def quantized(runner: Runner, dense: Path) -> Path:
    runner.inputs["source"] = dense
    out, _ = runner.run(
        "quantize", dense,
        {"tags": TAGS, "method": "DYNAMIC_RANGE", "signature_keys": ["serving_default"], "op_set": "XLA",
         "representative_datasets": {}},
    )
    return out


def test_unchanged_model_passes_exactly(runner: Runner, dense: Path) -> None:
    runner.inputs["source"] = dense
    out, result = runner.run("verify", dense, verify_options([]))
    summary = result.summary
    assert summary["passed"] is True
    # The source against itself, batch for batch: 0 here, but TF's kernels promise no
    # bit-reproducibility, so within ulps of the largest output (tests/tolerances.py).
    assert summary["max_rel_error"] <= FLOAT32_REORDERED.rtol
    assert summary["tolerance"] == {
        "kind": "exact", "rtol": 1e-5, "atol": 1e-6, "given": {"rtol": None, "atol": None}
    }
    assert summary["samples"] == {"serving_default": {"count": 8, "from": "random"}}
    [output] = summary["outputs"]
    assert (output["signature"], output["output"], output["elements"]) == ("serving_default", "logits", 80)
    assert output["argmax_agreement"] == 1.0
    assert json.loads((out / "verify.json").read_text()) == summary


def test_int8_artifact_passes_with_the_int8_defaults(runner: Runner, dense: Path, quantized: Path) -> None:
    _, result = runner.run("verify", quantized, verify_options(["quantize"]))
    summary = result.summary
    assert summary["passed"] is True
    assert summary["tolerance"]["kind"] == "int8"
    assert 0 < summary["max_rel_error"] < summary["tolerance"]["rtol"]


def test_too_tight_tolerance_fails_with_the_measured_error(runner: Runner, dense: Path, quantized: Path) -> None:
    with pytest.raises(StageError) as err:
        runner.run("verify", quantized, verify_options(["quantize"], rtol=1e-4, atol=1e-5))
    message = str(err.value)
    match = re.fullmatch(
        r"signature 'serving_default' output 'logits' differs from the source: "
        r"max abs error (\S+) > (\S+) \(atol 1e-05 \+ rtol 0\.0001 x max\|output\| (\S+)\); "
        r"max rel error (\S+), (\d+)/80 elements outside, argmax agreement (\S+)%; "
        r"`tpubuild explain-error` on this recipe names the ops where it starts and the recipe change that fixes it",
        message,
    )
    assert match, message
    # The numbers in the message are the real ones: recompute them here.
    samples = random_samples(signature_inputs(SavedModel.load(dense, TAGS), "serving_default"), 8, 0)
    # One call per sample: dynamic range quantizes each call's activations on their own range.
    source_fn = tf.saved_model.load(str(dense)).signatures["serving_default"]
    artifact_fn = tf.saved_model.load(str(quantized)).signatures["serving_default"]
    want = np.stack([source_fn(x=tf.constant(s["x"]))["logits"].numpy() for s in samples])
    got = np.stack([artifact_fn(x=tf.constant(s["x"]))["logits"].numpy() for s in samples])
    assert float(match[1]) == pytest.approx(np.max(np.abs(want - got)), rel=1e-3)
    assert float(match[3]) == pytest.approx(np.max(np.abs(want)), rel=1e-3)
    assert float(match[2]) == pytest.approx(1e-5 + 1e-4 * np.max(np.abs(want)), rel=1e-3)


def test_verify_uses_the_representative_dataset(runner: Runner, dense: Path) -> None:
    rng = np.random.default_rng(4)
    write_tfrecord(
        runner.workspace / "calib.tfrecord", "serving_default",
        [{"x": rng.standard_normal((3, 64)).astype(np.float32)} for _ in range(5)],
    )
    runner.inputs["source"] = dense
    _, result = runner.run(
        "verify", dense, verify_options([], datasets={"serving_default": {"tfrecord_file_path": "calib.tfrecord"}})
    )
    assert result.summary["samples"] == {"serving_default": {"count": 5, "from": "representative_dataset"}}
    assert result.summary["outputs"][0]["elements"] == 5 * 3 * 10


def test_given_tolerance_overrides_only_what_is_given(runner: Runner, dense: Path) -> None:
    runner.inputs["source"] = dense
    _, result = runner.run("verify", dense, verify_options(["bfloat16"], atol=0.5))
    assert result.summary["tolerance"] == {
        "kind": "bfloat16", "rtol": 2e-2, "atol": 0.5, "given": {"rtol": None, "atol": 0.5}
    }


def test_the_verdict_says_which_inputs_it_used_and_random_inputs_are_measured_too(
        runner: Runner, dense: Path, quantized: Path) -> None:
    rng = np.random.default_rng(5)
    write_tfrecord(
        runner.workspace / "realistic.tfrecord", "serving_default",
        [{"x": (rng.standard_normal((2, 64)) * 0.1).astype(np.float32)} for _ in range(4)],
    )
    datasets = {"serving_default": {"tfrecord_file_path": "realistic.tfrecord"}}
    _, result = runner.run("verify", quantized, verify_options(["quantize"], datasets=datasets))
    summary = result.summary
    assert summary["verdict_on"] == "representative_dataset"
    other = summary["random_inputs"]
    # The same comparison on `samples` seeded random inputs, beside the verdict, not in it.
    assert other["signatures"] == ["serving_default"]
    assert other["outputs"][0]["elements"] == 8 * 1 * 10  # 8 samples of batch 1 (unknown dims become 1)
    assert other["max_rel_error"] > 0 and isinstance(other["within_tolerance"], bool)
    from tpubuild.report.formats import inputs_lines

    lines = inputs_lines(summary)
    assert lines[0] == "Verdict on the representative dataset."
    assert lines[1].startswith("On seeded random inputs (not part of the verdict): max abs error ")


def test_without_a_dataset_the_verdict_is_on_random_inputs_and_says_so(runner: Runner, dense: Path) -> None:
    runner.inputs["source"] = dense
    _, result = runner.run("verify", dense, verify_options([]))
    assert result.summary["verdict_on"] == "random" and "random_inputs" not in result.summary
    from tpubuild.report.formats import inputs_lines

    assert inputs_lines(result.summary) == [
        "Verdict on seeded random inputs.", "No representative dataset: the error on realistic inputs is unknown.",
    ]


@pytest.fixture(scope="module")
def lookup(tmp_path_factory) -> Path:
    """Rows of a two-row table by id: random ids (0 to 7) run past its rows."""

    class Lookup(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32, name="ids")])
        def serve(self, ids):
            return {"rows": tf.gather(self.table, ids)}

    path = tmp_path_factory.mktemp("lookup") / "model"
    model = Lookup()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def test_a_source_that_cannot_take_random_inputs_is_judged_on_the_dataset(runner: Runner, lookup: Path) -> None:
    write_tfrecord(runner.workspace / "ids.tfrecord", "serving_default",
                   [{"ids": np.array([[0, 1, 1]], np.int32)}, {"ids": np.array([[1, 0, 0]], np.int32)}])
    runner.inputs["source"] = lookup
    _, result = runner.run("verify", lookup, verify_options(
        [], datasets={"serving_default": {"tfrecord_file_path": "ids.tfrecord"}}))
    assert result.summary["passed"] is True and result.summary["verdict_on"] == "representative_dataset"
    assert result.summary["samples"]["serving_default"]["count"] == 2
    assert "fails on its verification samples" in result.summary["random_inputs"]["skipped"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """Scores and the class id (an argmax: int64) of 3 classes, as the example models serve them."""

    class Classifier(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            logits = tf.matmul(x, self.w)
            return {"logits": logits, "class_id": tf.argmax(logits, axis=-1)}

    path = tmp_path_factory.mktemp("classifier") / "model"
    model = Classifier()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def test_an_integer_output_is_compared_exactly_and_never_called_vacuous(runner: Runner, classifier: Path) -> None:
    """A class id is compared element for element: any difference fails, so no tolerance can
    make its comparison say nothing (verdict.is_vacuous), whatever its values."""
    from tpubuild.verify.compare import compare_outputs
    from tpubuild.verify.verdict import is_vacuous, vacuous_warnings

    runner.inputs["source"] = classifier
    _, result = runner.run("verify", classifier, verify_options(["bfloat16"]))
    assert result.warnings == [] and result.summary["vacuous"] == [] and result.summary["passed"] is True
    by_name = {o["output"]: o for o in result.summary["outputs"]}
    assert by_name["class_id"]["exact"] is True and by_name["logits"]["exact"] is False
    # All zeros in both: equal, judged, not vacuous; one id off: a failure, not a tolerance.
    zeros = np.zeros((4, 1), np.int64)
    (same,) = compare_outputs("k", {"id": zeros}, {"id": zeros.copy()}, 2e-2, 1e-3)
    (off,) = compare_outputs("k", {"id": zeros}, {"id": np.array([[0], [2], [0], [0]], np.int64)}, 2e-2, 1e-3)
    assert same.passed and not is_vacuous(same, 2e-2, 1e-3) and vacuous_warnings([same], 2e-2, 1e-3) == []
    assert (off.passed, off.mismatched) == (False, 1)
    # A float output that small is still vacuous: the rule holds where a tolerance applies.
    (tiny,) = compare_outputs("k", {"y": np.full((2, 1), 1e-9, np.float32)}, {"y": np.zeros((2, 1), np.float32)},
                              2e-2, 1e-3)
    assert tiny.passed and is_vacuous(tiny, 2e-2, 1e-3)
