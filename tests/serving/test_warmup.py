"""TF Serving warmup requests: built from samples, deterministic, replayable as TF Serving
replays them, and published into every SavedModel an example recipe that batches serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.cli import tpubuild
from tests.example_workspace import copy_built_examples
from tpubuild.serving import warmup

# Example recipes that batch (common/base.yaml's batch_options, or their own), and the toy
# with a SavedModel target beside its TPU SavedModel.
BATCHING = ["toy", "signature_batching", "string_preprocess", "toy_targets"]
TOY_TARGETS = """name: toy_targets
extends: common/base.yaml
model:
  export: {script: models/toy.py, function: export}
converter:
  tpu_functions:
    - function_alias: tpu_func
targets: {tpu_savedmodel: {}, cpu_savedmodel: {}}
"""


def samples(count: int, width: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, width)).astype(np.float32),
             "s": np.array([f"t{i}".encode()], dtype=object)} for i in range(count)]


def test_one_request_per_signature_and_batch_size_cycling_over_the_samples() -> None:
    logs = warmup.requests({"b": samples(3), "a": samples(2)}, {"a": [4, 1], "b": [2]}, 1000)
    described = [warmup.describe(log) for log in logs]
    assert described == [
        "predict a: s string[1], x float32[1,3]",
        "predict a: s string[4], x float32[4,3]",
        "predict b: s string[2], x float32[2,3]",
    ]
    rows = warmup.batch_rows(samples(2), 5)  # rows 0, 1, 0, 1, 0 of the samples
    np.testing.assert_array_equal(rows["x"][2], samples(2)[0]["x"][0])
    assert [v.decode() for v in rows["s"]] == ["t0", "t1", "t0", "t1", "t0"]


def test_the_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    for name in ("one", "two"):
        warmup.write(tmp_path / name, warmup.requests({"k": samples(3)}, {"k": [1, 2, 8]}, 1000))
    first = warmup.warmup_path(tmp_path / "one").read_bytes()
    assert first == warmup.warmup_path(tmp_path / "two").read_bytes() and first
    assert [warmup.describe(log) for log in warmup.read(tmp_path / "one")][-1] == "predict k: s string[8], x float32[8,3]"
    assert warmup.read(tmp_path / "missing") == []


def test_more_requests_than_tf_serving_reads_is_refused() -> None:
    with pytest.raises(ValueError, match="1001 warmup requests .* exceed the limit of 1000"):
        warmup.requests({"k": samples(1)}, {"k": list(range(1, 1002))}, 5000)
    with pytest.raises(ValueError, match="3 warmup requests .* exceed the limit of 2"):
        warmup.requests({"k": samples(1)}, {"k": [1, 2, 3]}, 2)


def _peak_bytes(call) -> tuple[int, Exception | None]:
    """The most memory `call()` held at once (numpy's buffers are traced too), and what
    it raised."""
    import tracemalloc

    tracemalloc.start()
    try:
        call()
        raised = None
    except Exception as exc:  # noqa: BLE001 - returned to the test, which checks it
        raised = exc
    try:
        return tracemalloc.get_traced_memory()[1], raised
    finally:
        tracemalloc.stop()


def test_a_batch_is_allocated_once_at_its_size() -> None:
    wide = samples(3, width=256)  # 1 KiB rows
    size = 8192
    result = warmup.batch_rows(wide, size)
    assert result["x"].shape == (size, 256)
    np.testing.assert_array_equal(result["x"][4], wide[1]["x"][0])
    # The result itself is 8 MiB of floats (plus the strings' pointers): one copy, not
    # a list of pieces and then their concatenation (twice that).
    peak, raised = _peak_bytes(lambda: warmup.batch_rows(wide, size))
    assert raised is None and peak < 1.4 * (result["x"].nbytes + result["s"].nbytes)


def test_a_request_s_size_is_known_from_the_samples_without_building_it() -> None:
    mixed = [{"x": np.zeros((rows, 300), np.float32)} for rows in (1, 3, 4)]  # 1,200-byte rows
    assert warmup.request_bytes(mixed, 1000) == warmup.batch_rows(mixed, 1000)["x"].nbytes == 1_200_000
    # Learning the size allocates nothing like the 9.6 KiB of the samples' rows concatenated.
    peak, raised = _peak_bytes(lambda: warmup.request_bytes(mixed, 1000))
    assert raised is None and peak < 4096


def test_a_scalar_sample_is_refused_the_same_way_by_its_size_and_its_batch() -> None:
    scalar = [{"x": np.zeros((2, 3), np.float32)}, {"x": np.float32(1.0)}]
    for measure in (lambda: warmup.request_bytes(scalar, 4), lambda: warmup.batch_rows(scalar, 4)):
        with pytest.raises(ValueError, match="^sample input 'x' is a scalar; a warmup request batches samples along "
                                             "dimension 0$"):
            measure()


def test_a_request_larger_than_the_cap_is_refused_before_it_is_built() -> None:
    wide = [{"x": np.zeros((1, 1 << 16), np.float32)}]  # 256 KiB rows: batch 2048 is 512 MiB
    peak, raised = _peak_bytes(lambda: warmup.requests({"k": wide}, {"k": [1, 2048]}, 1000))
    assert isinstance(raised, ValueError) and str(raised).startswith(
        "the request of signature 'k' for batch size 2048 would hold 512 MiB, more than 256 MiB; lower the batch sizes")
    assert peak < 8 << 20  # nothing of that size was allocated
    many = {f"k{i}": wide for i in range(5)}
    with pytest.raises(ValueError, match="the requests would hold more than 1024 MiB in all"):
        warmup.requests(many, {k: [1000] for k in many}, 1000)


@pytest.fixture(scope="module")
def examples(built_examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the built example workspace (tests/conftest.py) with toy_targets added and
    built: the other BATCHING recipes are cached."""
    root = tmp_path_factory.mktemp("warmup_examples") / "ws"
    copy_built_examples(built_examples, root)
    (root / "recipes" / "toy_targets.yaml").write_text(TOY_TARGETS)
    done = tpubuild(root, "build", *BATCHING, env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def allowed_sizes(root: Path, name: str) -> list[int]:
    from tpubuild.config.recipe import load_recipes
    from tpubuild.config.workspace import load_workspace
    from tpubuild.stages.warmup import batch_sizes

    [recipe] = load_recipes(load_workspace(start=root), [name])
    return batch_sizes(recipe.canonical)


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
@pytest.mark.parametrize("name", BATCHING)
def test_every_batching_example_publishes_requests_tf_serving_can_replay(examples: Path, name: str,
                                                                         tmp_path: Path) -> None:
    from tpubuild.tpu.twin import make_cpu_twin

    version = examples / "out" / name / "1"
    logs = warmup.read(version)
    sizes = allowed_sizes(examples, name)
    assert sizes, name
    by_signature: dict[str, set[int]] = {}
    for log in logs:
        request = log.predict_log.request  # TF Serving's warmup util parses exactly this
        first = next(iter(request.inputs.values()))
        by_signature.setdefault(request.model_spec.signature_name, set()).add(first.tensor_shape.dim[0].size)
    assert by_signature and all(got == set(sizes) for got in by_signature.values()), (by_signature, sizes)
    # Replayed on the TPU artifact's CPU twin (as verify runs it): every request runs and
    # its outputs have the request's batch size.
    twin = tmp_path / "twin"
    make_cpu_twin(version, twin, ["serve"])
    for log, shapes in zip(logs, warmup.replay(twin, ["serve"], logs)):
        size = next(iter(log.predict_log.request.inputs.values())).tensor_shape.dim[0].size
        assert all(shape[0] == size for shape in shapes.values() if shape), (name, shapes, size)


@pytest.mark.slow  # builds the example workspace (tests/example_workspace.py, ~90 s): the slow tier
def test_a_savedmodel_target_gets_the_requests_and_inspect_lists_them(examples: Path) -> None:
    main = warmup.warmup_path(examples / "out" / "toy_targets" / "1").read_bytes()
    cpu = examples / "out" / "toy_targets" / "cpu_savedmodel" / "1"
    assert warmup.warmup_path(cpu).read_bytes() == main
    replayed = warmup.replay(cpu, ["serve"], warmup.read(cpu))  # the CPU SavedModel runs as published
    assert len(replayed) == len(warmup.read(cpu)) > 0
    done = tpubuild(None, "inspect", str(cpu))
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("warmup requests (assets.extra):\n", 1)[1].splitlines()
    assert listed == [f"  {warmup.describe(log)}" for log in warmup.read(cpu)]
