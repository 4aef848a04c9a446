"""TPU placement: graph shape, loading with tf.saved_model.load, and the CPU twin's outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from sm_models import ALIASES, SIGNATURES, run_signature
from tensorflow.core.protobuf.tpu.topology_pb2 import TopologyProto

from tests.tolerances import FLOAT32_REORDERED, assert_close
from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages.base import StageContext
from tpubuild.stages.tpu import run
from tpubuild.tpu.runtime_rules import check_tpu_runtime_rules
from tpubuild.tpu.twin import make_cpu_twin

# The twin runs the same float32 kernels as the source, but TensorFlow's kernels are not
# bit-reproducible across CPUs and graph layouts (issue 13): compare within float32 rounding.
TOL = {"rtol": 1e-6, "atol": 1e-6}

SHARDING = {
    "num_cores_per_replica": 1,
    "device_assignment": [],
    "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]},
}


def place(src: Path, out: Path, entries: list[dict], sharding: dict | None = None):
    out.mkdir()
    options = {"tags": ["serve"], "tpu_functions": entries, "xla_sharding_options": sharding}
    context = StageContext(workspace=src.parent)
    return run(src, out, options, context)


def ops(model: SavedModel, fn: str) -> list[str]:
    return [node.op for node in model.functions[fn].node_def]


def assert_twin_matches(src: Path, placed: Path, tmp_path: Path, inputs: tf.Tensor) -> None:
    twin = tmp_path / "twin"
    make_cpu_twin(placed, twin)
    for key in SIGNATURES:
        expected, got = run_signature(src, key, inputs), run_signature(twin, key, inputs)
        assert expected.keys() == got.keys()
        for name in expected:
            # The twin runs the TPU function's body through other call ops: the same float32
            # math, but TF's kernels are not bit-reproducible across CPUs and code paths.
            assert_close(got[name], expected[name], FLOAT32_REORDERED, f"{key}.{name}")


def assert_tpu_function(model: SavedModel, fn: str, cluster: str) -> None:
    body = model.functions[fn]
    (meta,) = [n for n in body.node_def if n.op == "TPUReplicateMetadata"]
    assert meta.attr["num_replicas"].i == 1
    tagged = [n for n in body.node_def if "_tpu_replicate" in n.attr]
    assert {n.attr["_tpu_replicate"].s.decode() for n in tagged} == {cluster}
    # Only each output's host side is untagged: TPUReplicatedOutput -> Identity -> return.
    host = [n for n in body.node_def if "_tpu_replicate" not in n.attr]
    assert sorted(n.op for n in host) == sorted(["TPUReplicatedOutput", "Identity"] * len(body.signature.output_arg))
    nodes = {n.name: n for n in body.node_def}
    for ref in body.ret.values():
        shard = nodes[ref.split(":")[0]]
        replicated = nodes[shard.input[0].split(":")[0]]
        inner = nodes[replicated.input[0].split(":")[0]]
        assert (shard.op, replicated.op, replicated.attr["num_replicas"].i) == ("Identity", "TPUReplicatedOutput", 1)
        assert inner.attr["_tpu_output_identity"].b and inner.attr["_tpu_replicate"].s.decode() == cluster


@pytest.fixture(scope="module")
def placed_one(zoo, tmp_path_factory):
    out = tmp_path_factory.mktemp("placed") / "one"
    result = place(zoo, out, [{"function_alias": "tpu_func"}], SHARDING)
    return out, result


def test_call_sites_go_through_tpu_partitioned_call(zoo, placed_one):
    out, result = placed_one
    model = SavedModel.load(out)
    tpu_func = {a: n for n, a in model.aliases.items()}["tpu_func"]
    callers = sorted(model.callers(tpu_func))
    # serving_default, serve_again and serve_two call it: one TPU function, several signatures.
    assert len(callers) == 3
    for caller, node in model.call_sites(tpu_func):
        assert node.op == "TPUPartitionedCall"
        ordinal = node.input[-1]
        selector = next(n for n in model.functions[caller].node_def if n.name == ordinal.split(":")[0])
        assert selector.op == "TPUOrdinalSelector"
        assert ordinal == f"{selector.name}:device_ordinals:0"
    assert_tpu_function(model, tpu_func, "cluster_tpu_func")
    summary = result.summary["placed"]
    assert [(p["function"], p["alias"]) for p in summary] == [(tpu_func, "tpu_func")]
    assert sorted(s["caller"] for s in summary[0]["call_sites"]) == callers
    # The recipe's topology is checked against the serving host, never read for its mesh.
    # (Unbatched calls with a dynamic dimension 0 also get the recompilation warning,
    # tested in tests/convert/test_batch_runtime.py.)
    assert [w for w in result.warnings if not w.startswith("TPU call of")] == [
        "xla_sharding_options.topology: the TPU runtime ignores mesh_shape [1, 1, 1, 2] and checks "
        "the 2 device coordinates against the serving host's TPU system (1 task with 2 TPU devices); "
        "on another host every TPU call fails"
    ]


def test_metadata_carries_sharding_and_topology(placed_one):
    model = SavedModel.load(placed_one[0])
    tpu_func = {a: n for n, a in model.aliases.items()}["tpu_func"]
    (meta,) = [n for n in model.functions[tpu_func].node_def if n.op == "TPUReplicateMetadata"]
    # 1 is TPUReplicateMetadata's default: every write strips default-valued attributes, as
    # TensorFlow's saver does, and loaders add them back from the op registry.
    assert "num_cores_per_replica" not in meta.attr
    topology = TopologyProto.FromString(meta.attr["topology"].s)
    assert list(topology.mesh_shape) == [1, 1, 1, 2]
    assert list(topology.device_coordinates) == [0, 0, 0, 0, 0, 0, 0, 1]
    assert (topology.num_tasks, topology.num_tpu_devices_per_task) == (1, 2)


def test_placed_model_loads_and_keeps_signatures_variables_aliases(zoo, placed_one):
    out = placed_one[0]
    loaded = tf.saved_model.load(str(out))
    assert set(loaded.signatures) == set(SIGNATURES)
    source = tf.saved_model.load(str(zoo))
    for variable in ("w", "v"):
        # Stored data, not a computation: restored variables are bit-equal copies.
        np.testing.assert_array_equal(getattr(loaded, variable).numpy(), getattr(source, variable).numpy())
    assert sorted(SavedModel.load(out).aliases.values()) == sorted(ALIASES)
    # No TPU here: the TPU ops have no CPU kernel. That is what the CPU twin is for.
    with pytest.raises(tf.errors.InvalidArgumentError, match="TPUOrdinalSelector"):
        loaded.signatures["serving_default"](x=tf.zeros([1, 4]))


def test_twin_of_single_placement_matches_source(zoo, placed_one, tmp_path, inputs):
    assert_twin_matches(zoo, placed_one[0], tmp_path, inputs)
    twin = SavedModel.load(tmp_path / "twin")
    for fn in twin.functions.values():
        assert not {"TPUPartitionedCall", "TPUOrdinalSelector", "TPUReplicateMetadata"} & set(ops(twin, fn.signature.name))
        assert not any("_tpu_replicate" in n.attr for n in fn.node_def)


def test_two_tpu_functions(zoo, tmp_path, inputs):
    out = tmp_path / "two"
    result = place(zoo, out, [{"function_alias": "tpu_func"}, {"function_alias": "tpu_b"}])
    model = SavedModel.load(out)
    names = {a: n for n, a in model.aliases.items()}
    serve_two = model.callees(model.signatures["serve_two"]).pop()
    assert ops(model, serve_two).count("TPUPartitionedCall") == 2
    assert_tpu_function(model, names["tpu_func"], "cluster_tpu_func")
    assert_tpu_function(model, names["tpu_b"], "cluster_tpu_b")
    assert [p["alias"] for p in result.summary["placed"]] == ["tpu_func", "tpu_b"]
    assert_twin_matches(zoo, out, tmp_path, inputs)


def test_tpu_function_calling_another_directly(zoo, tmp_path, inputs):
    out = tmp_path / "direct"
    place(zoo, out, [{"function_alias": "outer_direct"}, {"function_alias": "inner"}])
    model = SavedModel.load(out)
    names = {a: n for n, a in model.aliases.items()}
    # Inside the TPU function outer_direct, inner is already on the TPU: it is called directly,
    # through an untagged copy of its body (a TPUPartitionedCall has no XLA kernel, and
    # inner's own cluster would be a second one in outer_direct's computation).
    body = model.functions[names["outer_direct"]]
    assert "TPUPartitionedCall" not in ops(model, names["outer_direct"])
    (call,) = [n for n in body.node_def if n.attr["f"].func.name.startswith(names["inner"])]
    assert call.attr["f"].func.name == f"{names['inner']}_in_tpu"
    assert call.attr["_tpu_replicate"].s == b"cluster_outer_direct"
    assert not any("_tpu_replicate" in n.attr for n in model.functions[f"{names['inner']}_in_tpu"].node_def)
    assert check_tpu_runtime_rules(model) == []
    # middle (CPU) also calls inner: that call site goes through the TPU as well.
    assert "TPUPartitionedCall" in ops(model, names["middle"])
    assert_twin_matches(zoo, out, tmp_path, inputs)


def test_control_flow_inside_tpu_function(zoo, tmp_path, inputs):
    out = tmp_path / "cf"
    place(zoo, out, [{"function_alias": "control_flow"}])
    model = SavedModel.load(out)
    control_flow = {a: n for n, a in model.aliases.items()}["control_flow"]
    assert_tpu_function(model, control_flow, "cluster_control_flow")
    body_ops = set(ops(model, control_flow))
    assert body_ops & {"If", "StatelessIf"} and body_ops & {"While", "StatelessWhile"}
    tf.saved_model.load(str(out))
    assert_twin_matches(zoo, out, tmp_path, inputs)


def test_signature_placed_on_tpu_becomes_a_thin_wrapper(zoo, tmp_path, inputs):
    out = tmp_path / "sig"
    result = place(zoo, out, [{"signature_name": "serve_chains"}])
    model = SavedModel.load(out)
    wrapper = model.signatures["serve_chains"]
    assert sorted(ops(model, wrapper)) == ["TPUOrdinalSelector", "TPUPartitionedCall"]
    (placement,) = result.summary["placed"]
    assert placement["wrapper"] == wrapper
    assert placement["function"] == f"{wrapper}_tpu"
    assert_tpu_function(model, placement["function"], f"cluster_{wrapper}")
    # The graph-level node TF Serving runs still calls the signature's function by name.
    assert len(model.graph_call_sites(wrapper)) == 1
    assert set(tf.saved_model.load(str(out)).signatures) == set(SIGNATURES)
    assert_twin_matches(zoo, out, tmp_path, inputs)


def test_a_signature_traced_with_jit_compile_false_is_placed(tmp_path):
    """tf.function(jit_compile=False) (orbax's serving function) marks the signature's call
    `_XlaMustCompile = false`; inside the TPU cluster TF's MLIR bridge refuses that beside
    the cluster's tag, so placement drops it: the whole body is compiled anyway."""

    class NotJit(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")], jit_compile=False)
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}

    src = tmp_path / "src"
    model = NotJit()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.serve})
    wrapper = SavedModel.load(src).signatures["serving_default"]
    assert [n.attr["_XlaMustCompile"].b for n in SavedModel.load(src).functions[wrapper].node_def
            if "_XlaMustCompile" in n.attr] == [False]
    out = tmp_path / "placed"
    result = place(src, out, [{"signature_name": "serving_default"}])  # the MLIR bridge's check included
    (placement,) = result.summary["placed"]
    body = SavedModel.load(out).functions[placement["function"]]
    assert not [n.name for n in body.node_def if "_XlaMustCompile" in n.attr and not n.attr["_XlaMustCompile"].b]
    x = tf.constant([[1.0, 2.0]])
    twin = tmp_path / "twin"
    make_cpu_twin(out, twin)
    assert_close(run_signature(twin, "serving_default", x)["y"], run_signature(src, "serving_default", x)["y"],
                 FLOAT32_REORDERED)


def test_jit_compile_functions_placement(jit, tmp_path, inputs):
    out = tmp_path / "jit"
    result = place(jit, out, [{"jit_compile_functions": True}])
    (placement,) = result.summary["placed"]
    assert placement["function"].startswith("__inference_jit_outer_")
    assert placement["named_by"] == "jit_compile_functions"
    twin = tmp_path / "twin"
    make_cpu_twin(out, twin)
    # jit_compile functions run through XLA, which fuses and reorders float ops: the twin's
    # call path may not compile them the same way, so close, not bit-equal.
    assert_close(
        run_signature(twin, "serving_default", inputs)["y"], run_signature(jit, "serving_default", inputs)["y"],
        FLOAT32_REORDERED,
    )


def test_sharding_options_reach_the_metadata(zoo, tmp_path):
    out = tmp_path / "sharded"
    sharding = {**SHARDING, "num_cores_per_replica": 2, "device_assignment": [0, 0, 0, 0, 0, 0, 0, 1]}
    place(zoo, out, [{"function_alias": "tpu_b"}], sharding)
    model = SavedModel.load(out)
    tpu_b = {a: n for n, a in model.aliases.items()}["tpu_b"]
    (meta,) = [n for n in model.functions[tpu_b].node_def if n.op == "TPUReplicateMetadata"]
    assert meta.attr["num_cores_per_replica"].i == 2
    assert list(meta.attr["device_assignment"].list.i) == [0, 0, 0, 0, 0, 0, 0, 1]


def test_topology_that_does_not_divide_is_refused(zoo, tmp_path):
    sharding = {**SHARDING, "topology": {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 1]}}
    with pytest.raises(ConversionError) as err:
        place(zoo, tmp_path / "bad", [{"function_alias": "tpu_b"}], sharding)
    assert str(err.value) == (
        "xla_sharding_options.topology: 7 device_coordinates do not divide into coordinates of "
        "4 dimensions (mesh_shape [1, 1, 1, 2])"
    )
    assert list((tmp_path / "bad").iterdir()) == []


def test_twin_maps_replicated_inputs_of_models_converted_elsewhere(zoo, placed_one, tmp_path, inputs):
    # tpu.rewrite's inputs go through TPUReplicatedInput(N=1); tpubuild does not write them,
    # but a model converted elsewhere has them and its twin must still run.
    model = SavedModel.load(placed_one[0])
    tpu_func = {a: n for n, a in model.aliases.items()}["tpu_func"]
    body = model.functions[tpu_func]
    arg = body.signature.input_arg[0].name
    replicated = body.node_def.add(name="input0", op="TPUReplicatedInput", input=[arg])
    replicated.attr["N"].i = 1
    replicated.attr["T"].type = tf.float32.as_datatype_enum
    for node in body.node_def:
        if node.name != "input0":
            node.input[:] = ["input0:output:0" if ref == arg else ref for ref in node.input]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model.save(elsewhere)
    twin = tmp_path / "twin"
    make_cpu_twin(elsewhere, twin)
    body = SavedModel.load(twin).functions[tpu_func]
    assert [n.op for n in body.node_def if n.name == "input0"] == ["Identity"]
    assert not {"TPUReplicatedInput", "TPUReplicatedOutput"} & set(ops(SavedModel.load(twin), tpu_func))
    for key in SIGNATURES:
        expected, got = run_signature(zoo, key, inputs), run_signature(twin, key, inputs)
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], **TOL, err_msg=f"{key}.{name}")


def test_a_model_already_placed_on_the_tpu_is_refused_in_one_line(placed_one, tmp_path):
    # A converted version given as the model: placing it again would fail in TensorFlow's
    # words (no CPU kernel for its TPU ops); the stage names what it is and writes nothing.
    with pytest.raises(ConversionError) as err:
        place(placed_one[0], tmp_path / "again", [{"function_alias": "tpu_func"}])
    message = str(err.value)
    assert message.startswith("the model is already converted for the TPU: function \"")
    assert "TPUPartitionedCall node" in message or "TPUReplicateMetadata node" in message, message
    assert "Point `saved_model:` at the SavedModel it was converted from" in message and "\n" not in message
    assert list((tmp_path / "again").iterdir()) == []
