"""bfloat16 inside jax2tf's XlaCallModule (transforms/stablehlo_bfloat16.py), on real modules.

The modules come from jax2tf.convert in this process (native serialization, lowered for
CPU and TPU); the rewritten node runs through TensorFlow's own XlaCallModule kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.realmodels import jax_models
from tests.tolerances import BFLOAT16, FLOAT32_REORDERED, assert_close

pytest.importorskip("jax")


def _node(fn, specs, polymorphic_shapes=None):
    """The XlaCallModule NodeDef jax2tf makes for `fn` traced at `specs`."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    converted = tf.function(jax2tf.convert(fn, polymorphic_shapes=polymorphic_shapes,
                                           native_serialization_platforms=jax_models.PLATFORMS), autograph=False)
    graph = converted.get_concrete_function(*specs).graph.as_graph_def()
    return next(n for n in graph.node if n.op == "XlaCallModule")


@pytest.fixture(scope="module")
def mlp_node():
    import tensorflow as tf

    specs = ({k: tf.TensorSpec(v.shape, tf.float32) for k, v in jax_models.params().items()},
             tf.TensorSpec([None, jax_models.FEATURES], tf.float32))
    return _node(jax_models.mlp, specs, [None, "(b, ...)"])


def _copy(node):
    from tensorflow.core.framework.node_def_pb2 import NodeDef

    copy = NodeDef()
    copy.CopyFrom(node)
    return copy


def _run(node, args):
    """TensorFlow's XlaCallModule kernel on CPU with the node's attrs."""
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    a = node.attr
    return gen_xla_ops.xla_call_module(
        args=args, version=a["version"].i, module=a["module"].s, Sout=list(a["Sout"].list.shape),
        Tout=list(a["Tout"].list.type), dim_args_spec=list(a["dim_args_spec"].list.s),
        platforms=list(a["platforms"].list.s), function_list=[], has_token_input_output=a["has_token_input_output"].b,
        disabled_checks=list(a["disabled_checks"].list.s))


def test_the_module_computes_in_bfloat16_and_a_filterlisted_op_stays_float32(mlp_node):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    from tpubuild.transforms.stablehlo_bfloat16 import FILTERLIST_REASON, convert_module

    node = _copy(mlp_node)
    rewrite = convert_module(node, {"stablehlo.exponential"})
    assert rewrite.kept == {"stablehlo.exponential": {"count": 1, "reason": FILTERLIST_REASON}}
    assert rewrite.converted_ops["stablehlo.dot_general"] >= 2  # both layers (per lowered platform)
    assert set(node.attr["Tin"].list.type) == {types_pb2.DT_BFLOAT16}
    assert list(node.attr["Tout"].list.type) == [types_pb2.DT_BFLOAT16]
    params, x = jax_models.params(), jax_models.features(5, seed=2)
    # jax2tf flattens the params dict in sorted key order, then x.
    args = [tf.constant(params[k], tf.bfloat16) for k in sorted(params)] + [tf.constant(x, tf.bfloat16)]
    (got,) = _run(node, args)
    assert got.dtype == tf.bfloat16
    # bfloat16 keeps 8 mantissa bits: each of the MLP's few roundings costs ~0.4%.
    assert_close(got.numpy().astype(np.float32), np.asarray(jax_models.mlp(params, x)), BFLOAT16)


def test_a_custom_call_stays_float32_between_converts():
    import tensorflow as tf

    from tpubuild.transforms.stablehlo_bfloat16 import convert_module

    def cholesky(x):
        import jax.numpy as jnp

        return jnp.linalg.cholesky(x @ x.T + 4 * jnp.eye(x.shape[0], dtype=x.dtype))

    node = _node(cholesky, [tf.TensorSpec([4, 4], tf.float32)])
    rewrite = convert_module(node, set())
    # The CPU lowering calls LAPACK through a custom call; the TPU one is stablehlo.cholesky.
    [(label, kept)] = rewrite.kept.items()
    assert label.startswith("stablehlo.custom_call @lapack_") and kept["count"] == 1, rewrite.kept
    assert "custom call" in kept["reason"]
    assert rewrite.converted_ops.get("stablehlo.cholesky") == 1


def _saved_model(tmp_path: Path, fn, spec):
    """A SavedModel whose `tpu_func` (an alias) holds fn's XlaCallModule, as loaded by tpubuild."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    class Exported(tf.Module):
        @tf.function(input_signature=[spec], autograph=False)
        def tpu_func(self, x):
            return jax2tf.convert(fn, native_serialization_platforms=jax_models.PLATFORMS)(x)

    module = Exported()
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.tpu_func},
                        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}))
    from tpubuild.savedmodel.model import SavedModel

    return SavedModel.load(tmp_path / "model")


def test_what_cannot_be_converted_is_one_warning_naming_the_op_and_the_summary_agrees(tmp_path):
    import tensorflow as tf

    from tpubuild.transforms import bfloat16

    def logdet(x):
        import jax.numpy as jnp

        return jnp.log(jnp.diagonal(jnp.linalg.cholesky(x @ x.T + 4 * jnp.eye(4, dtype=x.dtype))))

    model = _saved_model(tmp_path, logdet, tf.TensorSpec([4, 4], tf.float32))
    fn = next(name for name in model.functions if model.alias_of(name) == "tpu_func")
    plan = bfloat16.convert(model, {fn}, [])
    assert len(plan.warnings) == 1, plan.warnings
    assert "XlaCallModule node 'XlaCallModule'" in plan.warnings[0] and '"tpu_func"' in plan.warnings[0]
    assert "stablehlo.custom_call @lapack_" in plan.warnings[0] and "stays float32" in plan.warnings[0]
    [entry] = plan.summary()["xla_call_modules"]
    assert entry["function"] == "tpu_func" and "stablehlo.log" in entry["converted_ops"]
    assert plan.converted_ops["XlaCallModule"] == 1


def test_an_unreadable_module_stays_float32_with_one_warning_and_is_not_counted(tmp_path):
    import tensorflow as tf

    from tpubuild.report.formats import bfloat16_line
    from tpubuild.transforms import bfloat16

    model = _saved_model(tmp_path, lambda x: x * 2.0, tf.TensorSpec([2, 3], tf.float32))
    fn = next(name for name in model.functions if model.alias_of(name) == "tpu_func")
    node = next(n for n in model.functions[fn].node_def if n.op == "XlaCallModule")
    node.attr["module"].s = b"ML\xefR not StableHLO"
    plan = bfloat16.convert(model, {fn}, [])
    assert len(plan.warnings) == 1 and "stays float32" in plan.warnings[0], plan.warnings
    assert "XlaCallModule" not in plan.converted_ops
    line = bfloat16_line({"scope": "TPU", **plan.summary()})
    assert "kept float32: all of XlaCallModule XlaCallModule in tpu_func" in line, line


def test_the_cpu_twin_runs_a_module_lowered_for_tpu_only(tmp_path):
    import tensorflow as tf
    from jax.experimental import jax2tf

    from tpubuild.tpu.twin import make_cpu_twin

    class Exported(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)], autograph=False)
        def serve(self, x):
            return {"y": jax2tf.convert(lambda v: v * 2.0 + 1.0, native_serialization_platforms=("tpu",))(x)}

    module = Exported()
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.serve})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(Exception, match="platform"):  # as exported, CPU refuses the TPU-only module
        tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"](x=tf.constant(x))
    make_cpu_twin(tmp_path / "model", tmp_path / "twin", ["serve"])
    got = tf.saved_model.load(str(tmp_path / "twin")).signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    # One multiply-add in float32, on whichever CPU kernel XLA picks.
    assert_close(got, x * 2.0 + 1.0, FLOAT32_REORDERED)
