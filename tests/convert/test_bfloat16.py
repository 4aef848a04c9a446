"""The bfloat16 stage on real SavedModels: numerics, stored variables, safety check, scope."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.tolerances import BFLOAT16, assert_close
from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages import bfloat16


def _options(scope: str = "TPU", filterlist=(), skip: bool = False) -> dict:
    return {
        "tags": ["serve"],
        "tpu_functions": [{"function_alias": "tpu_func"}],
        "bfloat16_optimization_options": {
            "scope": scope,
            "skip_safety_checks": skip,
            "filterlist": list(filterlist),
        },
    }


def _variables_size(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "variables").iterdir())


def _assert_close(src, dst, key: str, width: int) -> None:
    x = tf.constant(np.random.default_rng(3).normal(size=(5, width)).astype(np.float32))
    want = src.signatures["serving_default"](x=x)
    got = dst.signatures["serving_default"](x=x)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == tf.float32  # the signature keeps its dtypes
        # bfloat16 against float32: 8 mantissa bits, a few roundings (tests/tolerances.py).
        assert_close(got[name].numpy(), want[name].numpy(), BFLOAT16, name)


def _ops(path: Path, fn_alias: str = "tpu_func") -> dict[str, list]:
    model = SavedModel.load(path)
    fn = {a: n for n, a in model.aliases.items()}[fn_alias]
    out: dict[str, list] = {}
    for node in model.functions[fn].node_def:
        out.setdefault(node.op, []).append(node)
    return out


def test_tpu_scope_on_a_placed_model_matches_on_the_twin(models, placed, run_stage, cpu_twin):
    out, result = run_stage(bfloat16.run, placed["mlp"], _options(filterlist=["Softmax"]))
    ops = _ops(out)
    assert {n.attr["T"].type for n in ops["MatMul"]} == {tf.bfloat16.as_datatype_enum}
    # Casts inside the TPU computation belong to its cluster, like every other node there.
    assert all("_tpu_replicate" in n.attr for n in ops["Cast"])
    assert result.summary["converted_ops"]["MatMul"] == 2
    assert result.summary["kept_float32"]["filterlist"] == {"Softmax": 1}
    assert result.summary["variables"] == ["b2", "w1", "w2"]
    _assert_close(tf.saved_model.load(str(models["mlp"])), cpu_twin(out), "probs", 16)


def test_variables_are_stored_as_bfloat16(models, run_stage):
    out, _ = run_stage(bfloat16.run, models["mlp"], _options())
    reader = tf.train.load_checkpoint(str(out / "variables" / "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["w2/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    assert dtypes["b2/.ATTRIBUTES/VARIABLE_VALUE"] == tf.bfloat16
    objects = SavedModel.load(out).meta_graph.object_graph_def.nodes
    saved = {n.variable.name: n.variable.dtype for n in objects if n.WhichOneof("kind") == "variable"}
    assert saved == {name: tf.bfloat16.as_datatype_enum for name in ("w1", "w2", "b2")}
    loaded = tf.saved_model.load(str(out))
    assert loaded.w2.dtype == tf.bfloat16
    src = tf.saved_model.load(str(models["mlp"]))
    # Stored data, not a computation: one round-to-nearest-even cast, the same on every CPU.
    np.testing.assert_array_equal(
        loaded.w2.numpy(), tf.cast(src.w2, tf.bfloat16).numpy()
    )
    ratio = _variables_size(out) / _variables_size(models["mlp"])
    assert 0.45 < ratio < 0.55
    # The source's variables were hardlinked into the output, never written through.
    assert tf.train.load_checkpoint(str(models["mlp"] / "variables" / "variables")).get_variable_to_dtype_map()[
        "w2/.ATTRIBUTES/VARIABLE_VALUE"
    ] == tf.float32


def test_cpu_code_reading_a_converted_variable_gets_a_cast(models, run_stage):
    out, _ = run_stage(bfloat16.run, models["mlp"], _options())
    _assert_close(tf.saved_model.load(str(models["mlp"])), tf.saved_model.load(str(out)), "bias_sum", 16)


def test_tf1_session_loading_restores_the_bfloat16_checkpoint(models, run_stage):
    out, _ = run_stage(bfloat16.run, models["mlp"], _options())
    x = np.random.default_rng(4).normal(size=(3, 16)).astype(np.float32)
    want = tf.saved_model.load(str(models["mlp"])).signatures["serving_default"](x=x)
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(out))
        sig = meta.signature_def["serving_default"]
        got = sess.run({k: v.name for k, v in sig.outputs.items()}, {sig.inputs["x"].name: x})
    for name in want:
        # A TF1 session runs the bfloat16 graph: bfloat16 against float32.
        assert_close(got[name], want[name].numpy(), BFLOAT16, name)


def test_filterlist_keeps_ops_float32_with_casts_around(models, run_stage):
    out, _ = run_stage(bfloat16.run, models["mlp"], _options(filterlist=["Softmax"]))
    ops = _ops(out)
    (softmax,) = ops["Softmax"]
    assert softmax.attr["T"].type == tf.float32.as_datatype_enum
    producer = {n.name: n for nodes in ops.values() for n in nodes}[softmax.input[0].split(":")[0]]
    assert (producer.op, producer.attr["DstT"].type) == ("Cast", tf.float32.as_datatype_enum)
    out2, result = run_stage(bfloat16.run, models["mlp"], _options())
    (softmax,) = _ops(out2)["Softmax"]
    assert softmax.attr["T"].type == tf.bfloat16.as_datatype_enum
    assert result.summary["kept_float32"]["filterlist"] == {}


def test_scope_all_converts_cpu_functions_too(models, run_stage):
    out, result = run_stage(bfloat16.run, models["mlp"], _options(scope="ALL"))
    model = SavedModel.load(out)
    serve = next(n for n in model.functions if n.startswith("__inference_serve_"))
    assert serve in result.summary["functions"]
    sums = [n for n in model.functions[serve].node_def if n.op == "Sum"]
    assert [n.attr["T"].type for n in sums] == [tf.bfloat16.as_datatype_enum]
    assert not any("traced_restore" in f or "traced_save" in f for f in result.summary["functions"])
    _assert_close(tf.saved_model.load(str(models["mlp"])), tf.saved_model.load(str(out)), "probs", 16)


def test_scope_tpu_without_any_tpu_function_is_an_error(models, run_stage):
    options = _options()
    options["tpu_functions"] = []
    with pytest.raises(ConversionError) as err:
        run_stage(bfloat16.run, models["mlp"], options)
    assert str(err.value) == (
        "bfloat16: scope TPU but the model has no TPU function; set "
        "bfloat16_optimization_options.scope to ALL or name tpu_functions"
    )


def test_model_with_bfloat16_ops_is_refused_unless_skipped(models, tmp_path, context, run_stage):
    model = SavedModel.load(models["already_bf16"])
    fn = {a: n for n, a in model.aliases.items()}["tpu_func"]
    out = tmp_path / "refused"
    out.mkdir()
    with pytest.raises(ConversionError) as err:
        bfloat16.run(models["already_bf16"], out, _options(), context)
    assert str(err.value) == (
        f'bfloat16: function "tpu_func" (alias of {fn}): op "Cast" (Cast) already uses bfloat16; '
        "the model is refused (set bfloat16_optimization_options.skip_safety_checks to convert "
        "it anyway)"
    )
    assert list(out.iterdir()) == []
    converted, _ = run_stage(bfloat16.run, models["already_bf16"], _options(skip=True))
    x = tf.constant([[1.0, 2.0, 3.0, 4.5]])
    want = tf.saved_model.load(str(models["already_bf16"])).signatures["serving_default"](x=x)["y"]
    got = tf.saved_model.load(str(converted)).signatures["serving_default"](x=x)["y"]
    # The converted model computes in bfloat16 where the source did not: bfloat16 bounds.
    assert_close(got.numpy(), want.numpy(), BFLOAT16)


def test_ops_without_a_bfloat16_cpu_kernel_stay_float32():
    from tpubuild.transforms.bfloat16 import has_cpu_kernel

    bf16 = tf.bfloat16.as_datatype_enum
    assert has_cpu_kernel("MatMul", (("T", bf16),))
    # Cholesky has no bfloat16 CPU kernel in TF 2.21: the CPU twin could not run it.
    assert not has_cpu_kernel("Cholesky", (("T", bf16),))


def test_control_flow_bodies_inside_the_tpu_function_are_converted(models, placed, run_stage, cpu_twin):
    out, result = run_stage(bfloat16.run, placed["control_flow"], _options())
    model = SavedModel.load(out)
    bodies = [
        name for name in result.summary["functions"]
        if any(n.op == "MatMul" for n in model.functions[name].node_def)
    ]
    assert len(bodies) == 2  # the cond branch and the while body
    for name in bodies:
        (matmul,) = [n for n in model.functions[name].node_def if n.op == "MatMul"]
        assert matmul.attr["T"].type == tf.bfloat16.as_datatype_enum
    assert result.summary["variables"] == ["w"]
    src = tf.saved_model.load(str(models["control_flow"]))
    twin = cpu_twin(out)
    for x in ([[0.5, 0.25, -0.125, 1.0]], [[-1.0, -2.0, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4]]):
        want = src.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        got = twin.signatures["serving_default"](x=tf.constant(x))["y"].numpy()
        # Converted cond / while bodies compute in bfloat16: bfloat16 against float32.
        assert_close(got, want, BFLOAT16, str(x))
