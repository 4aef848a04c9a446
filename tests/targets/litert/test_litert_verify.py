"""The `litert_verify` stage: the flatbuffer in the LiteRT interpreter against the source in TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.targets.litert.conftest import IDS_DATASET
from tests.targets.litert.litert_helpers import Runner
from tpubuild.errors import StageError
from tpubuild.stages.base import StageResult


def test_fused_example_matches_its_source(runner: Runner, example: Path, fused: tuple[Path, StageResult]) -> None:
    output, result = runner.verify(example, fused[0])
    summary = result.summary
    assert summary["passed"] and summary["tolerance"]["kind"] == "exact"
    assert summary["samples"] == {"serving_default": {"count": 4, "from": "random"}}
    assert summary["fused"] == ["embedding_matmul", "lstm_all_targets"]
    assert summary["ops"] == fused[1].summary["ops"] and summary["size"] == fused[1].summary["size"]
    latency = summary["latency"]
    assert latency["runs"] == 50 and latency["litert_us"] > 0 and latency["source_tf_us"] > 0
    assert {o["output"] for o in summary["outputs"]} == {"logits", "probabilities"}
    assert json.loads((output / "litert_verify.json").read_text()) == summary


def test_unfused_example_matches_its_source(runner: Runner, example: Path, unfused: tuple[Path, StageResult]) -> None:
    _, result = runner.verify(example, unfused[0], {"composites": "none"})
    assert result.summary["passed"] and result.summary["fused"] == []


def test_verification_catches_a_mismatch_in_one_line(runner: Runner, workspace: Path, fused: tuple[Path, StageResult]) -> None:
    # The example's flatbuffer checked against a source with other weights.
    with pytest.raises(StageError) as raised:
        runner.verify(workspace / "models" / "other", fused[0])
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("signature 'serving_default' output ") and " differs from the source: max abs error " in message


def test_int8_matches_within_int8_tolerance_and_stays_quiet(
    runner: Runner, example: Path, fused: tuple[Path, StageResult], capfd: pytest.CaptureFixture[str]
) -> None:
    target = {"quantization": "int8"}
    datasets = {"serving_default": {"tfrecord_file_path": IDS_DATASET}}
    built, result = runner.build(example, target, verify_datasets=datasets)
    # int8 calibration is the noisiest conversion (C++ on stdout, the calibrating
    # tf.lite.Interpreter's warning, absl on stderr) and the interpreter logs its XNNPACK
    # delegate: none of it reaches the terminal.
    _, verified = runner.verify(example, built, target, verify_datasets=datasets)
    assert capfd.readouterr() == ("", "")
    assert result.summary["size"] < fused[1].summary["size"]
    assert result.summary["fused"] == ["embedding_matmul", "lstm_all_targets"]
    assert verified.summary["passed"] and verified.summary["tolerance"]["kind"] == "int8"
    assert verified.summary["samples"]["serving_default"] == {"count": 4, "from": "representative_dataset"}
    # Not float-exact: the tolerance is doing work.
    assert verified.summary["max_abs_error"] > 1e-4
    # The quantizer's stray buffers (different bytes each run) are zeroed: same file again.
    again, _ = runner.build(example, target, verify_datasets=datasets)
    assert (again / "model.tflite").read_bytes() == (built / "model.tflite").read_bytes()


def test_op_without_a_kernel_is_reported_in_one_line(runner: Runner, workspace: Path) -> None:
    fusable = workspace / "models" / "fusable"
    built, result = runner.build(fusable)
    assert result.summary["ops"]["tpubuild_test.scaled_tanh"] == 1 and result.summary["fused"] == ["tpubuild_test.scaled_tanh"]
    with pytest.raises(StageError) as raised:
        runner.verify(fusable, built)
    assert str(raised.value) == (
        "signature 'serving_default': LiteRT interpreter: custom op tpubuild_test.scaled_tanh (node 0) has no kernel "
        "in this interpreter; register one with the interpreter (a fused tfl_fusable_op composite needs its own kernel)"
    )
    flex = workspace / "models" / "flex"
    built, _ = runner.build(flex, {"select_tf_ops": True})
    with pytest.raises(StageError) as raised:
        runner.verify(flex, built, {"select_tf_ops": True})
    assert str(raised.value).startswith("signature 'serving_default': LiteRT interpreter: op FlexMatrixInverse (node ")
    assert "needs the Flex delegate" in str(raised.value)
