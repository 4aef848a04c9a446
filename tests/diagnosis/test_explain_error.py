"""`tpubuild explain-error` on a model with one bfloat16-fragile op, and on one with an
int8-fragile layer, through the real CLI and stages.

bfloat16: sensor readings near 1000 are centred by subtracting 1000 before a dense layer. In
bfloat16 (8-bit mantissa) values near 1000 step by 4, so the centred values lose all
their variation and verification fails; in float32 the subtraction is exact. The command
must name that Sub as where the error starts, propose `filterlist: [Sub]`, and the recipe
rebuilt with it must pass verification.

int8: a dense layer holds one weight of 100 among weights of about 0.25, on an input
feature the data never sets. Static-range int8 with one scale per tensor (TF's default)
steps by 100/127 there, so every other weight of that layer rounds to 0 or +-0.79 and the
output is far off; the second layer is fine. The command must rank the first layer's
MatMul worst by TF's own quantization debugger, propose keeping it in float with
`unit_wise_quantization_specs`, and the recipe rebuilt with it must pass.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.cli import tpubuild
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


LOUD = {"TF_CPP_MIN_LOG_LEVEL": "0"}  # TF's log must still not show


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
    return root


@pytest.mark.slow
def test_unfiltered_build_fails_verification(workspace: Path) -> None:
    result = tpubuild(workspace, "build", "sensor", env=LOUD)
    assert result.returncode == 1
    assert "stage verify: signature 'serving_default' output 'score' differs from the source" in result.stderr
    assert "`tpubuild explain-error` on this recipe names the ops where it starts" in result.stderr


@pytest.mark.slow
def test_explain_error_names_the_sub_and_proposes_the_filterlist(workspace: Path) -> None:
    tpubuild(workspace, "build", "sensor", env=LOUD)  # leaves the stages before verify in the cache
    result = tpubuild(workspace, "explain-error", "sensor", env=LOUD)
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
    # The result is kept for `report --html`: every compared tensor in graph order.
    kept = json.loads((workspace / ".tpubuild" / "explain-error" / "sensor.json").read_text())
    assert kept["recipe"] == "sensor" and kept["stage"] == "bfloat16"
    assert kept["proposal"] == "bfloat16_optimization_options.filterlist: [Sub]"
    nodes = kept["nodes"]["serving_default"]
    assert len(nodes) == kept["compared"] and [n["order"] for n in nodes] == sorted(n["order"] for n in nodes)
    assert [n["op"] for n in nodes if not n["within"]][0] == "Sub"


@pytest.mark.slow
def test_the_report_page_draws_the_op_level_drift(workspace: Path, tmp_path: Path) -> None:
    from tests.browser import Browser
    from tests.report.test_html_page import PROBE, READY

    tpubuild(workspace, "build", "sensor", env=LOUD)
    tpubuild(workspace, "explain-error", "sensor", env=LOUD, code=0)
    tpubuild(workspace, "report", "sensor", "--html", str(tmp_path / "sensor.html"), code=0)
    with Browser() as browser:
        seen = browser.render(tmp_path / "sensor.html", READY, PROBE)
    assert seen.console_errors == [] and seen.requests == [(tmp_path / "sensor.html").as_uri()]
    drift = next(f for f in seen.dom["figures"] if f["id"] == "fig-drift")
    assert drift["svgs"] == 1 and drift["marks"] > 0
    assert drift["rows"][0]["cells"][1] in ("Sub", "MatMul", "AddV2", "Relu")  # the largest errors, tabled
    assert re.search(r"of the build ✗\d \(build failed: not published \(stage verify failed\)\)", seen.dom["text"])


@pytest.mark.slow
def test_the_proposed_filterlist_builds_and_verifies(workspace: Path) -> None:
    recipe = workspace / "recipes" / "sensor.yaml"
    before = recipe.read_text()
    recipe.write_text(textwrap.dedent(RECIPE.format(options="\n  bfloat16_optimization_options: {filterlist: [Sub]}")))
    try:
        result = tpubuild(workspace, "build", "sensor", env=LOUD)
        assert result.returncode == 0, result.stderr
        report = json.loads((workspace / "out" / "sensor" / "1" / "tpubuild-report.json").read_text())
        assert report["verify"]["passed"] is True
        again = tpubuild(workspace, "explain-error", "sensor", env=LOUD)
        assert again.returncode == 0, again.stderr
        assert "nothing to filter" in again.stdout and "proposal" not in again.stdout
    finally:
        recipe.write_text(before)


@pytest.mark.slow
def test_bad_requests_are_one_line_errors(workspace: Path) -> None:
    # Its own build: under pytest-xdist this test may run in a worker where no other test of
    # this module built the workspace (the module fixture is per worker), and the message
    # below names the first stage missing from the cache (a flaky failure before: "tpu").
    tpubuild(workspace, "build", "sensor", env=LOUD)  # fails at verify, keeps the stages before it
    plain = tpubuild(workspace, "explain-error", "plain", env=LOUD)
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [
        "error: recipes/plain.yaml: recipe plain applies neither bfloat16 nor quantization: its artifact computes "
        "what its source computes, up to float32 rounding; there is no conversion error to explain"]
    wrong_stage = tpubuild(workspace, "explain-error", "sensor", "--stage", "quantize", env=LOUD)  # not in its chain
    assert wrong_stage.returncode == 2
    assert wrong_stage.stderr.strip() == "error: recipes/sensor.yaml: recipe sensor does not run the quantize stage"
    recipe = workspace / "recipes" / "sensor.yaml"
    before = recipe.read_text()
    recipe.write_text(before.replace("samples: 8", "samples: 8\n  seed: 1").replace(
        "bfloat16_optimization: ENABLED", "bfloat16_optimization: ENABLED\n  bfloat16_optimization_options: "
        "{filterlist: [Relu]}"))
    try:
        unbuilt = tpubuild(workspace, "explain-error", "sensor", env=LOUD)
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
    assert headroom_lines(verify("int8", 0.0189)) == headroom_lines(verify("bfloat16", 0.0189))
    assert headroom_lines(verify("exact", 0.0189)) == []


OUTLIER = """
name: outlier
model: {{saved_model: ../models/outlier}}
converter:
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default: {{tfrecord_file_path: ../data/calibration.tfrecord}}{specs}
verify: {{samples: 16}}
"""


@pytest.fixture(scope="module")
def int8_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tensorflow as tf

    class Outlier(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(1)
            first = (rng.normal(size=(16, 32)) / 4).astype("float32")
            first[0, 0] = 100.0  # sets the layer's int8 scale; feature 0 is always 0 in the data
            self.first = tf.Variable(first, name="first")
            self.second = tf.Variable((rng.normal(size=(32, 8)) / 4).astype("float32"), name="second")

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="features")])
        def serve(self, features):
            return {"logits": tf.matmul(tf.nn.relu(tf.matmul(features, self.first)), self.second)}

    root = tmp_path_factory.mktemp("explain_int8")
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\noutput_dir: out\ncache_dir: .tpubuild/cache\n")
    (root / "recipes").mkdir()
    (root / "data").mkdir()
    module = Outlier()
    tf.saved_model.save(module, str(root / "models" / "outlier"), signatures={"serving_default": module.serve})
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(64):
        features = rng.normal(size=(1, 16)).astype("float32")
        features[:, 0] = 0.0
        samples.append({"features": features})
    write_tfrecord(root / "data" / "calibration.tfrecord", "serving_default", samples)
    (root / "recipes" / "outlier.yaml").write_text(textwrap.dedent(OUTLIER.format(specs="")))
    return root


@pytest.mark.slow
def test_int8_explain_error_names_the_layer_and_keeps_it_in_float(int8_workspace: Path) -> None:
    failed = tpubuild(int8_workspace, "build", env=LOUD)
    assert failed.returncode == 1
    assert "`tpubuild explain-error` on this recipe names the ops where it starts" in failed.stderr
    result = tpubuild(int8_workspace, "explain-error", "outlier", env=LOUD)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("recipes/outlier.yaml: recipe outlier: stage quantize, verify's int8 tolerance")
    assert "out of tolerance" in lines[1]
    assert lines[2] == "  the int8 layers by their own error (each fed its float input, of 2 compared):"
    worst, second = lines[3].strip(), lines[4].strip()
    assert worst.startswith("MatMul (") and second.startswith("MatMul_1 ("), lines
    # Each layer against its float original on the same input: the outlier layer is far off,
    # the other within int8's usual error (256 levels: under 5% of the range).
    assert float(worst.rsplit(" ", 1)[1]) > 0.3 and float(second.rsplit(" ", 1)[1]) < 0.05
    proposal = "quantization_options.unit_wise_quantization_specs: [{unit: [{node_name: 'MatMul'}], method: NO_QUANTIZE}]"
    assert lines[5].startswith(f"  tried {proposal}: max rel error ") and lines[5].endswith("(within tolerance)")
    assert lines[-1] == f"  proposal: {proposal}"

    specs = "\n    unit_wise_quantization_specs: [{unit: [{node_name: 'MatMul'}], method: NO_QUANTIZE}]"
    (int8_workspace / "recipes" / "outlier.yaml").write_text(textwrap.dedent(OUTLIER.format(specs=specs)))
    rebuilt = tpubuild(int8_workspace, "build", env=LOUD)
    assert rebuilt.returncode == 0, rebuilt.stderr
    report = json.loads((int8_workspace / "out" / "outlier" / "1" / "tpubuild-report.json").read_text())
    assert report["verify"]["passed"] is True
    # The kept layer is float, the other int8 (TF's quantizer summary, per op type).
    assert report["quantization"]["layers"]["MatMul"] == {"quantized": 1, "total": 2}
    rendered = tpubuild(int8_workspace, "render", "outlier", env=LOUD)
    assert 'node_name: "MatMul"' in rendered.stdout and "preset_method: METHOD_NO_QUANTIZE" in rendered.stdout
