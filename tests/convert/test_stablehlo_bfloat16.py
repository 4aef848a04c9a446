"""bfloat16 inside jax2tf's XlaCallModule (transforms/stablehlo_bfloat16.py), on real modules.

The modules come from jax2tf.convert (native serialization, lowered for CPU and TPU), run
once per module in a process of its own (JAX_EXPORTS): imported in a pytest worker, JAX's
threads would make every later fork of that worker (each `tpubuild` a later test runs)
print JAX's os.fork() warning, and risk its deadlock. The rewritten node runs through
TensorFlow's own XlaCallModule kernel.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli import REPO
from tests.realmodels import jax_models
from tests.tolerances import BFLOAT16, FLOAT32_REORDERED, assert_close

# Not importorskip: that would import JAX here.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")

MLP_X = {"n": 5, "seed": 2}

# Everything these tests need from JAX, made in one process: the XlaCallModule NodeDefs
# jax2tf makes for a function (`<name>.node`), SavedModels whose `tpu_func` alias holds
# one (`<name>/`), and what JAX itself computes (`mlp.npy`).
JAX_EXPORTS = f"""
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
import jax.numpy as jnp
from jax.experimental import jax2tf

from tests.realmodels import jax_models as m

out = Path(sys.argv[1])


def node(fn, specs, polymorphic_shapes=None):
    converted = tf.function(jax2tf.convert(fn, polymorphic_shapes=polymorphic_shapes,
                                           native_serialization_platforms=m.PLATFORMS), autograph=False)
    graph = converted.get_concrete_function(*specs).graph.as_graph_def()
    return next(n for n in graph.node if n.op == "XlaCallModule").SerializeToString()


def saved_model(name, fn, spec, platforms=m.PLATFORMS, signature_outputs=False):
    class Exported(tf.Module):
        @tf.function(input_signature=[spec], autograph=False)
        def tpu_func(self, x):
            y = jax2tf.convert(fn, native_serialization_platforms=platforms)(x)
            return {{"y": y}} if signature_outputs else y

    module = Exported()
    tf.saved_model.save(module, str(out / name), signatures={{"serving_default": module.tpu_func}},
                        options=tf.saved_model.SaveOptions(function_aliases={{"tpu_func": module.tpu_func}}))


specs = ({{k: tf.TensorSpec(v.shape, tf.float32) for k, v in m.params().items()}},
         tf.TensorSpec([None, m.FEATURES], tf.float32))
(out / "mlp.node").write_bytes(node(m.mlp, specs, [None, "(b, ...)"]))
np.save(out / "mlp.npy", np.asarray(m.mlp(m.params(), m.features(**{MLP_X!r}))))
(out / "cholesky.node").write_bytes(node(
    lambda x: jnp.linalg.cholesky(x @ x.T + 4 * jnp.eye(x.shape[0], dtype=x.dtype)), [tf.TensorSpec([4, 4], tf.float32)]))
saved_model("logdet", lambda x: jnp.log(jnp.diagonal(jnp.linalg.cholesky(x @ x.T + 4 * jnp.eye(4, dtype=x.dtype)))),
            tf.TensorSpec([4, 4], tf.float32))
saved_model("double", lambda x: x * 2.0, tf.TensorSpec([2, 3], tf.float32))
saved_model("tpu_only", lambda v: v * 2.0 + 1.0, tf.TensorSpec([2, 3], tf.float32), platforms=("tpu",),
            signature_outputs=True)
"""


@pytest.fixture(scope="module")
def jax_exports(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("jax_exports")
    result = subprocess.run([sys.executable, "-c", JAX_EXPORTS, str(out)], cwd=REPO, capture_output=True, text=True, check=False,
                            timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _node(jax_exports: Path, name: str):
    """The XlaCallModule NodeDef jax2tf made for `name` (a fresh copy each call)."""
    from tensorflow.core.framework.node_def_pb2 import NodeDef

    node = NodeDef()
    node.ParseFromString((jax_exports / f"{name}.node").read_bytes())
    return node


def _run(node, args):
    """TensorFlow's XlaCallModule kernel on CPU with the node's attrs."""
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    a = node.attr
    return gen_xla_ops.xla_call_module(
        args=args, version=a["version"].i, module=a["module"].s, Sout=list(a["Sout"].list.shape),
        Tout=list(a["Tout"].list.type), dim_args_spec=list(a["dim_args_spec"].list.s),
        platforms=list(a["platforms"].list.s), function_list=[], has_token_input_output=a["has_token_input_output"].b,
        disabled_checks=list(a["disabled_checks"].list.s))


def test_the_module_computes_in_bfloat16_and_a_filterlisted_op_stays_float32(jax_exports):
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    from tpubuild.transforms.stablehlo_bfloat16 import FILTERLIST_REASON, convert_module

    node = _node(jax_exports, "mlp")
    rewrite = convert_module(node, {"stablehlo.exponential"})
    assert rewrite.kept == {"stablehlo.exponential": {"count": 1, "reason": FILTERLIST_REASON}}
    assert rewrite.converted_ops["stablehlo.dot_general"] >= 2  # both layers (per lowered platform)
    assert set(node.attr["Tin"].list.type) == {types_pb2.DT_BFLOAT16}
    assert list(node.attr["Tout"].list.type) == [types_pb2.DT_BFLOAT16]
    params, x = jax_models.params(), jax_models.features(**MLP_X)
    # jax2tf flattens the params dict in sorted key order, then x.
    args = [tf.constant(params[k], tf.bfloat16) for k in sorted(params)] + [tf.constant(x, tf.bfloat16)]
    (got,) = _run(node, args)
    assert got.dtype == tf.bfloat16
    # bfloat16 keeps 8 mantissa bits: each of the MLP's few roundings costs ~0.4%.
    assert_close(got.numpy().astype(np.float32), np.load(jax_exports / "mlp.npy"), BFLOAT16)


def test_a_custom_call_stays_float32_between_converts(jax_exports):
    from tpubuild.transforms.stablehlo_bfloat16 import convert_module

    node = _node(jax_exports, "cholesky")
    rewrite = convert_module(node, set())
    # The CPU lowering calls LAPACK through a custom call; the TPU one is stablehlo.cholesky.
    [(label, kept)] = rewrite.kept.items()
    assert label.startswith("stablehlo.custom_call @lapack_") and kept["count"] == 1, rewrite.kept
    assert "custom call" in kept["reason"]
    assert rewrite.converted_ops.get("stablehlo.cholesky") == 1


def _saved_model(jax_exports: Path, name: str):
    """The SavedModel `name` of JAX_EXPORTS, whose `tpu_func` (an alias) holds an XlaCallModule, as tpubuild loads it."""
    from tpubuild.savedmodel.model import SavedModel

    return SavedModel.load(jax_exports / name)


def test_what_cannot_be_converted_is_one_warning_naming_the_op_and_the_summary_agrees(jax_exports):
    from tpubuild.transforms import bfloat16

    model = _saved_model(jax_exports, "logdet")
    fn = next(name for name in model.functions if model.alias_of(name) == "tpu_func")
    plan = bfloat16.convert(model, {fn}, [])
    assert len(plan.warnings) == 1, plan.warnings
    assert "XlaCallModule node 'XlaCallModule'" in plan.warnings[0] and '"tpu_func"' in plan.warnings[0]
    assert "stablehlo.custom_call @lapack_" in plan.warnings[0] and "stays float32" in plan.warnings[0]
    [entry] = plan.summary()["xla_call_modules"]
    assert entry["function"] == "tpu_func" and "stablehlo.log" in entry["converted_ops"]
    assert plan.converted_ops["XlaCallModule"] == 1


def test_an_unreadable_module_stays_float32_with_one_warning_and_is_not_counted(jax_exports):
    from tpubuild.report.formats import bfloat16_line
    from tpubuild.transforms import bfloat16

    model = _saved_model(jax_exports, "double")
    fn = next(name for name in model.functions if model.alias_of(name) == "tpu_func")
    node = next(n for n in model.functions[fn].node_def if n.op == "XlaCallModule")
    node.attr["module"].s = b"ML\xefR not StableHLO"
    plan = bfloat16.convert(model, {fn}, [])
    assert len(plan.warnings) == 1 and "stays float32" in plan.warnings[0], plan.warnings
    assert "XlaCallModule" not in plan.converted_ops
    line = bfloat16_line({"scope": "TPU", **plan.summary()})
    assert "kept float32: all of XlaCallModule XlaCallModule in tpu_func" in line, line


def test_the_cpu_twin_runs_a_module_lowered_for_tpu_only(jax_exports, tmp_path):
    import tensorflow as tf

    from tpubuild.tpu.twin import make_cpu_twin

    shutil.copytree(jax_exports / "tpu_only", tmp_path / "model")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(Exception, match="platform"):  # as exported, CPU refuses the TPU-only module
        tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"](x=tf.constant(x))
    make_cpu_twin(tmp_path / "model", tmp_path / "twin", ["serve"])
    got = tf.saved_model.load(str(tmp_path / "twin")).signatures["serving_default"](x=tf.constant(x))["y"].numpy()
    # One multiply-add in float32, on whichever CPU kernel XLA picks.
    assert_close(got, x * 2.0 + 1.0, FLOAT32_REORDERED)
