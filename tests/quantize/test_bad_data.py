"""Bad calibration and verification data never passes (issue 13, item 3).

Each case runs the real stage on a tiny real model and asserts the whole one-line message:
empty, non-finite, truncated and object-array datasets; a quantization that quantized
nothing; NaN in an output under verification; verification on no samples; NaN tolerances.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.cli import tpubuild
from tests.stage_helpers import FEATURES, Dense, Runner, dense_samples, save
from tpubuild.errors import StageError
from tpubuild.quantize.datasets import read_tfrecord, write_tfrecord

TAGS = ["serve"]
DATASET = "representative_datasets.serving_default"
QUANTIZE = "quantization (STATIC_RANGE): representative_datasets.serving_default: calib.tfrecord"
FINITE = "calibration and verification need finite inputs"


class Small(tf.Module):
    """One 8x4 MatMul: under the quantizer's 1024-element threshold, so nothing is quantized."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.arange(32, dtype=np.float32).reshape(8, 4) / 32)

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w)}


class Renamed(tf.Module):
    """The dense model's computation under another signature key only."""

    def __init__(self) -> None:
        self.dense = Dense()

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x):
        return self.dense.serve(x)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(Small(), tmp_path_factory.mktemp("small") / "small")


@pytest.fixture(scope="module")
def nan_dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dense model with one NaN weight in its last layer: every logit is NaN."""
    model = Dense()
    w2 = model.w2.numpy()
    w2[0, :] = np.nan
    model.w2.assign(w2)
    return save(model, tmp_path_factory.mktemp("nan") / "nan_dense")


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = Renamed()
    path = tmp_path_factory.mktemp("renamed") / "renamed"
    tf.saved_model.save(model, str(path), signatures={"predict": model.serve})
    return path


def run_error(runner: Runner, stage: str, model: Path, options: dict) -> str:
    with pytest.raises(StageError) as err:
        runner.run(stage, model, options)
    message = str(err.value)
    assert "\n" not in message
    return message


def npz_options(name: str = "calib.npz") -> dict:
    return {"tags": TAGS, "datasets": {"serving_default": {"npz": name}}}


def static_range(path: str = "calib.tfrecord") -> dict:
    return {
        "tags": TAGS, "method": "STATIC_RANGE", "signature_keys": ["serving_default"], "op_set": "XLA",
        "representative_datasets": {"serving_default": {"tfrecord_file_path": path}},
    }


def verify_options(samples: int = 8, datasets: dict | None = None, **tolerances: object) -> dict:
    return {
        "tags": TAGS, "applied": [], "representative_datasets": datasets or {},
        "samples": samples, "seed": 0, "rtol": tolerances.get("rtol"), "atol": tolerances.get("atol"),
    }


def write_generator(runner: Runner, body: str) -> dict:
    path = runner.workspace / "data" / "gen.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return {"generator": "data.gen:samples", "num_samples": 10, "module_file": "data/gen.py"}


def calib_tfrecord(runner: Runner, count: int = 5) -> Path:
    path = runner.workspace / "calib.tfrecord"
    write_tfrecord(path, "serving_default", dense_samples(count))
    return path


# --- the dataset stage: npz and generator sources ------------------------------------------


def test_npz_without_samples_is_an_error(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.zeros((0, FEATURES), np.float32))
    assert run_error(runner, "dataset", dense, npz_options()) == (
        f"{DATASET}: calib.npz: no samples (the arrays' first axis is empty)"
    )


def test_generator_without_samples_is_an_error(runner: Runner, dense: Path) -> None:
    source = write_generator(runner, """
        def samples():
            return iter(())
    """)
    message = run_error(runner, "dataset", dense, {"tags": TAGS, "datasets": {"serving_default": source}})
    assert message == f"{DATASET}: data.gen:samples: no samples (the generator yielded nothing)"


def test_npz_of_all_nan_is_an_error(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.full((10, FEATURES), np.nan, np.float32))
    assert run_error(runner, "dataset", dense, npz_options()) == (
        f"{DATASET}: calib.npz: array 'x' holds non-finite values: 640 NaN and 0 inf of 640, "
        f"the first in sample 0; {FINITE}"
    )


def test_npz_with_one_inf_names_its_sample(runner: Runner, dense: Path) -> None:
    x = np.ones((10, FEATURES), np.float32)
    x[7, 3] = -np.inf
    np.savez(runner.workspace / "calib.npz", x=x)
    assert run_error(runner, "dataset", dense, npz_options()) == (
        f"{DATASET}: calib.npz: array 'x' holds non-finite values: 0 NaN and 1 inf of 640, "
        f"the first in sample 7; {FINITE}"
    )


def test_npz_holding_an_object_array_is_an_input_error(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.array([np.zeros(FEATURES), "not a number"], dtype=object))
    assert run_error(runner, "dataset", dense, npz_options()) == (
        f"{DATASET}: calib.npz: array 'x' holds Python objects (dtype object), which tpubuild "
        "never unpickles; save numeric arrays"
    )


def test_npy_instead_of_npz_is_an_input_error(runner: Runner, dense: Path) -> None:
    np.save(runner.workspace / "calib.npy", np.zeros((4, FEATURES), np.float32))
    assert run_error(runner, "dataset", dense, npz_options("calib.npy")) == (
        f"{DATASET}: calib.npy: not an npz archive (a single .npy array); save it with numpy.savez"
    )


def test_generator_yielding_nan_and_inf_names_the_sample(runner: Runner, dense: Path) -> None:
    source = write_generator(runner, """
        import numpy as np

        def samples():
            x = np.zeros((1, 64), np.float32)
            yield {"x": x}
            x = x.copy()
            x[0, :3] = [np.nan, np.inf, np.nan]
            yield {"x": x}
    """)
    message = run_error(runner, "dataset", dense, {"tags": TAGS, "datasets": {"serving_default": source}})
    assert message == (
        f"{DATASET}: data.gen:samples: sample 1: input 'x' holds non-finite values: 2 NaN and 1 inf of 64; {FINITE}"
    )


# --- the quantize stage: TFRecord files given by the recipe ---------------------------------


def test_empty_tfrecord_is_an_error(runner: Runner, dense: Path) -> None:
    write_tfrecord(runner.workspace / "calib.tfrecord", "serving_default", [])  # TF's own writer, 0 records
    assert (runner.workspace / "calib.tfrecord").stat().st_size == 0
    assert run_error(runner, "quantize", dense, static_range()) == (
        f"{QUANTIZE}: no samples (the TFRecord file is empty)"
    )


def test_tfrecord_cut_inside_a_record_is_an_error(runner: Runner, dense: Path) -> None:
    path = calib_tfrecord(runner)
    data = path.read_bytes()
    record = len(data) // 5  # five records of the same size
    path.write_bytes(data[:-10])
    # TF's reader raises DataLossError here; the message says where, in tpubuild's words.
    assert run_error(runner, "quantize", dense, static_range()) == (
        f"{QUANTIZE}: truncated TFRecord: the record at byte {4 * record} runs past the end of the file "
        f"({len(data) - 10} bytes)"
    )


def test_tfrecord_cut_inside_a_record_header_is_an_error(runner: Runner, dense: Path) -> None:
    path = calib_tfrecord(runner)
    data = path.read_bytes()
    record = len(data) // 5
    path.write_bytes(data[: 4 * record + 5])
    # TF's reader takes a cut header for the end of the file and returns 4 records silently.
    assert len(list(tf.data.TFRecordDataset(str(path)))) == 4
    assert run_error(runner, "quantize", dense, static_range()) == (
        f"{QUANTIZE}: truncated TFRecord: the record at byte {4 * record} runs past the end of the file "
        f"({4 * record + 5} bytes)"
    )


def test_tfrecord_with_a_corrupted_record_names_it(runner: Runner, dense: Path) -> None:
    path = calib_tfrecord(runner)
    data = bytearray(path.read_bytes())
    record = len(data) // 5
    data[2 * record + 20] ^= 0xFF  # a byte of the third record's data: its CRC no longer matches
    path.write_bytes(bytes(data))
    assert run_error(runner, "quantize", dense, static_range()) == (
        f"{QUANTIZE}: cannot read TFRecord {path}: corrupted record at {2 * record + 12}"
    )


def test_tfrecord_with_a_nan_sample_is_an_error(runner: Runner, dense: Path) -> None:
    samples = dense_samples(4)
    samples[2]["x"][0, :] = np.nan
    write_tfrecord(runner.workspace / "calib.tfrecord", "serving_default", samples)
    assert run_error(runner, "quantize", dense, static_range()) == (
        f"{QUANTIZE}: sample 2: input 'x' holds non-finite values: 64 NaN and 0 inf of 64; {FINITE}"
    )


def test_read_tfrecord_reads_every_record_of_a_whole_file(tmp_path: Path) -> None:
    write_tfrecord(tmp_path / "d.tfrecord", "serving_default", dense_samples(3))
    assert len(list(read_tfrecord(tmp_path / "d.tfrecord", "test"))) == 3


# --- the quantize stage: a quantization that quantized nothing -----------------------------


def test_quantizing_no_layer_is_an_error(runner: Runner, small: Path) -> None:
    options = {**static_range(), "method": "DYNAMIC_RANGE", "representative_datasets": {}}
    assert run_error(runner, "quantize", small, options) == (
        "quantization (DYNAMIC_RANGE): TensorFlow's quantizer quantized 0 of 1 layers (MatMul 0/1); "
        "the artifact would be the float model (set quantization_options.allow_unquantized: true to accept it)"
    )


def test_weight_only_without_int8_weights_is_an_error(runner: Runner, small: Path) -> None:
    # WEIGHT_ONLY prints no summary: the artifact's int8 weights (none here) decide.
    options = {**static_range(), "method": "WEIGHT_ONLY", "representative_datasets": {}}
    assert run_error(runner, "quantize", small, options) == (
        "quantization (WEIGHT_ONLY): TensorFlow's quantizer quantized nothing (no quantization summary, "
        "no int8 weights in the artifact); the artifact would be the float model "
        "(set quantization_options.allow_unquantized: true to accept it)"
    )


def test_an_unquantized_result_the_recipe_accepts_passes(runner: Runner, small: Path) -> None:
    # quantization_options.allow_unquantized (a tpubuild extension; render leaves it out).
    options = {**static_range(), "method": "DYNAMIC_RANGE", "representative_datasets": {}, "allow_unquantized": True}
    _, result = runner.run("quantize", small, options)
    assert result.summary["layers"] == {"MatMul": {"quantized": 0, "total": 1}}


def test_allow_unquantized_is_in_the_recipe_and_not_in_the_converter_options(tmp_path: Path) -> None:
    from tpubuild.config.recipe import load_recipe_file
    from tpubuild.render import render

    (tmp_path / "tpubuild.yaml").write_text("recipes: [r.yaml]\n")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "r.yaml").write_text(
        "model: {saved_model: m}\nconverter:\n  quantization_options: {method: DYNAMIC_RANGE, allow_unquantized: true}\n"
    )
    recipe = load_recipe_file(tmp_path / "r.yaml")
    assert recipe.canonical["converter"]["quantization_options"]["allow_unquantized"] is True
    for fmt in ("textproto", "json", "yaml"):
        assert "allow_unquantized" not in render(recipe.canonical, fmt)


# --- the verify stage ----------------------------------------------------------------------


def test_nan_in_the_artifact_fails_whatever_the_tolerance(runner: Runner, dense: Path, nan_dense: Path) -> None:
    runner.inputs["source"] = dense
    message = run_error(runner, "verify", nan_dense, verify_options(atol=1e30))
    assert message == (
        "signature 'serving_default' output 'logits': 80 of 80 values are NaN in the artifact, "
        "0 in the source; NaN never passes verification"
    )
    (out,) = [p for p in runner.out.iterdir() if p.name.startswith("verify")]
    written = json.loads((out / "verify.json").read_text())
    assert written["passed"] is False
    assert (written["outputs"][0]["nan_in_artifact"], written["outputs"][0]["nan_in_source"]) == (80, 0)
    assert written["max_abs_error"] == 0.0  # over the elements finite in both: none here


def test_nan_in_the_source_fails_too(runner: Runner, dense: Path, nan_dense: Path) -> None:
    runner.inputs["source"] = nan_dense
    assert run_error(runner, "verify", dense, verify_options()) == (
        "signature 'serving_default' output 'logits': 0 of 80 values are NaN in the artifact, "
        "80 in the source; NaN never passes verification"
    )


def test_verification_on_no_samples_fails(runner: Runner, dense: Path) -> None:
    runner.inputs["source"] = dense
    assert run_error(runner, "verify", dense, verify_options(samples=0)) == (
        "signature 'serving_default': no samples to verify on"
    )


def test_verification_on_an_empty_tfrecord_fails(runner: Runner, dense: Path) -> None:
    write_tfrecord(runner.workspace / "calib.tfrecord", "serving_default", [])
    runner.inputs["source"] = dense
    options = verify_options(datasets={"serving_default": {"tfrecord_file_path": "calib.tfrecord"}})
    assert run_error(runner, "verify", dense, options) == (
        "representative_datasets.serving_default: calib.tfrecord: no samples (the TFRecord file is empty)"
    )


def test_a_truncated_tail_fails_verification_even_past_the_samples_used(runner: Runner, dense: Path) -> None:
    path = calib_tfrecord(runner)
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    runner.inputs["source"] = dense
    options = verify_options(samples=2, datasets={"serving_default": {"tfrecord_file_path": "calib.tfrecord"}})
    assert run_error(runner, "verify", dense, options) == (
        "representative_datasets.serving_default: calib.tfrecord: truncated TFRecord: the record at "
        f"byte {4 * len(data) // 5} runs past the end of the file ({len(data) - 1} bytes)"
    )


def test_no_signature_left_to_verify_fails(runner: Runner, dense: Path, renamed: Path) -> None:
    runner.inputs["source"] = dense
    assert run_error(runner, "verify", renamed, verify_options()) == (
        "nothing to verify: no signature of the source is in the artifact"
    )


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ({"rtol": float("nan")}, "verify.rtol must be a finite number >= 0, got nan"),
        ({"atol": float("inf")}, "verify.atol must be a finite number >= 0, got inf"),
        ({"rtol": -0.5}, "verify.rtol must be a finite number >= 0, got -0.5"),
        ({"atol": "0.1"}, "verify.atol must be a finite number >= 0, got '0.1'"),
        ({"rtol": True}, "verify.rtol must be a finite number >= 0, got True"),
    ],
)
def test_tolerances_that_are_not_finite_and_non_negative_are_refused(
    runner: Runner, dense: Path, given: dict, shown: str
) -> None:
    runner.inputs["source"] = dense
    assert run_error(runner, "verify", dense, verify_options(**given)) == f"{shown}"


# --- through the command line: one line, exit code 1, no traceback -------------------------


@pytest.mark.slow
def test_build_with_an_all_nan_npz_prints_one_line(dense: Path, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "recipes").mkdir(parents=True)
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\noutput_dir: out\ncache_dir: .tpubuild/cache\n")
    shutil.copytree(dense, root / "models" / "dense")
    np.savez(root / "recipes" / "calib.npz", x=np.full((4, FEATURES), np.nan, np.float32))
    (root / "recipes" / "dense.yaml").write_text(textwrap.dedent("""
        model: {saved_model: ../models/dense}
        converter:
          quantization_options:
            method: STATIC_RANGE
            representative_datasets: {serving_default: {npz: calib.npz}}
    """))
    result = tpubuild(root, "build", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "NaN" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].endswith(
        "array 'x' holds non-finite values: 256 NaN and 0 inf of 256, the first in sample 0; " + FINITE
    ), errors[0]
    assert not (root / "out" / "dense").exists()
