"""The `litert` stage on real SavedModels with TensorFlow's real converter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.targets.litert.litert_helpers import Runner
from tpubuild.errors import StageError
from tpubuild.stages.base import StageResult
from tpubuild.targets.litert import flatbuffer as litert_inspect

FUSED_OPS = {"EMBEDDING_LOOKUP", "UNIDIRECTIONAL_SEQUENCE_LSTM"}
# What the two composites' bodies convert to op by op: the lookup's tf.gather and the
# unrolled cell's gates.
UNFUSED_PIECES = {"GATHER", "LOGISTIC", "TANH", "SPLIT"}


def test_example_composites_become_single_fused_ops(fused: tuple[Path, StageResult]) -> None:
    output, result = fused
    ops = result.summary["ops"]
    assert FUSED_OPS <= set(ops) and ops["EMBEDDING_LOOKUP"] == 1 and ops["UNIDIRECTIONAL_SEQUENCE_LSTM"] == 1
    assert not UNFUSED_PIECES & set(ops), ops
    assert result.summary["fused"] == ["embedding_matmul", "lstm_all_targets"]
    assert {(c["name"], c["fused_op"], c["fused"]) for c in result.summary["composites"]} == {
        ("embedding_matmul", "EMBEDDING_LOOKUP", True),
        ("lstm_all_targets", "UNIDIRECTIONAL_SEQUENCE_LSTM", True),
    }
    assert sorted(p.name for p in output.iterdir()) == ["litert.json", "model.tflite"]
    # litert.json holds the summary's facts, and they are the flatbuffer's own.
    assert json.loads((output / "litert.json").read_text()) == result.summary
    data = (output / "model.tflite").read_bytes()
    assert litert_inspect.op_counts(data) == ops and result.summary["size"] == len(data)
    # The fused LSTM keeps its state between calls: said, since the source's calls are stateless.
    assert result.summary["variable_tensors"] == 2
    assert any("reset_all_variables" in w for w in result.warnings)


def test_composites_none_converts_the_bodies_op_by_op(fused: tuple[Path, StageResult], unfused: tuple[Path, StageResult]) -> None:
    ops = unfused[1].summary["ops"]
    assert not FUSED_OPS & set(ops), ops
    assert UNFUSED_PIECES <= set(ops)
    assert unfused[1].summary["fused"] == []
    assert all(not c["kept"] for c in unfused[1].summary["composites"])
    assert unfused[1].summary["op_count"] > 5 * fused[1].summary["op_count"]


def test_composites_by_name_keep_only_those(runner: Runner, example: Path) -> None:
    _, result = runner.build(example, {"composites": ["embedding_matmul"]})
    assert "EMBEDDING_LOOKUP" in result.summary["ops"] and "GATHER" not in result.summary["ops"]
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in result.summary["ops"] and "LOGISTIC" in result.summary["ops"]
    assert result.summary["fused"] == ["embedding_matmul"]
    # The LSTM op by op keeps no state between calls (recipes/all_targets.yaml's choice).
    assert result.summary["variable_tensors"] == 0 and result.warnings == []
    with pytest.raises(StageError) as raised:
        runner.build(example, {"composites": ["lstm"]})
    assert str(raised.value) == (
        "targets.litert.composites: the model has no composite 'lstm'; its composites: embedding_matmul, lstm_all_targets"
    )


def test_a_kept_composite_that_did_not_fuse_is_a_warning(runner: Runner, workspace: Path) -> None:
    _, result = runner.build(workspace / "models" / "dynamic_batch")
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in result.summary["ops"] and "LOGISTIC" in result.summary["ops"]
    assert [c["fused"] for c in result.summary["composites"]] == [False]
    assert result.warnings == [
        "targets.litert: composite 'lstm_all_targets' was kept but not fused into UNIDIRECTIONAL_SEQUENCE_LSTM; "
        "converted op by op (an LSTM fuses only with a fixed batch size)"
    ]


def test_a_composite_the_converter_does_not_know_is_a_warning(runner: Runner, workspace: Path) -> None:
    _, result = runner.build(workspace / "models" / "unknown_composite")
    assert result.summary["ops"] == {"ADD": 1, "MUL": 1, "TANH": 1}
    assert [(c["name"], c["fused_op"], c["fused"]) for c in result.summary["composites"]] == [("tpubuild_test.unknown", None, False)]
    assert result.warnings == [
        "targets.litert: composite 'tpubuild_test.unknown' is not one TensorFlow's converter fuses; converted op by op"
    ]


def test_conversion_is_byte_identical(runner: Runner, example: Path, fused: tuple[Path, StageResult]) -> None:
    again, _ = runner.build(example)
    for name in ("model.tflite", "litert.json"):
        assert (again / name).read_bytes() == (fused[0] / name).read_bytes(), name


def test_unconvertible_op_fails_with_one_line_naming_it(runner: Runner, workspace: Path) -> None:
    with pytest.raises(StageError) as raised:
        runner.build(workspace / "models" / "flex")
    assert str(raised.value) == (
        "op tf.MatrixInverse (node MatrixInverse in function serve) has no LiteRT builtin kernel; "
        "the flex runtime runs it as a TensorFlow op: set targets.litert.select_tf_ops: true"
    )
    with pytest.raises(StageError) as raised:
        runner.build(workspace / "models" / "no_kernel", {"select_tf_ops": True})
    assert str(raised.value) == (
        "op tf.Digamma (node Digamma in function serve) has no LiteRT kernel, builtin or "
        "select-TF (flex); LiteRT cannot run this model"
    )


def test_select_tf_ops_lets_a_flex_op_through(runner: Runner, workspace: Path) -> None:
    output, result = runner.build(workspace / "models" / "flex", {"select_tf_ops": True})
    assert result.summary["flex_ops"] == ["FlexMatrixInverse"]
    assert result.summary["ops"]["FlexMatrixInverse"] == 1
    assert (output / "model.tflite").is_file()


def test_signatures_select_keys_of_one_flatbuffer(runner: Runner, workspace: Path) -> None:
    two = workspace / "models" / "two_signatures"
    _, every = runner.build(two)
    assert every.summary["signatures"] == ["project", "squash"]
    _, one = runner.build(two, {"signatures": ["squash"]})
    assert one.summary["signatures"] == ["squash"] and "TANH" in one.summary["ops"]
    with pytest.raises(StageError) as raised:
        runner.build(two, {"signatures": ["serving_default"]})
    assert str(raised.value) == (
        "targets.litert.signatures: the model has no signature 'serving_default'; its signatures: project, squash"
    )


def test_int8_without_a_dataset_is_one_line(runner: Runner, example: Path) -> None:
    with pytest.raises(StageError) as raised:
        runner.build(example, {"quantization": "int8"})
    assert str(raised.value) == (
        "targets.litert.quantization: int8 calibrates on a representative dataset and signature 'serving_default' "
        "has none (converter.quantization_options.representative_datasets or verify.representative_datasets)"
    )

