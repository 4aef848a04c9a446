"""`tpubuild explain-error` on a model with one bfloat16-fragile op.

Sensor readings near 1000 are centred by subtracting 1000 before a dense layer. In
bfloat16 (8-bit mantissa) values near 1000 step by 4, so the centred values lose all
their variation and verification fails; in float32 the subtraction is exact. The command
must name that Sub as where the error starts, propose `filterlist: [Sub]`, and the recipe
rebuilt with it must pass verification, all through the real CLI and stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tpubuild.quantize.datasets import write_tfrecord

MODEL = '''
import numpy as np
import tensorflow as tf


class Sensor(tf.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w = tf.Variable(rng.normal(size=(16, 8)).astype("float32") / 4, name="w")
        self.b = tf.Variable(np.zeros(8, "float32"), name="b")

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def tpu_func(self, x):
        return tf.nn.relu(tf.matmul(x - 1000.0, self.w) + self.b)

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="reading")])
    def serve(self, reading):
        return {"score": self.tpu_func(reading)}


def export(output_dir):
    model = Sensor()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}))
'''

RECIPE = """
name: sensor
model:
  export: {{script: ../models/sensor.py, function: export}}
converter:
  tpu_functions:
    - function_alias: tpu_func
  bfloat16_optimization: ENABLED{options}
verify:
  samples: 8
  representative_datasets:
    serving_default: {{tfrecord_file_path: ../data/readings.tfrecord}}
"""


def tpubuild(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpubuild", *args], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})  # TF's log must still not show


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain_error")
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\noutput_dir: out\ncache_dir: .tpubuild/cache\n")
    for folder in ("models", "recipes", "data"):
        (root / folder).mkdir()
    (root / "models" / "sensor.py").write_text(MODEL)
    rng = np.random.default_rng(0)
    write_tfrecord(root / "data" / "readings.tfrecord", "serving_default",
                   [{"reading": (1000 + rng.uniform(-2, 2, size=(1, 16))).astype("float32")} for _ in range(8)])
    (root / "recipes" / "sensor.yaml").write_text(textwrap.dedent(RECIPE.format(options="")))
    (root / "recipes" / "plain.yaml").write_text("model: {export: {script: ../models/sensor.py, function: export}}\n")
    (root / "recipes" / "int8.yaml").write_text("model: {export: {script: ../models/sensor.py, function: export}}\n"
                                                "converter: {quantization_options: {method: WEIGHT_ONLY}}\n")
    return root


def test_unfiltered_build_fails_verification(workspace: Path) -> None:
    result = tpubuild(workspace, "build", "sensor")
    assert result.returncode == 1
    assert "stage verify: signature 'serving_default' output 'score' differs from the source" in result.stderr
    assert "`tpubuild explain-error` on this recipe names the ops where it starts" in result.stderr


def test_explain_error_names_the_sub_and_proposes_the_filterlist(workspace: Path) -> None:
    tpubuild(workspace, "build", "sensor")  # leaves the stages before verify in the cache
    result = tpubuild(workspace, "explain-error", "sensor")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no TensorFlow log line reaches the user
    lines = result.stdout.splitlines()
    assert lines[0].startswith("recipes/sensor.yaml: recipe sensor: stage bfloat16, verify's bfloat16 tolerance")
    assert "serving_default: 8 samples (representative_dataset)" in lines[0]
    assert "out of tolerance" in lines[1]
    starts = [line.strip() for line in lines if line.startswith("    serving_default: ")]
    # The subtraction alone starts the error; MatMul, AddV2 and Relu only carry it on.
    assert len(starts) == 1 and starts[0].startswith("serving_default: sub (Sub, bfloat16): max rel error"), lines
    tried = [line for line in lines if line.startswith("  tried ")]
    assert len(tried) == 1 and tried[0].startswith("  tried bfloat16_optimization_options.filterlist: [Sub]: ")
    assert tried[0].endswith("(within tolerance)")
    # bfloat16 keeps ~3 significant digits: with the Sub in float32 the output is within 1%.
    error = float(tried[0].split("max rel error ")[1].split()[0])
    assert error < 1e-2
    assert lines[-1] == "  proposal: bfloat16_optimization_options.filterlist: [Sub]"
    # Nothing published, nothing in the cache's trees changed by the command.
    assert not (workspace / "out" / "sensor").exists()


def test_the_proposed_filterlist_builds_and_verifies(workspace: Path) -> None:
    recipe = workspace / "recipes" / "sensor.yaml"
    before = recipe.read_text()
    recipe.write_text(textwrap.dedent(RECIPE.format(options="\n  bfloat16_optimization_options: {filterlist: [Sub]}")))
    try:
        result = tpubuild(workspace, "build", "sensor")
        assert result.returncode == 0, result.stderr
        report = json.loads((workspace / "out" / "sensor" / "1" / "tpubuild-report.json").read_text())
        assert report["verify"]["passed"] is True
        again = tpubuild(workspace, "explain-error", "sensor")
        assert again.returncode == 0, again.stderr
        assert "nothing to filter" in again.stdout and "proposal" not in again.stdout
    finally:
        recipe.write_text(before)


def test_bad_requests_are_one_line_errors(workspace: Path) -> None:
    plain = tpubuild(workspace, "explain-error", "plain")
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [
        "error: recipes/plain.yaml: recipe plain applies neither bfloat16 nor quantization: its artifact computes "
        "what its source computes, up to float32 rounding; there is no conversion error to explain"]
    wrong_stage = tpubuild(workspace, "explain-error", "sensor", "--stage", "quantize")  # not in its chain
    assert wrong_stage.returncode == 2
    assert wrong_stage.stderr.strip() == "error: recipes/sensor.yaml: recipe sensor does not run the quantize stage"
    int8 = tpubuild(workspace, "explain-error", "int8")
    assert int8.returncode == 2
    assert int8.stderr.strip() == (
        "error: recipes/int8.yaml: recipe int8: explain-error does not explain int8 quantization yet: the quantizer "
        "renames the layers it replaces, so their tensors cannot be matched to the float model's")
    recipe = workspace / "recipes" / "sensor.yaml"
    before = recipe.read_text()
    recipe.write_text(before.replace("samples: 8", "samples: 8\n  seed: 1").replace(
        "bfloat16_optimization: ENABLED", "bfloat16_optimization: ENABLED\n  bfloat16_optimization_options: "
        "{filterlist: [Relu]}"))
    try:
        unbuilt = tpubuild(workspace, "explain-error", "sensor")
        assert unbuilt.returncode == 2
        assert unbuilt.stderr.strip() == (
            "error: recipes/sensor.yaml: recipe sensor: stage bfloat16 is not built with the recipe as it is now; "
            "run `tpubuild build sensor` first (a build whose verification fails keeps the stages before verify)")
    finally:
        recipe.write_text(before)


def test_report_says_when_a_lossy_verification_passed_close_to_its_tolerance() -> None:
    from tpubuild.report.formats import headroom_lines

    def verify(kind: str, error: float) -> dict:
        # bound = atol + rtol * max|output| = 0.001 + 0.02 * 1.0 = 0.021
        return {"tolerance": {"kind": kind, "rtol": 0.02, "atol": 0.001}, "passed": True,
                "outputs": [{"max_abs_error": error, "max_reference": 1.0}]}

    assert headroom_lines(verify("bfloat16", 0.0021)) == []  # 10% of the bound
    assert headroom_lines(verify("bfloat16", 0.0189)) == [
        "Close to the tolerance: the worst output's error is 90% of its bound; `tpubuild explain-error` names the "
        "ops where the error starts."]
    assert headroom_lines(verify("int8", 0.0189))[0].endswith("a smaller error needs layers kept in float.")
    assert headroom_lines(verify("exact", 0.0189)) == []
