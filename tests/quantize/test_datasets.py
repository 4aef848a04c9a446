"""The dataset stage: npz and generator sources become TFRecord; samples are checked."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.stage_helpers import FEATURES, Runner, dense_samples
from tpubuild.errors import StageError
from tpubuild.quantize.datasets import read_tfrecord, write_tfrecord

TAGS = ["serve"]


def write_generator(runner: Runner, body: str) -> None:
    path = runner.workspace / "data" / "gen.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))


def records(path: Path) -> list[dict[str, np.ndarray]]:
    return list(read_tfrecord(path, "test"))


def test_npz_source_becomes_tfrecord_with_every_sample(runner: Runner, dense: Path) -> None:
    x = np.random.default_rng(1).standard_normal((210, FEATURES)).astype(np.float32)
    np.savez(runner.workspace / "calib.npz", x=x)
    out, result = runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": {"npz": "calib.npz"}}})
    got = records(out / "serving_default.tfrecord")
    assert len(got) == 210
    # Unbatched npz rows are fed as a batch of one, matching the signature's rank.
    # Stored data, not a computation: serialized floats come back bit-equal.
    np.testing.assert_array_equal(np.concatenate([s["x"] for s in got]), x)
    assert result.summary == {"datasets": {"serving_default": {"source": "calib.npz", "samples": 210}}}
    assert result.warnings == []


def test_generator_source_takes_num_samples_and_warns_below_200(runner: Runner, dense: Path) -> None:
    write_generator(runner, """
        import numpy as np

        def samples():
            rng = np.random.default_rng(0)
            while True:
                yield {"x": rng.standard_normal((2, 64)).astype(np.float32)}
    """)
    source = {"generator": "data.gen:samples", "num_samples": 12, "module_file": "data/gen.py"}
    out, result = runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": source}})
    got = records(out / "serving_default.tfrecord")
    assert [s["x"].shape for s in got] == [(2, FEATURES)] * 12
    assert result.warnings == [
        "representative_datasets.serving_default: data.gen:samples: only 12 samples; "
        "the converter recommends at least 200 for calibration"
    ]
    assert runner.logged == ["warning: " + result.warnings[0]]


def test_tfrecord_round_trip_keeps_values(tmp_path: Path) -> None:
    samples = dense_samples(3)
    write_tfrecord(tmp_path / "d.tfrecord", "serving_default", samples)
    for want, got in zip(samples, records(tmp_path / "d.tfrecord")):
        np.testing.assert_array_equal(want["x"], got["x"])  # serialized data: bit-equal


def test_npz_with_a_wrong_input_name_names_the_input(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", pixels=np.zeros((4, FEATURES), np.float32))
    with pytest.raises(StageError) as err:
        runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": {"npz": "calib.npz"}}})
    assert str(err.value) == (
        "representative_datasets.serving_default: calib.npz: sample 0: "
        "input 'pixels' is not an input of the signature; its inputs: x"
    )


def test_generator_with_a_wrong_dtype_names_the_input(runner: Runner, dense: Path) -> None:
    write_generator(runner, """
        import numpy as np

        def samples():
            yield {"x": np.zeros((1, 64))}
    """)
    source = {"generator": "data.gen:samples", "num_samples": 5, "module_file": "data/gen.py"}
    with pytest.raises(StageError) as err:
        runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": source}})
    assert str(err.value) == (
        "representative_datasets.serving_default: data.gen:samples: sample 0: "
        "input 'x' has dtype float64, the signature wants float32[None, 64]"
    )


def test_npz_with_a_wrong_shape_names_the_input(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.zeros((4, 63), np.float32))
    with pytest.raises(StageError) as err:
        runner.run("dataset", dense, {"tags": TAGS, "datasets": {"serving_default": {"npz": "calib.npz"}}})
    assert str(err.value) == (
        "representative_datasets.serving_default: calib.npz: sample 0: "
        "input 'x' has shape [1, 63], the signature wants float32[None, 64]"
    )


def test_dataset_for_an_unknown_signature_is_an_error(runner: Runner, dense: Path) -> None:
    np.savez(runner.workspace / "calib.npz", x=np.zeros((4, FEATURES), np.float32))
    with pytest.raises(StageError) as err:
        runner.run("dataset", dense, {"tags": TAGS, "datasets": {"predict": {"npz": "calib.npz"}}})
    assert str(err.value) == f"{dense}: no signature 'predict'; signatures: serving_default"
