"""The batch stage on real SavedModels: graph shape, numerics on CPU, concurrency, errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.tolerances import FLOAT32_REORDERED, assert_close
from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import batch

BATCH = {
    "num_batch_threads": 2,
    "max_batch_size": 16,
    "batch_timeout_micros": 2000,
    "allowed_batch_sizes": [2, 4, 8],
    "max_enqueued_batches": 100,
    "disable_large_batch_splitting": False,
}


def _options(**experimental: str) -> dict:
    entry = dict(BATCH)
    if experimental:
        entry["experimental"] = experimental
    return {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}], "batch_options": [entry]}


def _batch_nodes(path: Path) -> list:
    model = SavedModel.load(path)
    return [
        (name, node)
        for name, fdef in model.functions.items()
        for node in fdef.node_def
        if node.op == "BatchFunction"
    ]


def _call_concurrently(model, inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
    """Call the serving signature from one thread per input, all released at once."""
    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(len(inputs))

    def call(i: int) -> None:
        barrier.wait()
        results[i] = model.signatures["serving_default"](x=tf.constant(inputs[i]))["y"].numpy()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _assert_same(src, dst, sizes=(1, 3, 8, 12)) -> None:
    rng = np.random.default_rng(7)
    for size in sizes:
        x = rng.normal(size=(size, 4)).astype(np.float32)
        want = src.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        got = dst.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        # Batched calls sum in another order than unbatched ones (padding, concatenation,
        # other kernels for other shapes): a few ulps apart on some CPUs, never bit-equal.
        assert_close(got, want, FLOAT32_REORDERED, f"batch of {size}")


def test_default_batches_every_tpu_call_and_twin_matches(models, placed, run_stage, cpu_twin):
    out, result = run_stage(batch.run, placed["toy"], _options())
    (caller, node), = _batch_nodes(out)
    assert node.attr["max_batch_size"].i == 16
    assert node.attr["num_batch_threads"].i == 2
    assert node.attr["batch_timeout_micros"].i == 2000
    assert list(node.attr["allowed_batch_sizes"].list.i) == [2, 4, 8]
    assert node.attr["max_enqueued_batches"].i == 100
    assert node.attr["enable_large_batch_splitting"].b is True
    assert node.attr["shared_name"].s.decode().startswith("tpubuild_batch_")
    assert list(node.attr["Tcaptured"].list.type) == [tf.resource.as_datatype_enum] * 2
    # The batched function makes the TPU call itself, so the CPU twin can map it back.
    wrapper = SavedModel.load(out).functions[node.attr["f"].func.name]
    assert [n.op for n in wrapper.node_def] == ["TPUOrdinalSelector", "TPUPartitionedCall"]
    (site,) = result.summary["sites"]
    assert result.summary["mode"] == "tpu_call_sites"
    assert (site["batched_inputs"], site["captured_inputs"], site["tpu"]) == (1, 2, True)
    _assert_same(tf.saved_model.load(str(models["toy"])), cpu_twin(out))


def test_each_tpu_call_site_gets_its_own_queue_and_concurrent_callers_match(
    models, placed, run_stage, cpu_twin
):
    out, result = run_stage(batch.run, placed["two_calls"], _options())
    nodes = _batch_nodes(out)
    assert len(nodes) == 2
    assert len({node.attr["shared_name"].s for _, node in nodes}) == 2
    src = tf.saved_model.load(str(models["two_calls"]))
    twin = cpu_twin(out)
    _assert_same(src, twin)
    inputs = [np.full((i % 5 + 1, 4), i / 3, np.float32) for i in range(16)]
    results = _call_concurrently(twin, inputs)
    for i, x in enumerate(inputs):
        want = src.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        # Rows of a shared batch are summed with other callers' rows: close, not bit-equal.
        assert_close(results[i], want, FLOAT32_REORDERED, f"caller {i}")


def test_unplaced_model_batches_the_recipes_tpu_functions(models, run_stage):
    out, result = run_stage(batch.run, models["toy"], _options())
    (site,) = result.summary["sites"]
    fn = {a: n for n, a in SavedModel.load(models["toy"]).aliases.items()}["tpu_func"]
    assert (site["tpu"], site["callee"], site["caller"].startswith("__inference_serve_")) == (False, fn, True)
    assert set(SavedModel.load(out).aliases.values()) == {"tpu_func"}
    _assert_same(tf.saved_model.load(str(models["toy"])), tf.saved_model.load(str(out)))


def test_variable_length_inputs_are_a_warning(placed, run_stage):
    _, result = run_stage(batch.run, placed["image"], _options())
    (warning,) = result.warnings
    assert warning.endswith(
        'input "seq" has shape [None, None, 2]; requests whose other dimensions differ fail at '
        'serving time with "Dimensions of inputs should match"'
    )


def test_function_alias_batches_its_call_sites(models, run_stage):
    out, result = run_stage(batch.run, models["toy"], _options(function_alias="tpu_func"))
    (caller, node), = _batch_nodes(out)
    assert result.summary["target"] == "tpu_func"
    wrapper = SavedModel.load(out).functions[node.attr["f"].func.name]
    assert [n.op for n in wrapper.node_def] == ["StatefulPartitionedCall"]
    _assert_same(tf.saved_model.load(str(models["toy"])), tf.saved_model.load(str(out)))


def test_signature_batching_wraps_the_whole_signature(models, run_stage):
    out, result = run_stage(batch.run, models["toy"], _options(signature_name="serving_default"))
    model = SavedModel.load(out)
    signature_fn = model.functions[model.signatures["serving_default"]]
    assert [n.op for n in signature_fn.node_def] == ["BatchFunction"]
    assert result.summary["mode"] == "signature"
    _assert_same(tf.saved_model.load(str(models["toy"])), tf.saved_model.load(str(out)))


def test_sixteen_concurrent_callers_get_their_own_rows(models, run_stage):
    out, _ = run_stage(batch.run, models["toy"], _options(signature_name="serving_default"))
    src = tf.saved_model.load(str(models["toy"]))
    dst = tf.saved_model.load(str(out))
    inputs = [np.full((i % 4 + 1, 4), i, np.float32) for i in range(16)]
    results = _call_concurrently(dst, inputs)
    for i, x in enumerate(inputs):
        want = src.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        # Rows of a shared batch are summed with other callers' rows: close, not bit-equal.
        assert_close(results[i], want, FLOAT32_REORDERED, f"caller {i}")


def test_larger_than_max_batch_size_is_refused_by_the_kernel(models, run_stage):
    out, _ = run_stage(batch.run, models["toy"], _options(function_alias="tpu_func"))
    dst = tf.saved_model.load(str(out))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Task size 17 is larger than maximum input batch size 16"):
        dst.signatures["serving_default"](x=tf.zeros([17, 4]))


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        (
            "scalar_fn",
            'batched function "scalar_fn" (alias of {fn}): input "x" is a scalar: '
            "Batching input tensors must have at least one dimension",
        ),
        (
            "static_fn",
            'batched function "static_fn" (alias of {fn}): input "x" has shape [4, 3]; dimension 0 '
            "must be None (-1) so that requests can be concatenated (at serving time: Batching "
            "input tensors supplied in a given op invocation must have equal 0th-dimension size)",
        ),
        (
            "reduce_fn",
            'batched function "reduce_fn" (alias of {fn}): output "identity" has shape [3]; its '
            "dimension 0 must follow the batched inputs (Batched output tensor's 0th dimension "
            "does not equal the sum of the 0th dimension sizes of the input tensors)",
        ),
        (
            "sparse_fn",
            'batched function "sparse_fn" (alias of {fn}): input "x" is a SparseTensor: '
            "BatchFunction does not accept SparseTensors",
        ),
    ],
)
def test_batching_shape_errors(models, run_stage, alias, message):
    fn = {a: n for n, a in SavedModel.load(models["bad_batch"]).aliases.items()}[alias]
    with pytest.raises(ConversionError) as err:
        run_stage(batch.run, models["bad_batch"], _options(function_alias=alias))
    assert str(err.value) == message.format(fn=fn)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "scalar",
            'batched signature "scalar": input "x" is a scalar: Batching input tensors must have '
            "at least one dimension",
        ),
        (
            "reduce",
            'batched signature "reduce": output "y" has shape [3]; its dimension 0 must follow the '
            "batched inputs (Batched output tensor's 0th dimension does not equal the sum of the "
            "0th dimension sizes of the input tensors)",
        ),
    ],
)
def test_signature_shape_errors(models, run_stage, key, message):
    with pytest.raises(ConversionError) as err:
        run_stage(batch.run, models["bad_batch"], _options(signature_name=key))
    assert str(err.value) == message


def test_errors_leave_the_output_empty(models, tmp_path, context):
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(ConversionError):
        batch.run(models["bad_batch"], out, _options(function_alias="static_fn"), context)
    assert list(out.iterdir()) == []


def test_unknown_batch_target_names_the_field(models, run_stage):
    with pytest.raises(ConversionError) as err:
        run_stage(batch.run, models["toy"], _options(signature_name="serve"))
    assert str(err.value) == (
        'batch_options[0].experimental: unknown signature "serve"; signatures: "serving_default"'
    )
    with pytest.raises(ConversionError) as err:
        run_stage(batch.run, models["toy"], _options(function_alias="tpu_fun"))
    assert str(err.value) == (
        'batch_options[0].experimental: unknown function alias "tpu_fun" (did you mean '
        '"tpu_func"?); aliases: "tpu_func"'
    )


def test_no_tpu_call_and_no_target_is_an_error(models, run_stage):
    options = _options()
    options["tpu_functions"] = []
    with pytest.raises(ConversionError) as err:
        run_stage(batch.run, models["toy"], options)
    assert str(err.value) == (
        "batch_options[0]: the model has no TPU function call to batch; name a target with "
        "batch_options[0].experimental (function_alias, concrete_function_name or signature_name)"
    )
