"""Batching as the runtime runs it: per-model queue names, per-shape TPU recompilation."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.convert.conftest import Toy, _save
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import batch
from tpubuild.tpu.functions import resolve_tpu_functions
from tpubuild.tpu.placement import place_on_tpu
from tpubuild.transforms import batch_checks

BATCH = {
    "num_batch_threads": 2,
    "max_batch_size": 16,
    "batch_timeout_micros": 20000,
    "allowed_batch_sizes": [4, 16],
    "max_enqueued_batches": 100,
}


def _options(**changes) -> dict:
    return {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}], "batch_options": [BATCH | changes]}


def _with_other_weights(src: Path, dst: Path) -> Path:
    """A copy of SavedModel `src` with every float variable negated: same graph, same names.

    (Two exports in one process would differ in their function names already; two servers'
    models exported by separate processes do not.)
    """
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("variables"))
    (dst / "variables").mkdir()
    reader = tf.train.load_checkpoint(str(src / "variables" / "variables"))
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = [reader.get_tensor(n) for n in names]
    tensors = [-t if getattr(t, "dtype", None) == np.float32 else t for t in tensors]
    tf.raw_ops.SaveV2(
        prefix=str(dst / "variables" / "variables"), tensor_names=names,
        shape_and_slices=[""] * len(names), tensors=tensors,
    )
    return dst


@pytest.fixture(scope="module")
def twins_of_two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Toy and a copy with other weights: exported, placed (not batched yet)."""
    root = tmp_path_factory.mktemp("two_models")
    toy = Toy()
    out = {"a-source": _save(toy, root / "a-source", {"serving_default": toy.serve}, {"tpu_func": toy.tpu_func})}
    out["b-source"] = _with_other_weights(out["a-source"], root / "b-source")
    for name in ("a", "b"):
        model = SavedModel.load(out[f"{name}-source"])
        place_on_tpu(model, resolve_tpu_functions(model, [{"function_alias": "tpu_func"}]))
        (root / f"{name}-placed").mkdir()
        model.save(root / f"{name}-placed")
        out[f"{name}-placed"] = root / f"{name}-placed"
    return out


def _shared_names(path: Path) -> list[tuple[str, str]]:
    model = SavedModel.load(path)
    return sorted(
        (n.attr["shared_name"].s.decode(), n.attr["batching_queue"].s.decode())
        for f in model.functions.values()
        for n in f.node_def
        if n.op == "BatchFunction"
    )


def test_queue_names_are_deterministic_and_differ_between_models(twins_of_two_models, run_stage):
    a1, _ = run_stage(batch.run, twins_of_two_models["a-placed"], _options())
    a2, _ = run_stage(batch.run, twins_of_two_models["a-placed"], _options())
    b, _ = run_stage(batch.run, twins_of_two_models["b-placed"], _options())
    # The two models have the same graph (function and node names too): only their
    # weights differ, and the queue name follows them.
    assert SavedModel.load(twins_of_two_models["a-placed"]).proto == SavedModel.load(twins_of_two_models["b-placed"]).proto
    ((shared, queue),) = _shared_names(a1)
    assert shared == queue and shared.startswith("tpubuild_batch_") and len(shared) == len("tpubuild_batch_") + 16
    assert _shared_names(a2) == _shared_names(a1)
    assert _shared_names(b) != _shared_names(a1)


def test_two_batched_models_answer_their_own_requests_in_one_process(twins_of_two_models, run_stage, cpu_twin):
    """Concurrent requests to two batched models with the same graph, loaded side by side.

    Python's loader already makes every shared_name unique per load (fix_node_def in
    tensorflow/python/saved_model/function_deserialization.py), so this checks the batched
    models end to end; the names themselves, which C++ loaders keep as written, are checked
    by the test above.
    """
    twins = {}
    for name in ("a", "b"):
        out, _ = run_stage(batch.run, twins_of_two_models[f"{name}-placed"], _options())
        twins[name] = cpu_twin(out).signatures["serving_default"]
    sources = {n: tf.saved_model.load(str(twins_of_two_models[f"{n}-source"])) for n in ("a", "b")}
    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    results: dict[tuple[str, int], np.ndarray] = {}
    barrier = threading.Barrier(16)

    def call(name: str, i: int) -> None:
        barrier.wait()
        results[name, i] = twins[name](x=tf.constant(x * (i + 1)))["y"].numpy()

    threads = [threading.Thread(target=call, args=(n, i)) for n in ("a", "b") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (name, i), got in results.items():
        want = sources[name].signatures["serving_default"](x=tf.constant(x * (i + 1)))["y"].numpy()
        # A batch of 4 or 16 rows versus one row: the matmul may sum in another order.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"model {name}, request {i}")


def test_allowed_batch_sizes_set_gives_no_recompilation_warning(twins_of_two_models, run_stage):
    _, result = run_stage(batch.run, twins_of_two_models["a-placed"], _options())
    assert result.warnings == []


def _described_tpu_func(path: Path) -> str:
    model = SavedModel.load(path)
    return model.describe({a: n for n, a in model.aliases.items()}["tpu_func"])


def _empty_sizes_warning(out: Path, node: str, caller: str) -> str:
    return (
        f'TPU call of {_described_tpu_func(out)} batched by "{node}" in {caller} has empty '
        "allowed_batch_sizes: batches of every size from 1 to max_batch_size (16) reach it and the "
        "TPU compiles a new program for each input shape it sees; list a few sizes in "
        "allowed_batch_sizes so that batches are padded up to one of them"
    )


def test_empty_allowed_batch_sizes_warns_about_per_shape_compilation(twins_of_two_models, run_stage):
    out, result = run_stage(batch.run, twins_of_two_models["a-placed"], _options(allowed_batch_sizes=[]))
    (site,) = result.summary["sites"]
    assert result.warnings == [_empty_sizes_warning(out, site["node"], site["caller"])]


def test_unbatched_tpu_call_with_dynamic_dimension_0_warns(twins_of_two_models):
    model = SavedModel.load(twins_of_two_models["a-placed"])
    (caller,) = [name for name, f in model.functions.items() if any(n.op == "TPUPartitionedCall" for n in f.node_def)]
    (node,) = [n for n in model.functions[caller].node_def if n.op == "TPUPartitionedCall"]
    assert batch_checks.recompilation_warnings(model) == [
        f'TPU call of {_described_tpu_func(twins_of_two_models["a-placed"])} ("{node.name}" in '
        f'{caller}) is not batched and its input "x" (shape [None, 4]) has a dynamic dimension 0: '
        "every request size reaches it and the TPU compiles a new program for each input shape it "
        "sees; batch the call (batch_options with allowed_batch_sizes) or fix dimension 0"
    ]


class FixedRows(tf.Module):
    def __init__(self) -> None:
        self.w = tf.Variable(tf.ones([4, 2]), name="w")

    @tf.function(input_signature=[tf.TensorSpec([8, 4], tf.float32)])
    def tpu_func(self, x):
        return tf.matmul(x, self.w)

    @tf.function(input_signature=[tf.TensorSpec([8, 4], tf.float32)])
    def serve(self, x):
        return {"y": self.tpu_func(x)}


def test_unbatched_tpu_call_with_fixed_dimension_0_is_quiet(tmp_path):
    module = FixedRows()
    source = _save(module, tmp_path / "fixed", {"serving_default": module.serve}, {"tpu_func": module.tpu_func})
    model = SavedModel.load(source)
    place_on_tpu(model, resolve_tpu_functions(model, [{"function_alias": "tpu_func"}]))
    assert any(n.op == "TPUPartitionedCall" for f in model.functions.values() for n in f.node_def)
    assert batch_checks.recompilation_warnings(model) == []


def test_signature_batching_with_empty_sizes_warns_for_the_tpu_call_inside(twins_of_two_models, run_stage):
    out, result = run_stage(
        batch.run,
        twins_of_two_models["a-placed"],
        _options(allowed_batch_sizes=[], experimental={"signature_name": "serving_default"}),
    )
    model = SavedModel.load(out)
    ((caller, node),) = [
        (name, n.name) for name, f in model.functions.items() for n in f.node_def if n.op == "BatchFunction"
    ]
    assert result.warnings == [_empty_sizes_warning(out, node, caller)]
