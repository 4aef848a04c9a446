"""The user's own code at build time (issue 42 items 6 and 7): an export script and a
dataset generator run in the directory of their own file, so a relative path opens the
file beside them; a file that is not there is said with the directory it was looked up
in; a missing module names the script's line, with no frames of Python's import machinery;
a dataset's sample count is warned about once; a signature the quantizer drops is named
with the stage that dropped it."""

from __future__ import annotations

import json

import pytest

from tests.cli import tpubuild

BESIDE = '''\
import shutil
from pathlib import Path


def export(output_dir):
    scale = open("scale.txt").read().strip()  # beside this script, not the workspace root
    shutil.copytree(Path(__file__).parent / "prebuilt", output_dir, dirs_exist_ok=True)
    (Path(output_dir) / "assets").mkdir(exist_ok=True)
    (Path(output_dir) / "assets" / "scale.txt").write_text(scale)
'''
NO_FILE = '''\
def export(output_dir):
    with open("data/weights.h5", "rb") as f:
        f.read()
'''
NO_MODULE = "import tpubuild_test_no_such_module  # noqa: F401\n\n\ndef export(output_dir):\n    pass\n"
# Two signatures; STATIC_RANGE quantization of serving_default, calibrated by a generator.
TWO_SIGNATURES = '''\
import numpy as np
import tensorflow as tf


class TwoSignatures(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.random.default_rng(0).normal(size=(64, 64)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
    def other(self, x):
        return {"z": tf.matmul(x, self.w) * 2.0}


def export(output_dir):
    model = TwoSignatures()
    tf.saved_model.save(model, output_dir, signatures={"serving_default": model.serve, "other": model.other})
'''
GENERATOR = '''\
import numpy as np


def samples():
    scale = float(open("gen_scale.txt").read())  # beside this module
    rng = np.random.default_rng(0)
    for _ in range(64):
        yield {"x": (rng.normal(size=(1, 64)) * scale).astype("float32")}
'''
QUANTIZED = """\
name: quant
model:
  export: {script: models/two_signatures.py, function: export}
converter:
  quantization_options:
    method: STATIC_RANGE
    signature_keys: [serving_default]
    representative_datasets:
      serving_default: {generator: "recipes.models.gen:samples", num_samples: 64, deps: [models/gen_scale.txt]}
verify: {samples: 4}
"""


def _export_recipe(name: str, deps: str = "") -> str:
    return (f"name: {name}\nmodel:\n  export: {{script: models/{name}.py, function: export{deps}}}\n"
            "converter: {}\nverify: {samples: 4}\n")


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_saved_model):
    from tests.engine.conftest import write_workspace

    ws = write_workspace(tmp_path_factory.mktemp("user_code") / "ws", tiny_saved_model, {
        "beside": _export_recipe("beside", ", deps: [models/scale.txt]"),
        "nofile": _export_recipe("nofile"),
        "nomodule": _export_recipe("nomodule"),
        "quant": QUANTIZED,
    })
    models = ws / "recipes" / "models"
    for name, text in (("beside.py", BESIDE), ("nofile.py", NO_FILE), ("nomodule.py", NO_MODULE),
                       ("two_signatures.py", TWO_SIGNATURES), ("gen.py", GENERATOR), ("scale.txt", "3\n"),
                       ("gen_scale.txt", "0.5\n")):
        (models / name).write_text(text)
    # The same names at the workspace root, where an export ran before: not what is read.
    (ws / "scale.txt").write_text("root\n")
    return ws, tpubuild(ws, "build", timeout=900)


@pytest.mark.slow
def test_an_export_opens_a_relative_path_beside_its_script(built):
    ws, result = built
    assert (ws / "out" / "beside" / "1" / "assets" / "scale.txt").read_text() == "3"  # not the root's "root"


@pytest.mark.slow
def test_a_missing_file_names_the_directory_it_was_relative_to(built):
    _, result = built
    assert result.returncode == 1
    assert (
        "recipes/nofile.yaml: stage export: recipes/models/nofile.py: export: raised FileNotFoundError: [Errno 2] No "
        "such file or directory: 'data/weights.h5' (at recipes/models/nofile.py:2 in export); 'data/weights.h5' was "
        "looked up in recipes/models/, the script's directory (its working directory): put the file there or name it "
        "from the script, e.g. Path(__file__).parent / 'data/weights.h5', and list it in the recipe's deps: so that "
        "changing it rebuilds"
    ) in result.stderr.splitlines(), result.stderr


@pytest.mark.slow
def test_a_missing_module_names_the_scripts_line_and_no_import_machinery(built):
    _, result = built
    assert (
        "recipes/nomodule.yaml: stage export: recipes/models/nomodule.py: importing it raised ModuleNotFoundError: No "
        "module named 'tpubuild_test_no_such_module' (at recipes/models/nomodule.py:1 in <module>)"
    ) in result.stderr.splitlines(), result.stderr
    assert "frozen" not in result.stderr and "importlib" not in result.stderr


@pytest.mark.slow
def test_a_generator_runs_beside_its_module_and_its_sample_count_is_warned_once(built):
    ws, result = built
    warned = [line for line in result.stderr.splitlines() if "only 64 samples" in line]
    assert warned == [
        "recipes/quant.yaml: stage dataset: warning: representative_datasets.serving_default: "
        "recipes.models.gen:samples: only 64 samples; the converter recommends at least 200 for calibration"
    ]
    report = json.loads((ws / "out" / "quant" / "1" / "tpubuild-report.json").read_text())
    assert report["verify"]["passed"] is True


@pytest.mark.slow
def test_a_signature_the_quantizer_drops_is_said_with_its_stage(built):
    _, result = built
    assert (
        "recipes/quant.yaml: stage verify: warning: signature 'other' of the source is not in the artifact: the "
        "quantize stage dropped it, since TF's quantizer writes only the signatures in "
        "quantization_options.signature_keys (add it there to keep it); the published model cannot serve it, and it "
        "was not verified"
    ) in result.stderr.splitlines(), result.stderr
