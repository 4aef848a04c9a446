"""The guide's quantization example (recipes/quantized_tpu_func.yaml) builds, verifies and reports."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from tpubuild.savedmodel.model import SavedModel

# Every test here reads the built example workspace (tests/example_workspace.py, a build
# of ~90 s): the slow tier, which .ci/run runs after the README's command.
pytestmark = pytest.mark.slow

NAME = "quantized_tpu_func"


@pytest.fixture(scope="module")
def built(built_examples_run):
    """The example workspace after its one build (tests/conftest.py), quantized_tpu_func among
    its recipes; read only."""
    return built_examples_run


def test_every_stage_runs_and_verification_passes_at_int8(built) -> None:
    root = built.root
    assert built.stages(NAME)[:3] == ["export", "quantize", "tpu"]
    assert set(built.statuses(NAME).values()) == {"built"}
    report = json.loads((root / "out" / NAME / "1" / "tpubuild-report.json").read_text())
    assert report["verify"]["passed"] is True
    assert report["verify"]["tolerance"]["kind"] == "int8"
    assert report["quantization"]["layers"] == {"MatMul": {"quantized": 2, "total": 2}}
    assert [row["alias"] for row in report["cost"]["tpu_functions"]] == ["tpu_func"]


def test_the_aliased_function_is_an_int8_tpu_function(built) -> None:
    root = built.root
    model = SavedModel.load(root / "out" / NAME / "1", ["serve"])
    [name] = [fn for fn, alias in model.aliases.items() if alias == "tpu_func"]
    consts = [n for n in model.functions[name].node_def if n.op == "Const"]
    # w1 (16x64) and w2 (64x4): STATIC_RANGE quantizes both, whatever their size.
    int8 = sorted(
        [d.size for d in n.attr["value"].tensor.tensor_shape.dim]
        for n in consts if n.attr["dtype"].type == tf.int8.as_datatype_enum
    )
    assert int8 == [[16, 64], [64, 4]]
    assert {node.op for _, node in model.call_sites(name)} == {"TPUPartitionedCall"}
