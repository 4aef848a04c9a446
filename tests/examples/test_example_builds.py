"""The example recipes for quantization and the report build end to end with `tpubuild build`,
without a warning (the README's first build is every example's: CI's step 1 checks all of
them; these read the suite's one build of the example workspace, tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.cli import tpubuild

# Every test here reads the built example workspace (tests/example_workspace.py, a build
# of ~90 s): the slow tier, which .ci/run runs after the README's command.
pytestmark = pytest.mark.slow

QUANTIZED = ["dynamic_range", "weight_only", "static_range_generator", "quantized"]
# toy and batch_function serve an argmax (`class_id`) beside their scores.
RECIPES = [*QUANTIZED, "two_tpu_functions", "toy", "batch_function"]


@pytest.fixture(scope="module")
def workspace(built_examples_run) -> Path:
    """The example workspace with every recipe built once (tests/conftest.py), RECIPES
    among them, without a warning. Read only: `tpubuild report` reads it."""
    assert not built_examples_run.warnings(), built_examples_run.stderr
    for name in RECIPES:
        assert set(built_examples_run.statuses(name).values()) <= {"built", "cached"}, name
    return built_examples_run.root


def published(root: Path, name: str) -> tuple[Path, dict]:
    version = root / "out" / name / "1"
    return version, json.loads((version / "tpubuild-report.json").read_text())


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_examples_load_run_and_pass_verification(workspace: Path, name: str) -> None:
    version, report = published(workspace, name)
    assert report["verify"]["passed"] is True
    assert report["verify"]["tolerance"]["kind"] == "int8"
    params = report["parameters"]
    assert set(params["artifact"]) >= {"int8"} and set(params["source"]) == {"float32"}
    ratio = sum(r["bytes"] for r in params["artifact"].values()) / sum(r["bytes"] for r in params["source"].values())
    assert 0.24 < ratio < 0.3  # int8 weights: about a quarter of float32
    serve = tf.saved_model.load(str(version)).signatures["serving_default"]
    [(input_name, spec)] = serve.structured_input_signature[1].items()
    batch = np.ones([2, *spec.shape[1:]], spec.dtype.as_numpy_dtype)
    [output] = serve(**{input_name: tf.constant(batch)}).values()
    assert output.shape[0] == 2 and np.all(np.isfinite(output.numpy()))


def test_transformer_report_shows_the_quarter_size(workspace: Path) -> None:
    version, report = published(workspace, "dynamic_range")
    text = tpubuild(workspace, "report", "dynamic_range").stdout
    assert "Parameters: artifact 451.0 KiB, source 1.7 MiB; ratio 0.253" in text.splitlines()
    assert report["quantization"]["layers"] == {"Gather": {"quantized": 1, "total": 1},
                                                "MatMul": {"quantized": 7, "total": 7}}


def test_two_tpu_functions_report_splits_cost_and_saves_hlo(workspace: Path) -> None:
    version, report = published(workspace, "two_tpu_functions")
    cost = report["cost"]
    assert sorted(row["alias"] for row in cost["tpu_functions"]) == ["tpu_func_1", "tpu_func_2"]
    assert sum(row["cost"] for row in cost["tpu_functions"]) == cost["tpu"]
    assert cost["tpu"] + cost["cpu"] == cost["total"] and cost["cpu"] > 0
    for label in ("tpu_func_1", "tpu_func_2"):
        assert (version / report["hlo"][label]["file"]).read_text().startswith("HloModule ")
    assert report["verify"]["passed"] is True and report["verify"]["tolerance"]["kind"] == "bfloat16"


@pytest.mark.parametrize("name", ["toy", "batch_function"])
def test_class_ids_are_verified_exactly(workspace: Path, name: str) -> None:
    """The examples' class id is an argmax (int64): compared element for element, judged
    (not reported as a comparison that says nothing), and not constant on the samples."""
    _, report = published(workspace, name)
    (output,) = [o for o in report["verify"]["outputs"] if o["output"] == "class_id"]
    assert output["exact"] is True and output["mismatched"] == 0 and output["elements"] == 16
    assert report["verify"]["vacuous"] == [] and report["verify"]["passed"] is True
    # On inputs like verify's random ones (standard normal features), the classes differ:
    # the comparison can tell a wrong class from a right one.
    spec = importlib.util.spec_from_file_location(name, workspace / "recipes" / "models" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Toy() if name == "toy" else module.BatchedClassifier()
    x = np.random.default_rng(0).standard_normal((16, module.FEATURES)).astype(np.float32)
    assert len(set(model.serve(tf.constant(x))["class_id"].numpy().tolist())) > 1
