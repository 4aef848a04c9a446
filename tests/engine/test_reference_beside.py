"""verify's source side computed beside the stages before it (engine/beside.py,
verify/reference.py): verify takes those outputs only for exactly its own samples, its
verdict and every key are the ones of a build that ran the source in verify, and a
prefetch that fails or holds other samples is never used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.engine.conftest import (
    build_json,
    save_placed_model,
    statuses,
    write_workspace,
)
from tpubuild.verify import reference

RECIPE = """\
name: placed
model: {saved_model: models/tiny}
converter:
  tpu_functions: [{function_alias: tpu_func}]
  bfloat16_optimization_options: {scope: ALL}
verify: {samples: 5, rtol: 0.05}
"""
# The tiny model as a large one, on a machine with memory for it (engine/beside.py beside_fits).
BESIDE = {"TPUBUILD_REFERENCE_BESIDE_MIN_BYTES": "0", "TPUBUILD_MEMORY_AVAILABLE": str(2**40)}
TAKEN = "[verify] the source's outputs were computed beside the earlier stages"


def _two_cpus() -> bool:
    return len(os.sched_getaffinity(0)) >= 2 if hasattr(os, "sched_getaffinity") else False


def _logs(ws: Path) -> str:
    return "".join(log.read_text() for log in sorted((ws / ".tpubuild" / "logs").glob("worker-*.log")))


def _verify_json(ws: Path) -> dict:
    """verify's summary, as the published report holds it."""
    return json.loads((ws / "out" / "placed" / "1" / "tpubuild-report.json").read_text())["verify"]


@pytest.mark.parametrize("strings", [False, True])
def test_verify_takes_the_outputs_computed_beside_and_says_the_same(tmp_path, strings):
    model = save_placed_model(tmp_path / "model", strings)
    beside = write_workspace(tmp_path / "beside", model, {"placed": RECIPE})
    alone = write_workspace(tmp_path / "alone", model, {"placed": RECIPE})
    done = build_json(beside, env=BESIDE)
    assert statuses(done, "placed")["verify"] == "built", done
    build_json(alone)
    logs = _logs(beside)
    if not _two_cpus():  # one CPU: nothing runs beside
        assert "computed beside" not in logs
        return
    # The prefetch ran in a worker of its own, with verify's options.
    assert "[verify] the source's outputs on 5 samples, for verify" in logs or strings, logs
    if strings:  # a string output is not handed on (np.load would unpickle it): verify runs the source
        assert ("are not used (it failed: string outputs are not handed on (np.load would have to unpickle them)): "
                "the source runs here") in logs, logs
        assert TAKEN not in logs
    else:
        assert TAKEN in logs, logs
    assert "computed beside" not in _logs(alone)
    # The same keys (where the source ran is no input), and the same verdict and figures.
    lock = [yaml.safe_load((ws / "recipes" / "placed.lock.yaml").read_text()) for ws in (beside, alone)]
    assert [s["key"] for s in lock[0]["stages"]] == [s["key"] for s in lock[1]["stages"]]
    measured = [_verify_json(ws) for ws in (beside, alone)]
    assert measured[0]["passed"] is measured[1]["passed"] is True
    for ours, theirs in zip(measured[0]["outputs"], measured[1]["outputs"]):
        assert (ours["signature"], ours["output"]) == (theirs["signature"], theirs["output"])
        # One CPU, one code, the same samples: only the process differs. Within 1e-6 of
        # bfloat16's error figure, not bit for bit (no two runs are promised to be).
        assert ours["max_abs_error"] == pytest.approx(theirs["max_abs_error"], rel=1e-6, abs=1e-9)
    # No work directory of a prefetch is left in the cache.
    assert not list((beside / ".tpubuild" / "cache").rglob("verify-reference-*"))


def _prefetched(directory: Path, source: Path, samples: dict[str, list[dict]]) -> None:
    """A prefetch's directory as verify/reference.py prefetch writes it, for `samples`."""
    arrays, sets = {}, [{}]
    for key, drawn in samples.items():
        arrays[json.dumps([0, key, "y"])] = np.stack([s["x"] * 2 for s in drawn])
        sets[0][key] = {"samples": reference.samples_digest(drawn), "outputs": ["y"]}
    with open(directory / reference.ARRAYS, "wb") as f:
        np.savez(f, **arrays)
    (directory / reference.DONE).write_text(json.dumps({"source": str(source), "tags": ["serve"], "sets": sets}))


def test_take_uses_only_outputs_for_exactly_verifys_samples(tmp_path):
    source = tmp_path / "source"
    drawn = {"serving_default": [{"x": np.array([[1.0, 2.0]], np.float32)}, {"x": np.array([[3.0, 4.0]], np.float32)}]}
    lines: list[str] = []
    _prefetched(tmp_path, source, drawn)
    [taken] = reference.take(tmp_path, source, ["serve"], [drawn], lines.append)
    np.testing.assert_array_equal(taken["serving_default"]["y"], [[[2.0, 4.0]], [[6.0, 8.0]]])
    assert lines == ["the source's outputs were computed beside the earlier stages"]
    # One value of one sample differs (a dataset edited between the prefetch and verify).
    other = {"serving_default": [drawn["serving_default"][0], {"x": np.array([[3.0, 4.5]], np.float32)}]}
    assert reference.take(tmp_path, source, ["serve"], [other], lines.append) is None
    assert lines[-1].endswith("(other samples for signature 'serving_default'): the source runs here")
    # Another source directory, other tags, a set it does not hold (the random-input check's).
    assert reference.take(tmp_path, tmp_path / "other", ["serve"], [drawn], lines.append) is None
    assert reference.take(tmp_path, source, ["serve", "tpu"], [drawn], lines.append) is None
    assert reference.take(tmp_path, source, ["serve"], [drawn, drawn], lines.append) is None
    # A prefetch that ended without its result: FAILED, written by the engine.
    (tmp_path / reference.DONE).unlink()
    (tmp_path / reference.FAILED).write_text("out of memory")
    assert reference.take(tmp_path, source, ["serve"], [drawn], lines.append) is None
    assert lines[-1].startswith("the source's outputs computed beside the earlier stages are not used (it failed: out of memory)")


def test_samples_digest_tells_dtype_shape_and_every_string_apart():
    base = [{"text": np.array([b"a", b"bc"], dtype=object)}]
    variants = [
        [{"text": np.array([b"ab", b"c"], dtype=object)}],  # the same bytes, cut elsewhere
        [{"text": np.array([[b"a", b"bc"]], dtype=object)}],
        [{"text": np.array([b"a", b"bc"], dtype=object)}, {"text": np.array([b"a"], dtype=object)}],
        [{"other": np.array([b"a", b"bc"], dtype=object)}],
    ]
    digests = {reference.samples_digest(s) for s in [base, *variants]}
    assert len(digests) == 1 + len(variants)
    assert reference.samples_digest(base) == reference.samples_digest([{"text": np.array([b"a", b"bc"], dtype=object)}])
    numbers = [{"x": np.array([1, 2], np.int32)}]
    assert reference.samples_digest(numbers) != reference.samples_digest([{"x": np.array([1, 2], np.int64)}])


def test_a_threshold_that_is_not_a_number_stops_the_build_before_it_starts(make_workspace):
    """As TPUBUILD_OWN_WORKER_MIN_BYTES (workers/pool.py bytes_knob): one line, exit 2, nothing built."""
    from tests.cli import tpubuild
    from tests.engine.conftest import source_recipe

    ws = make_workspace({"toy": source_recipe("toy")})
    for command in (("build",), ("build", "--dry-run")):
        result = tpubuild(ws, *command, env={"TPUBUILD_REFERENCE_BESIDE_MIN_BYTES": "256M"})
        expected = "error: TPUBUILD_REFERENCE_BESIDE_MIN_BYTES='256M': expected a whole number of bytes (default 67108864)\n"
        assert (result.returncode, result.stderr) == (2, expected), result.stderr
    assert not (ws / "out").exists()


def test_no_worker_beside_where_memory_would_not_hold_it(tmp_path):
    """With less memory available than the worker, the running stage and the margin need,
    nothing starts beside (the build says why) and verify runs the source itself (with
    enough, it starts: the test above, TPUBUILD_MEMORY_AVAILABLE 1 TiB)."""
    from tests.cli import tpubuild
    from tpubuild.engine.beside import beside_bytes

    model = save_placed_model(tmp_path / "model", False)
    available = 2 * beside_bytes(0)  # the tiny model: about TensorFlow's own, twice, and no margin
    ws = write_workspace(tmp_path / "ws", model, {"placed": RECIPE})
    done = tpubuild(ws, "build", env={**BESIDE, "TPUBUILD_MEMORY_AVAILABLE": str(available)})
    assert done.returncode == 0, done.stderr
    if _two_cpus():  # one CPU: nothing runs beside whatever the memory, and nothing is said
        assert ("placed: verify's source side does not run beside the earlier stages: "
                f"{available / 2**20:,.0f} MiB available, ") in done.stdout, done.stdout
    assert "runs beside the earlier stages" not in done.stdout
    assert "computed beside" not in _logs(ws)
    assert _verify_json(ws)["passed"] is True


def test_available_memory_is_the_kernels_or_the_knobs(monkeypatch):
    from tpubuild.errors import UsageError
    from tpubuild.memory import available_memory_bytes

    monkeypatch.delenv("TPUBUILD_MEMORY_AVAILABLE", raising=False)
    with open("/proc/meminfo") as f:
        kernel = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert abs(available_memory_bytes() - kernel) < 2**30  # the machine is shared: it moves
    monkeypatch.setenv("TPUBUILD_MEMORY_AVAILABLE", "12345")
    assert available_memory_bytes() == 12345
    monkeypatch.setenv("TPUBUILD_MEMORY_AVAILABLE", "8GiB")
    with pytest.raises(UsageError, match=r"^TPUBUILD_MEMORY_AVAILABLE='8GiB': expected a whole number of bytes"):
        available_memory_bytes()


def test_the_workers_estimate_bounds_what_it_was_measured_to_take():
    """beside_bytes against the worker peaks measured (engine/beside.py): each a bound, none
    far above (the 2.5x of before said 6,070 MiB for a 2 GiB source that took 2,689)."""
    from tpubuild.engine.beside import beside_bytes, beside_fits

    mib = 2**20
    measured = {100 * mib: 1_057 * mib, 419 * mib: 1_521 * mib, 2048 * mib: 2_689 * mib, 8192 * mib: 8_915 * mib}
    for source, peak in measured.items():
        assert peak <= beside_bytes(source) <= peak + 1_000 * mib, (source / mib, beside_bytes(source) / mib)
    # The decision counts the stages beside it, and says each part.
    fits, said = beside_fits(2048 * mib, 8_000 * mib, 3_792 * mib)
    assert not fits and said == ("8,000 MiB available, 8,326 MiB needed (the worker ~3,510 MiB, the stages beside "
                                 "it up to ~3,792 MiB, a margin of 1,024 MiB)")
    assert beside_fits(2048 * mib, 8_326 * mib, 3_792 * mib)[0]


def _save_wide_placed_model(path: Path, layers: int = 4, width: int = 1024) -> Path:
    """`layers` float32 matrices of width x width (4 MiB each), one checkpoint shard: its
    data file holds the whole model, its largest tensor a quarter of it."""
    import tensorflow as tf

    class Wide(tf.Module):
        def __init__(self):
            super().__init__()
            self.ws = [tf.Variable(tf.random.stateless_normal([width, width], [i, 1]) / width**0.5)
                       for i in range(layers)]

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32)])
        def tpu_func(self, x):
            for w in self.ws:
                x = tf.tanh(tf.matmul(x, w))
            return x

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
        def serve(self, x):
            return {"y": self.tpu_func(x)}

    model = Wide()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": model.tpu_func}))
    return path


def test_the_worker_beside_counts_a_streaming_stage_by_its_largest_tensor_not_its_data_file(tmp_path):
    """The beside worker's gate reads the stages' sizes as the engine's gate does
    (stages/base.py ModelSizes.for_estimate): bfloat16, which streams the checkpoint, by the
    largest tensor variables.index names. At 8 GiB of one shard the data file's size said
    17,104 MiB for a stage measured at 874 MiB, and kept the worker off where it fits."""
    from tests.cli import tpubuild
    from tpubuild.stages.base import GRAPH_ONLY, MiB, STREAMS_CHECKPOINT, ModelSizes

    model = _save_wide_placed_model(tmp_path / "model")
    data = [p for p in (model / "variables").iterdir() if p.name.startswith("variables.data")]
    assert len(data) == 1 and data[0].stat().st_size >= 16 * MiB  # one shard: the whole model
    files = [p for p in model.rglob("*") if p.is_file()]
    whole = sum(p.stat().st_size for p in files)
    graph = (model / "saved_model.pb").stat().st_size
    by_tensor = max(STREAMS_CHECKPOINT.bytes(ModelSizes(whole, graph, 4 * MiB)),
                    GRAPH_ONLY.bytes(ModelSizes(whole, graph, 4 * MiB)))
    by_file = STREAMS_CHECKPOINT.bytes(ModelSizes(whole, graph, data[0].stat().st_size))
    assert round(by_file / MiB) - round(by_tensor / MiB) >= 20  # the two readings differ in what is said
    ws = write_workspace(tmp_path / "ws", model, {"placed": RECIPE})
    done = tpubuild(ws, "build", env=BESIDE)
    assert done.returncode == 0, done.stderr
    if not _two_cpus():  # one CPU: nothing runs beside, nothing is said
        assert "beside the earlier stages" not in done.stdout
        return
    assert f"the stages beside it up to ~{by_tensor / MiB:,.0f} MiB" in done.stdout, done.stdout
    assert TAKEN in _logs(ws)
    assert _verify_json(ws)["passed"] is True
