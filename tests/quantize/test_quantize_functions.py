"""Quantization that keeps TPU functions named by alias or concrete name (then placed on the TPU).

Each test runs the real quantize stage and the real tpu stage on a tiny exported model,
then looks at the TPU function's body and runs the real verify stage (CPU twin vs source).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

from tests.stage_helpers import Runner
from tpubuild.errors import ConversionError
from tpubuild.quantize.datasets import write_tfrecord
from tpubuild.savedmodel.model import SavedModel

TAGS = ["serve"]
FEATURES, HIDDEN, CLASSES = 64, 128, 10
WEIGHT_ELEMENTS = FEATURES * HIDDEN + HIDDEN * CLASSES  # both >= 1024: every method quantizes them


class TwoCallSites(tf.Module):
    """`tpu_func` (two dense layers) called twice by the signature, on differently scaled inputs."""

    def __init__(self) -> None:
        rng = np.random.default_rng(7)
        self.w1 = tf.Variable(rng.standard_normal((FEATURES, HIDDEN)).astype(np.float32) * 0.1)
        self.b1 = tf.Variable(np.zeros(HIDDEN, np.float32))
        self.w2 = tf.Variable(rng.standard_normal((HIDDEN, CLASSES)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def tpu_func(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x):
        return {"logits": self.tpu_func(x * 0.5 + 0.25) + self.tpu_func(x * 0.25)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model with the alias `tpu_func`, and the same model without any alias."""
    root = tmp_path_factory.mktemp("quantize_functions")
    module = TwoCallSites()
    aliased, plain = root / "aliased", root / "plain"
    tf.saved_model.save(
        module, str(aliased), signatures={"serving_default": module.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"tpu_func": module.tpu_func}),
    )
    tf.saved_model.save(module, str(plain), signatures={"serving_default": module.serve})
    return {"aliased": aliased, "plain": plain}


def samples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, FEATURES)).astype(np.float32)} for _ in range(count)]


def concrete_name(path: Path) -> str:
    [name] = [n for n in SavedModel.load(path, TAGS).functions if re.fullmatch(r"__inference_tpu_func_\d+", n)]
    return name


def quantize_options(method: str, entry: dict[str, str], datasets: dict | None = None) -> dict[str, Any]:
    return {
        "tags": TAGS, "method": method, "signature_keys": ["serving_default"], "op_set": "XLA",
        "representative_datasets": datasets or {}, "tpu_functions": [entry],
    }


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, exported: dict[str, Path]) -> Callable[..., dict[str, Any]]:
    """quantize then tpu (the real stages) for (model, method, tpu_functions entry), once each."""
    done: dict[tuple, dict[str, Any]] = {}

    def run(model: str, method: str, entry: dict[str, str]) -> dict[str, Any]:
        key = (model, method, tuple(entry.items()))
        if key not in done:
            root = tmp_path_factory.mktemp("build")
            (root / "ws").mkdir()
            runner = Runner(root / "ws", root / "out")
            runner.inputs["source"] = exported[model]
            datasets = {}
            if method == "STATIC_RANGE":
                write_tfrecord(root / "ws" / "calib.tfrecord", "serving_default", samples(64))
                datasets = {"serving_default": {"tfrecord_file_path": "calib.tfrecord"}}
            quantized, result = runner.run("quantize", exported[model], quantize_options(method, entry, datasets))
            placed, placement = runner.run(
                "tpu", quantized, {"tags": TAGS, "tpu_functions": [entry], "xla_sharding_options": None}
            )
            done[key] = {"runner": runner, "quantized": quantized, "placed": placed,
                         "quantize": result, "tpu": placement}
        return done[key]

    return run


def elements(node: Any) -> int:
    return int(np.prod([d.size for d in node.attr["value"].tensor.tensor_shape.dim]))


def assert_int8_tpu_function(placed: Path, name: str) -> None:
    """The function kept its name, reads no variables, holds int8 weights, and is called on the TPU."""
    model = SavedModel.load(placed, TAGS)
    body = model.functions[name]
    assert [arg.type for arg in body.signature.input_arg] == [tf.float32.as_datatype_enum]
    assert not [n.op for n in body.node_def if n.op in ("ReadVariableOp", "VarHandleOp", "ResourceGather")]
    weights = [n for n in body.node_def if n.op == "Const" and elements(n) >= 1024]
    assert sorted(tf.as_dtype(n.attr["dtype"].type).name for n in weights) == ["int8", "int8"]
    assert sum(elements(n) for n in weights) == WEIGHT_ELEMENTS
    assert "TPUReplicateMetadata" in [n.op for n in body.node_def]
    sites = model.call_sites(name)
    assert len(sites) == 2  # both call sites of the signature
    assert {node.op for _, node in sites} == {"TPUPartitionedCall"}
    assert {node.attr["f"].func.name for _, node in sites} == {name}


def verify(built: dict[str, Any]) -> dict[str, Any]:
    """The real verify stage on the placed artifact (it runs the CPU twin) with the int8 defaults."""
    options = {
        "tags": TAGS, "applied": ["quantize", "tpu"], "representative_datasets": {},
        "samples": 8, "seed": 0, "rtol": None, "atol": None,
    }
    _, result = built["runner"].run("verify", built["placed"], options)
    return result.summary


@pytest.mark.parametrize("method", ["DYNAMIC_RANGE", "WEIGHT_ONLY", "STATIC_RANGE"])
def test_alias_keeps_an_int8_tpu_function(build: Callable[..., dict[str, Any]], method: str) -> None:
    built = build("aliased", method, {"function_alias": "tpu_func"})
    model = SavedModel.load(built["placed"], TAGS)
    [name] = [n for n, alias in model.aliases.items() if alias == "tpu_func"]  # the alias still resolves
    assert_int8_tpu_function(built["placed"], name)
    [placed] = built["tpu"].summary["placed"]
    assert (placed["function"], placed["alias"]) == (name, "tpu_func")
    # WEIGHT_ONLY prints no quantization summary (docs/quality.md).
    layers = {} if method == "WEIGHT_ONLY" else {"MatMul": {"quantized": 2, "total": 2}}
    assert built["quantize"].summary["layers"] == layers
    assert list(built["quantize"].summary["functions"]) == ["tpu_func"]
    summary = verify(built)
    assert summary["passed"] is True
    assert summary["tolerance"]["kind"] == "int8"
    # int8 weights move the outputs a little, but within the int8 tolerance (docs/quality.md).
    assert 0 < summary["max_rel_error"] < summary["tolerance"]["rtol"]


def test_concrete_name_with_static_range(build: Callable[..., dict[str, Any]], exported: dict[str, Path]) -> None:
    name = concrete_name(exported["plain"])
    built = build("plain", "STATIC_RANGE", {"concrete_function_name": name})
    assert_int8_tpu_function(built["placed"], name)
    # 64 samples reach two call sites each: 128 calibration samples for the function.
    assert built["quantize"].summary["functions"][name]["calibration_samples"] == 128
    assert built["quantize"].summary["samples"] == {"serving_default": 64}
    assert verify(built)["passed"] is True


def test_calibration_samples_are_the_inputs_at_the_call_sites(exported: dict[str, Path]) -> None:
    from tpubuild.quantize.functions import call_chains, call_site_samples

    model = SavedModel.load(exported["aliased"], TAGS)
    [name] = model.aliases
    chains = call_chains(model, name, ["serving_default"])
    # graph node -> signature wrapper -> serve, whose body calls tpu_func twice.
    assert [len(chain.links) for chain in chains] == [3, 3]
    assert len({chain.links[-1].holder for chain in chains}) == 1
    assert {chain.links[-1].node.attr["f"].func.name for chain in chains} == {name}
    given = samples(3)
    got = call_site_samples(exported["aliased"], TAGS, model, name, chains, {"serving_default": given}, ["x"])
    want = [s["x"] * 0.5 + 0.25 for s in given] + [s["x"] * 0.25 for s in given]
    assert len(got) == 6
    # The capture runs TF's Mul/AddV2 kernels: equal to numpy up to float32 rounding.
    np.testing.assert_allclose(
        sorted((g["x"] for g in got), key=lambda a: float(a.sum())),
        sorted(want, key=lambda a: float(a.sum())), rtol=1e-6, atol=1e-6,
    )


def test_unknown_alias_is_one_line_naming_the_recipe(tmp_path: Path, exported: dict[str, Path]) -> None:
    runner = Runner(tmp_path, tmp_path / "out")
    with pytest.raises(ConversionError) as err:
        runner.run("quantize", exported["aliased"], quantize_options("DYNAMIC_RANGE", {"function_alias": "tpu_fnc"}))
    assert str(err.value) == (
        'quantization (DYNAMIC_RANGE): tpu_functions[0]: unknown function alias "tpu_fnc" '
        '(did you mean "tpu_func"?); aliases: "tpu_func"'
    )


class Nested(tf.Module):
    """Two aliased functions, `outer` calling `inner` directly (the converter allows that)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.w1 = tf.Variable(rng.standard_normal((FEATURES, FEATURES)).astype(np.float32) * 0.1)
        self.w2 = tf.Variable(rng.standard_normal((FEATURES, 32)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def inner(self, x):
        return tf.nn.relu(tf.matmul(x, self.w1))

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32)])
    def outer(self, x):
        return tf.matmul(self.inner(x), self.w2)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def serve(self, x):
        return {"y": self.outer(x)}


def test_a_kept_function_calling_another_absorbs_it_with_a_warning(tmp_path: Path) -> None:
    module = Nested()
    tf.saved_model.save(
        module, str(tmp_path / "src"), signatures={"serving_default": module.serve},
        options=tf.saved_model.SaveOptions(function_aliases={"inner": module.inner, "outer": module.outer}),
    )
    runner = Runner(tmp_path, tmp_path / "out")
    runner.inputs["source"] = tmp_path / "src"
    entries = [{"function_alias": "outer"}, {"function_alias": "inner"}]
    out, result = runner.run(
        "quantize", tmp_path / "src", {**quantize_options("DYNAMIC_RANGE", entries[0]), "tpu_functions": entries}
    )
    assert result.warnings == [
        "quantization (DYNAMIC_RANGE): tpu function outer calls tpu function inner; quantized, outer "
        "holds inner's int8 body inline and no longer calls it"
    ]
    model = SavedModel.load(out, TAGS)
    by_alias = {alias: name for name, alias in model.aliases.items()}
    outer = model.functions[by_alias["outer"]]
    int8 = [n for n in outer.node_def if n.op == "Const" and n.attr["dtype"].type == tf.int8.as_datatype_enum]
    assert sorted(elements(n) for n in int8) == [FEATURES * 32, FEATURES * FEATURES]
    assert by_alias["inner"] not in model.callees(by_alias["outer"])
    assert result.summary["layers"] == {"MatMul": {"quantized": 3, "total": 3}}  # inner counted twice
