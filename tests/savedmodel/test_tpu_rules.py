"""The TPU runtime's rules (tpu/runtime_rules.py) and TF's MLIR clustering bridge on TPU bodies:
every placement tpubuild makes passes both; models that break a rule fail with exact messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from sm_models import F

from tpubuild.cli import cli
from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages.base import StageContext
from tpubuild.stages.tpu import run
from tpubuild.tpu.findings import tpu_bodies
from tpubuild.tpu.functions import resolve_tpu_functions
from tpubuild.tpu.inspect import inspect, to_text
from tpubuild.tpu.mlir_bridge import bridge_findings
from tpubuild.tpu.placement import place_on_tpu
from tpubuild.tpu.runtime_check import enforce
from tpubuild.tpu.runtime_rules import check_tpu_runtime_rules

VEC = tf.TensorSpec([None, F], tf.float32)
# Placements of the zoo the pre-checks accept (string / float64 / sparse inputs and dynamic
# shapes do not).
PLACEMENTS = {
    "tpu_func": [{"function_alias": "tpu_func"}],
    "two": [{"function_alias": "tpu_func"}, {"function_alias": "tpu_b"}],
    "nested": [{"function_alias": "outer_direct"}, {"function_alias": "inner"}],
    "indirect": [{"function_alias": "outer_indirect"}, {"function_alias": "tpu_b"}],
    "control_flow": [{"function_alias": "control_flow"}],
    "signature": [{"signature_name": "serve_chains"}],
}


class Fft(tf.Module):
    """A TPU function whose FFT computes in complex128, inside the function only."""

    @tf.function(input_signature=[VEC])
    def tpu_func(self, x):
        return tf.cast(tf.math.real(tf.signal.fft(tf.cast(x, tf.complex128))), tf.float32)

    @tf.function(input_signature=[VEC])
    def serve(self, x):
        return {"y": self.tpu_func(x)}


class Table(tf.Module):
    """A TPU function that reads a hash table: its resource argument is not a variable."""

    def __init__(self) -> None:
        super().__init__()
        init = tf.lookup.KeyValueTensorInitializer(tf.constant([0, 1], tf.int64), tf.constant([10.0, 20.0]))
        self.table = tf.lookup.StaticHashTable(init, default_value=0.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def tpu_func(self, k):
        return self.table.lookup(k)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(self, k):
        return {"y": self.tpu_func(k)}


def save(module: tf.Module, path: Path) -> Path:
    options = tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func})
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve}, options=options)
    return path


def place(src: Path, out: Path, entries: list[dict], sharding: dict | None = None):
    out.mkdir()
    options = {"tags": ["serve"], "tpu_functions": entries, "xla_sharding_options": sharding}
    context = StageContext(workspace=src.parent)
    return run(src, out, options, context)


@pytest.fixture(scope="module")
def placed(zoo, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rules") / "placed"
    place(zoo, out, PLACEMENTS["tpu_func"])
    return out


def body_of(model: SavedModel) -> str:
    (body,) = tpu_bodies(model)
    return body


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_every_placement_passes_the_rules_and_the_mlir_bridge(zoo, tmp_path, name):
    out = tmp_path / name
    place(zoo, out, PLACEMENTS[name])
    model = SavedModel.load(out)
    assert tpu_bodies(model)
    assert check_tpu_runtime_rules(out, ["serve"]) == []
    assert bridge_findings(model) == []


def test_jit_compile_placement_passes_the_rules_and_the_mlir_bridge(jit, tmp_path):
    place(jit, tmp_path / "jit", [{"jit_compile_functions": True}])
    model = SavedModel.load(tmp_path / "jit")
    assert check_tpu_runtime_rules(model) == [] and bridge_findings(model) == []


def test_untagged_consumer_is_an_undeclared_output(placed):
    model = SavedModel.load(placed)
    body = model.functions[body_of(model)]
    (relu,) = [n for n in body.node_def if n.op == "Relu"]
    spy = body.node_def.add(name="spy", op="Identity", input=[f"{relu.name}:activations:0"])
    spy.attr["T"].type = tf.float32.as_datatype_enum
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [
        f"tpu function {body.signature.name}, node {relu.name}: feeds node spy (Identity), which is not "
        'in the cluster: "Undeclared output of TPU computation" on a TPU host'
    ]


def test_return_value_straight_from_the_cluster_is_an_undeclared_output(placed):
    model = SavedModel.load(placed)
    body = model.functions[body_of(model)]
    (key,) = body.ret
    (relu,) = [n for n in body.node_def if n.op == "Relu"]
    body.ret[key] = f"{relu.name}:activations:0"  # what every body tpubuild wrote used to do
    message = (
        f"tpu function {body.signature.name}, node {relu.name}: feeds return value {key} without "
        'TPUReplicatedOutput: "Undeclared output of TPU computation" on a TPU host'
    )
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [message]
    with pytest.raises(ConversionError) as err:
        enforce(model)
    assert str(err.value) == message


def test_two_clusters_fail_the_rules_and_the_mlir_bridge(placed):
    model = SavedModel.load(placed)
    body = model.functions[body_of(model)]
    (relu,) = [n for n in body.node_def if n.op == "Relu"]
    relu.attr["_tpu_replicate"].s = b"cluster_other"
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [
        f"tpu function {body.signature.name}, node {relu.name}: 2 _tpu_replicate clusters "
        "(cluster_tpu_func, cluster_other); TPUPartitionedCall allows one (GetClusterName)"
    ]
    (finding,) = bridge_findings(model)
    assert finding.rule == "mlir-bridge"
    assert "TF2XLA TPU bridge input check: mismatch clusters tpu_replicate attr" in finding.message


def test_missing_and_extra_metadata(placed):
    model = SavedModel.load(placed)
    body = model.functions[body_of(model)]
    (meta,) = [n for n in body.node_def if n.op == "TPUReplicateMetadata"]
    extra = body.node_def.add()
    extra.CopyFrom(meta)
    extra.name = "second_metadata"
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [
        f"tpu function {body.signature.name}, node second_metadata: 2 TPUReplicateMetadata nodes "
        f"({meta.name}, second_metadata); one is needed"
    ]
    kept = [n for n in body.node_def if n.op != "TPUReplicateMetadata"]
    del body.node_def[:]
    body.node_def.extend(kept)
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [
        f'tpu function {body.signature.name}: no TPUReplicateMetadata node; the TPU runtime refuses the '
        'function ("Missing TPUReplicateMetadata node")'
    ]


def test_complex128_fft_inside_a_tpu_function_fails_the_stage(tmp_path):
    src = save(Fft(), tmp_path / "fft")
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as err:
        place(src, out, [{"function_alias": "tpu_func"}])
    body = {a: n for n, a in SavedModel.load(src).aliases.items()}["tpu_func"]
    # Every finding of the function at once; float64 is only a warning.
    assert str(err.value) == (
        "3 TPU runtime rule violations: "
        f"tpu function {body}, node Cast: op Cast computes in complex128 (DstT), which TPUs do not support; "
        f"tpu function {body}, node FFT: op FFT computes in complex128 (Tcomplex), which TPUs do not support; "
        f"tpu function {body}, node Real: op Real computes in complex128 (T), which TPUs do not support"
    )
    assert list(out.iterdir()) == []


def test_float64_inside_a_tpu_function_is_a_warning(tmp_path):
    class F64(tf.Module):
        @tf.function(input_signature=[VEC])
        def tpu_func(self, x):
            return tf.cast(tf.cast(x, tf.float64) * 2.0, tf.float32)

        @tf.function(input_signature=[VEC])
        def serve(self, x):
            return {"y": self.tpu_func(x)}

    src = save(F64(), tmp_path / "f64")
    result = place(src, tmp_path / "out", [{"function_alias": "tpu_func"}])
    body = {a: n for n, a in SavedModel.load(src).aliases.items()}["tpu_func"]
    assert f"tpu function {body}, node mul: op Mul computes in float64 (T); TPUs emulate it partially and slowly" in result.warnings


def test_non_variable_resource_argument(tmp_path):
    src = save(Table(), tmp_path / "table")
    model = SavedModel.load(src)
    # Placed by hand: the stage's pre-check already refuses the lookup op (no XLA kernel).
    place_on_tpu(model, resolve_tpu_functions(model, [{"function_alias": "tpu_func"}]))
    body = model.functions[body_of(model)]
    (handle,) = [a.name for a in body.signature.input_arg if a.type == tf.resource.as_datatype_enum]
    (lookup,) = [n.name for n in body.node_def if n.op == "LookupTableFindV2"]
    assert [str(f) for f in check_tpu_runtime_rules(model)] == [
        f"tpu function {body.signature.name}, node {lookup}: op LookupTableFindV2 has no XLA kernel; it "
        "cannot run on the TPU",
        f"tpu function {body.signature.name}: resource argument {handle} is a resource object (e.g. a lookup "
        "table), not a variable; the TPU runtime copies only variables to the TPU (LookupResource<Var>)",
    ]


def test_stage_names_every_op_without_an_xla_kernel_at_once(zoo, tmp_path):
    with pytest.raises(ConversionError) as err:
        place(zoo, tmp_path / "out", [{"function_alias": "string_op"}, {"function_alias": "tpu_func"}])
    assert "op 'StringToNumber' (node StringToNumber) has no XLA kernel" in str(err.value)


# -- sharding as the runtime reads it ------------------------------------------------------------

TOPOLOGY = {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]}


def metadata(out: Path):
    model = SavedModel.load(out)
    (meta,) = [n for n in model.functions[body_of(model)].node_def if n.op == "TPUReplicateMetadata"]
    return meta


def test_two_cores_per_replica_use_spmd_and_warn_about_what_the_runtime_ignores(zoo, tmp_path):
    sharding = {"num_cores_per_replica": 2, "device_assignment": [0, 0, 0, 0, 0, 0, 0, 1], "topology": TOPOLOGY}
    result = place(zoo, tmp_path / "out", [{"function_alias": "tpu_b"}], sharding)
    meta = metadata(tmp_path / "out")
    assert meta.attr["use_spmd_for_xla_partitioning"].b is True
    # (Unbatched calls with a dynamic dimension 0 also get the recompilation warning,
    # tested in tests/convert/test_batch_runtime.py.)
    assert [w for w in result.warnings if not w.startswith("TPU call of")] == [
        "xla_sharding_options.topology: the TPU runtime ignores mesh_shape [1, 1, 1, 2] and checks the 2 "
        "device coordinates against the serving host's TPU system (1 task with 2 TPU devices); on another "
        "host every TPU call fails",
        "xla_sharding_options.device_assignment: used as written for every call; the TPU runtime's ordinal "
        "selector cannot spread calls over other cores",
    ]


def test_one_core_per_replica_does_not_use_spmd(placed):
    assert metadata(placed).attr["use_spmd_for_xla_partitioning"].b is False


@pytest.mark.parametrize(
    ("cores", "assignment", "topology", "message"),
    [
        (1, [0, 0, 0, 0], None, "a device_assignment needs a topology (xla_sharding_options.topology); the "
         "TPU runtime refuses it without one"),
        (2, [0, 0, 0, 0], TOPOLOGY, "4 values, but num_replicas (1) * num_cores_per_replica (2) * 4 = 8 are "
         "needed ([x, y, z, core] per core)"),
        (2, [0, 0, 0, 0, 0, 0, 0, 2], TOPOLOGY, "core 1 at [0, 0, 0, 2] is not a device of the topology"),
        (2, [0, 0, 0, 1, 0, 0, 0, 1], TOPOLOGY, "core 1 at [0, 0, 0, 1] is assigned twice"),
        (2, [0, 0, 0, -1, 0, 0, 0, 1], TOPOLOGY, "core 0 at [0, 0, 0, -1] has a negative coordinate"),
        (2, [0, 0, 0, 1, 0, 0, 0, 0], TOPOLOGY, "[0, 0, 0, 1, 0, 0, 0, 0] names cores other than the "
         "topology's first 2 ([0, 0, 0, 0, 0, 0, 0, 1]); TPUPartitionedCall copies the variables to the "
         "cores at the ordinal it picks, so a hand-set assignment would run the program on other cores at "
         "every ordinal but 0: leave device_assignment empty or write the first cores"),
        (2, [], {"mesh_shape": [1, 1, 1, 3], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2]},
         "empty with num_cores_per_replica 2 and a topology of 3 cores; TPUPartitionedCall assigns devices "
         "itself only for topologies of 2, 4 or 8 cores: write the assignment"),
    ],
)
def test_device_assignment_the_runtime_rejects_is_refused(zoo, tmp_path, cores, assignment, topology, message):
    sharding = {"num_cores_per_replica": cores, "device_assignment": assignment, "topology": topology}
    with pytest.raises(ConversionError) as err:
        place(zoo, tmp_path / "out", [{"function_alias": "tpu_b"}], sharding)
    assert str(err.value) == f"xla_sharding_options.device_assignment: {message}"
    assert list((tmp_path / "out").iterdir()) == []


# -- inspect -------------------------------------------------------------------------------------------


def test_inspect_reports_a_converted_tpu_function_as_placed(placed):
    info = inspect(placed)
    (entry,) = [f for f in info["functions"] if f["tpu"]]
    assert entry["xla"] == {"compilable": True}
    assert entry["tpu"] == {"clusters": ["cluster_tpu_func"], "findings": []}
    text = to_text(info)
    # The TPU plumbing is no reason to call the function not XLA-compilable (issue 13 item 12).
    assert [line for line in text.splitlines() if "TPUReplicateMetadata'" in line] == []
    assert "    placed on the TPU (cluster cluster_tpu_func); TPU runtime rules: OK" in text.splitlines()


def test_inspect_reports_rule_findings_of_a_model_converted_elsewhere(placed, tmp_path):
    model = SavedModel.load(placed)
    body = model.functions[body_of(model)]
    (key,) = body.ret
    (relu,) = [n for n in body.node_def if n.op == "Relu"]
    body.ret[key] = f"{relu.name}:activations:0"
    out = tmp_path / "elsewhere"
    out.mkdir()
    model.save(out)
    result = CliRunner().invoke(cli, ["inspect", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "    placed on the TPU (cluster cluster_tpu_func); 1 TPU runtime rule violation(s)" in lines
    assert (
        f"      error: tpu function {body.signature.name}, node {relu.name}: feeds return value {key} without "
        'TPUReplicatedOutput: "Undeclared output of TPU computation" on a TPU host'
    ) in lines


class Weights(tf.Module):
    """Weights as constants in the TPU body (a frozen graph): 4 x 256 KiB of float32, an
    int64 and a bfloat16 constant above the splat size, and smaller ones below it."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(3)
        self.first = rng.standard_normal((F, 256), dtype=np.float32)  # below the splat size
        self.mats = [rng.standard_normal((256, 256), dtype=np.float32) for _ in range(4)]
        self.ids = rng.integers(0, 7, (128, 128), dtype=np.int64)
        self.half = rng.standard_normal((256, 256)).astype(np.float32)

    @tf.function(input_signature=[VEC])
    def tpu_func(self, x):
        h = tf.matmul(x, tf.constant(self.first))
        for m in self.mats:
            h = tf.tanh(tf.matmul(h, tf.constant(m)))
        h = tf.cast(tf.matmul(tf.cast(h, tf.bfloat16), tf.constant(self.half, tf.bfloat16)), tf.float32)
        extra = tf.cast(tf.reduce_sum(tf.constant(self.ids)), tf.float32) + tf.constant([1.0, 2.0])[0]
        return tf.nn.relu(h) + extra

    @tf.function(input_signature=[VEC])
    def serve(self, x):
        return {"y": self.tpu_func(x)}


def test_the_bridge_checks_large_constants_as_splats_with_the_same_verdict(tmp_path):
    from tpubuild.tpu.splat import SPLAT_MIN_BYTES, splat_large_constants

    out = tmp_path / "placed"
    place(save(Weights(), tmp_path / "weights"), out, PLACEMENTS["tpu_func"])
    model = SavedModel.load(out)
    body = model.functions[body_of(model)]
    big = [n for n in body.node_def if n.op == "Const" and len(n.attr["value"].tensor.tensor_content) > SPLAT_MIN_BYTES]
    assert len(big) == 6, [n.name for n in big]  # 4 float32, int64, bfloat16
    copy = splat_large_constants(body)
    assert copy.signature == body.signature and len(copy.node_def) == len(body.node_def)
    for node in big:
        before = node.attr["value"].tensor
        after = next(n for n in copy.node_def if n.name == node.name).attr["value"].tensor
        assert (after.dtype, after.tensor_shape) == (before.dtype, before.tensor_shape) and not after.tensor_content
        # TF reads one value as the whole shape filled with it (tensor.cc FromProtoField).
        filled = tf.make_ndarray(after)
        assert filled.shape == tf.make_ndarray(before).shape and np.unique(filled.astype(np.float64)).tolist() in ([0.5], [3.0])
    # Everything else is the function's own: every other node, and each splat's other attributes.
    others = [n for n in copy.node_def if n.name not in {b.name for b in big}]
    assert any(n.op == "Const" for n in others) and all(n == next(o for o in body.node_def if o.name == n.name)
                                                         for n in others)
    for node in big:
        after = next(n for n in copy.node_def if n.name == node.name)
        assert (after.op, list(after.input), after.device) == (node.op, list(node.input), node.device)
        assert {k: v for k, v in after.attr.items() if k != "value"} == {k: v for k, v in node.attr.items() if k != "value"}
    for field in ("attr", "arg_attr", "resource_arg_unique_id", "ret", "control_ret"):
        assert dict(getattr(copy, field)) == dict(getattr(body, field)), field
    assert check_tpu_runtime_rules(model) == [] and bridge_findings(model) == []
    # And what the bridge refuses, it still refuses.
    (relu,) = [n for n in body.node_def if n.op == "Relu"]
    relu.attr["_tpu_replicate"].s = b"cluster_other"
    (finding,) = bridge_findings(model)
    assert "TF2XLA TPU bridge input check: mismatch clusters tpu_replicate attr" in finding.message
