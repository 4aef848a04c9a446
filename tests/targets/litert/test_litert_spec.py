"""The LiteRT stages' SPECs: what each reads from the recipe decides what rebuilds (TensorFlow-free)."""

from __future__ import annotations

import subprocess
import sys

from tests.targets.litert.litert_helpers import REPO, recipe
from tpubuild.targets.litert import stage as litert
from tpubuild.targets.litert import verify_stage as litert_verify

DATASETS = {"serving_default": {"tfrecord_file_path": "data/ids.tfrecord"}}


def test_defaults_when_the_recipe_lists_no_litert_options() -> None:
    assert litert.SPEC.options(recipe()) == {
        "tags": ["serve"], "quantization": "none", "composites": "all", "select_tf_ops": False, "signatures": None,
    }
    assert litert.SPEC.files(recipe()) == []
    assert litert.SPEC.consumes == ("source", "dataset")
    assert litert_verify.SPEC.consumes == ("source", "dataset", "litert")


def test_only_int8_reads_the_datasets_and_is_machine_dependent() -> None:
    for mode in ("none", "dynamic_range", "float16"):
        options = litert.SPEC.options(recipe({"quantization": mode}, verify_datasets=DATASETS))
        assert "representative_datasets" not in options and not litert.SPEC.machine_dependent(options)
        assert litert.SPEC.files(recipe({"quantization": mode}, verify_datasets=DATASETS)) == []
    int8 = recipe({"quantization": "int8"}, verify_datasets=DATASETS)
    options = litert.SPEC.options(int8)
    assert options["representative_datasets"] == DATASETS and litert.SPEC.machine_dependent(options)
    assert litert.SPEC.files(int8) == ["data/ids.tfrecord"]
    # The quantization's own datasets win over verify's, signature by signature.
    quant = {"serving_default": {"tfrecord_file_path": "data/calibration.tfrecord"}}
    int8["converter"] = {"quantization_options": {"representative_datasets": quant}}
    assert litert.SPEC.options(int8)["representative_datasets"] == quant


def test_tolerances_change_verification_not_the_flatbuffer() -> None:
    loose = recipe({"rtol": 0.1, "atol": 0.01})
    assert litert.SPEC.options(loose) == litert.SPEC.options(recipe())
    assert litert_verify.SPEC.options(loose) != litert_verify.SPEC.options(recipe())
    assert litert_verify.SPEC.options(loose)["rtol"] == 0.1
    assert litert_verify.SPEC.machine_dependent(litert_verify.SPEC.options(loose))


def test_tolerance_kind_follows_the_quantization() -> None:
    assert [litert_verify.tolerance_stages(m) for m in ("none", "dynamic_range", "float16", "int8")] == [
        [], ["quantize"], ["bfloat16"], ["quantize"],
    ]


def test_stage_modules_do_not_import_tensorflow() -> None:
    code = ("import sys, tpubuild.targets.litert.stage, tpubuild.targets.litert.verify_stage; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
