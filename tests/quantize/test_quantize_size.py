"""Quantization that pays: the int8 artifact holds no float copy of the weights it replaced.

The guide's placement (a TPU function named by its alias) with static-range int8, built
by `tpubuild build` in a fresh workspace: the quantize stage grafts the int8 body under
the function's name, then drops the float32 variables nothing reads any more
(savedmodel/prune.py) from the functions' captures, the object graph, the saver and the
checkpoint. A variable that CPU code still reads stays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.cli import tpubuild
from tpubuild.tpu.twin import make_cpu_twin
from tpubuild.verify.serving_load import check_serving_load

MODEL = '''
import numpy as np
import tensorflow as tf

WIDTH = 256


class Wide(tf.Module):
    """Three 256-wide dense layers on the TPU; `shared` also reads w0 on the CPU."""

    def __init__(self, shared):
        super().__init__()
        rng = np.random.default_rng(0)
        self.ws = [tf.Variable((rng.normal(size=(WIDTH, WIDTH)) / 16).astype("float32"), name=f"w{i}")
                   for i in range(3)]
        self.bs = [tf.Variable(np.zeros(WIDTH, "float32"), name=f"b{i}") for i in range(3)]
        self.shared = shared

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    def tpu_func(self, x):
        for w, b in zip(self.ws, self.bs):
            x = tf.nn.relu(tf.matmul(x, w) + b)
        return x

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
    def serve(self, x):
        y = self.tpu_func(x)
        if self.shared:  # CPU code reading a weight of the TPU function
            y = y + tf.reduce_sum(self.ws[0], axis=0)
        return {"y": y}


def _save(module, output_dir):
    tf.saved_model.save(module, output_dir, signatures={"serving_default": module.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))


def export(output_dir):
    _save(Wide(shared=False), output_dir)


def export_shared(output_dir):
    _save(Wide(shared=True), output_dir)


def samples():
    rng = np.random.default_rng(1)
    for _ in range(32):
        yield {"x": rng.normal(size=(1, WIDTH)).astype("float32")}
'''

RECIPE = '''
name: {name}
model:
  export: {{script: models/wide.py, function: {function}}}
converter:
  tpu_functions:
    - function_alias: tpu_func
  quantization_options:
    method: STATIC_RANGE
    allow_unquantized: false
    representative_datasets:
      serving_default: {{generator: "recipes.models.wide:samples", num_samples: 32}}
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("quantize_size")
    (ws / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    models = ws / "recipes" / "models"
    models.mkdir(parents=True)
    for package in (ws / "recipes", models):
        (package / "__init__.py").write_text("")
    (models / "wide.py").write_text(MODEL)
    (ws / "recipes" / "wide.yaml").write_text(RECIPE.format(name="wide", function="export"))
    (ws / "recipes" / "shared.yaml").write_text(RECIPE.format(name="shared", function="export_shared"))
    done = tpubuild(ws, "build", "--json", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return ws


def _sizes(ws: Path, recipe: str) -> tuple[int, int]:
    report = json.loads((ws / "out" / recipe / "1" / "tpubuild-report.json").read_text())
    return report["size"]["artifact"]["total"], report["size"]["source"]["total"]


@pytest.mark.slow
def test_int8_artifact_is_under_a_third_of_its_float_source(built: Path) -> None:
    artifact, source = _sizes(built, "wide")
    # The bar: int8 weights are a quarter of float32 ones; 0.30 leaves room for the graph.
    assert artifact <= 0.30 * source, (artifact, source)
    report = json.loads((built / "out" / "wide" / "1" / "tpubuild-report.json").read_text())
    served = report["parameters"]["artifact"]
    assert "float32" not in served or served["float32"]["elements"] == 0, served
    version = built / "out" / "wide" / "1"
    names = [name for name, _ in tf.train.list_variables(str(version / "variables" / "variables"))]
    assert names == ["_CHECKPOINTABLE_OBJECT_GRAPH"], names


@pytest.mark.slow
def test_the_pruned_artifact_loads_and_computes_like_its_source(built: Path) -> None:
    version = built / "out" / "wide" / "1"
    check_serving_load(version, ["serve"], "the TPU SavedModel")  # TF Serving's loader (a v1 Session)
    loaded = tf.saved_model.load(str(version))
    assert len(loaded.signatures["serving_default"].captured_inputs) == 0  # no float weight captured
    verdict = json.loads((version / "tpubuild-report.json").read_text())["verify"]
    assert verdict["passed"] and verdict["tolerance"]["kind"] == "int8", verdict


@pytest.mark.slow
def test_a_weight_cpu_code_still_reads_is_kept(built: Path, tmp_path: Path) -> None:
    version = built / "out" / "shared" / "1"
    names = {name for name, _ in tf.train.list_variables(str(version / "variables" / "variables"))}
    # w0 is read on the CPU as well: it stays; the TPU function's other weights go.
    assert "ws/0/.ATTRIBUTES/VARIABLE_VALUE" in names, names
    assert not {"ws/1/.ATTRIBUTES/VARIABLE_VALUE", "ws/2/.ATTRIBUTES/VARIABLE_VALUE"} & names, names
    check_serving_load(version, ["serve"], "the TPU SavedModel")
    twin = tmp_path / "twin"  # the TPU artifact runs on CPU through its twin, as verify runs it
    make_cpu_twin(version, twin, ["serve"])
    loaded = tf.saved_model.load(str(twin))
    x = np.random.default_rng(2).normal(size=(4, 256)).astype("float32")
    y = loaded.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    assert np.all(np.isfinite(y)) and y.shape == (4, 256)
