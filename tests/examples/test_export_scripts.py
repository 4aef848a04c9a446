"""Every example export script makes the SavedModel its recipe describes: the names in
`converter:` exist, batched functions and signatures obey the batching shape rules,
and the serving signature runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2
from tensorflow.core.protobuf import saved_model_pb2

from tests.cli import REPO

SCENARIOS = {
    # converter-reference.md's scenarios, each shown by at least one example recipe.
    "function alias": lambda c: any("function_alias" in f for f in c["tpu_functions"]),
    "two TPU functions": lambda c: len(c["tpu_functions"]) >= 2,
    "concrete function name": lambda c: any("concrete_function_name" in f for f in c["tpu_functions"]),
    "jit_compile_functions": lambda c: any(f.get("jit_compile_functions") for f in c["tpu_functions"]),
    "signature batching": lambda c: any("signature_name" in b.get("experimental", {}) for b in c["batch_options"]),
    "batch_func batching": lambda c: any(
        b.get("experimental", {}).get("function_alias") == "batch_func" for b in c["batch_options"]
    ),
    "bfloat16 filterlist": lambda c: bool(c["bfloat16_optimization_options"]["filterlist"]),
    "static range quantization": lambda c: c.get("quantization_options", {}).get("method") == "STATIC_RANGE"
    and bool(c["quantization_options"]["representative_datasets"]),
}


def meta_graph(saved_model_dir: Path) -> saved_model_pb2.MetaGraphDef:
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model_dir / "saved_model.pb").read_bytes())
    assert len(proto.meta_graphs) == 1
    return proto.meta_graphs[0]


def library_names(meta: saved_model_pb2.MetaGraphDef) -> set[str]:
    return {f.signature.name for f in meta.graph_def.library.function}


def concrete_names(meta: saved_model_pb2.MetaGraphDef, entry: dict) -> set[str]:
    """The FunctionDefLibrary names a tpu_functions / experimental entry designates."""
    if "function_alias" in entry:
        return {name for name, alias in meta.meta_info_def.function_aliases.items() if alias == entry["function_alias"]}
    if "concrete_function_name" in entry:
        return {entry["concrete_function_name"]} & library_names(meta)
    if entry.get("jit_compile_functions"):
        return {
            f.signature.name
            for f in meta.graph_def.library.function
            if f.attr["_XlaMustCompile"].b
        }
    return set()


def tensor_spec_shapes(value) -> list[list[int]]:
    """Shapes of every TensorSpec inside a SavedObjectGraph StructuredValue, in order."""
    kind = value.WhichOneof("kind")
    if kind == "tensor_spec_value":
        return [[d.size for d in value.tensor_spec_value.shape.dim]]
    if kind in ("list_value", "tuple_value"):
        return [s for v in getattr(value, kind).values for s in tensor_spec_shapes(v)]
    if kind == "dict_value":
        return [s for _, v in sorted(value.dict_value.fields.items()) for s in tensor_spec_shapes(v)]
    return []


def function_input_shapes(meta: saved_model_pb2.MetaGraphDef, name: str) -> list[list[int]]:
    saved = meta.object_graph_def.concrete_functions[name]
    return tensor_spec_shapes(saved.canonicalized_input_signature)


def signature_input_shapes(meta: saved_model_pb2.MetaGraphDef, key: str) -> list[list[int]]:
    inputs = meta.signature_def[key].inputs
    return [[d.size for d in inputs[name].tensor_shape.dim] for name in sorted(inputs)]


def example_inputs(spec: dict[str, tf.TensorSpec], batch: int, rng: np.random.Generator) -> dict[str, tf.Tensor]:
    """Random inputs for a signature; strings are rows of space-separated numbers."""
    inputs = {}
    for name, tensor_spec in spec.items():
        shape = [batch if d is None else d for d in tensor_spec.shape.as_list()]
        if tensor_spec.dtype == tf.string:
            numbers = rng.normal(size=shape + [4]).round(3)
            value = np.array([" ".join(map(str, row)) for row in numbers.reshape(-1, 4)]).reshape(shape)
        elif tensor_spec.dtype.is_integer:
            value = rng.integers(0, 8, size=shape)  # small: valid ids for the vocabularies of the examples
        else:
            value = rng.normal(size=shape)
        inputs[name] = tf.constant(value, dtype=tensor_spec.dtype)
    return inputs


def test_every_converter_scenario_has_an_example(recipes) -> None:
    converters = [r.canonical["converter"] for r in recipes.values()]
    missing = [name for name, shown in SCENARIOS.items() if not any(shown(c) for c in converters)]
    assert missing == []


def test_recipe_names_exist_in_the_export(recipe_name: str, recipes, exported) -> None:
    meta = meta_graph(exported[recipe_name])
    converter = recipes[recipe_name].canonical["converter"]
    for entry in converter["tpu_functions"]:
        if "signature_name" in entry:
            assert entry["signature_name"] in meta.signature_def
        else:
            assert concrete_names(meta, entry), f"{entry} names no function of the export"
    for batch in converter["batch_options"]:
        experimental = batch.get("experimental", {})
        if "signature_name" in experimental:
            assert experimental["signature_name"] in meta.signature_def
        elif experimental:
            assert concrete_names(meta, experimental), f"{experimental} names no function of the export"
    for key in converter.get("quantization_options", {}).get("signature_keys", []):
        assert key in meta.signature_def


def test_batched_inputs_have_an_unknown_dimension_0(recipe_name: str, recipes, exported) -> None:
    meta = meta_graph(exported[recipe_name])
    converter = recipes[recipe_name].canonical["converter"]
    for batch in converter["batch_options"]:
        experimental = batch.get("experimental")
        if experimental and "signature_name" in experimental:
            shapes = signature_input_shapes(meta, experimental["signature_name"])
        else:
            # Without `experimental`, the BatchFunction wraps every TPU function.
            entries = [experimental] if experimental else converter["tpu_functions"]
            functions = sorted(set().union(*(concrete_names(meta, e) for e in entries)))
            assert functions
            shapes = [s for f in functions for s in function_input_shapes(meta, f)]
        assert shapes and all(len(s) >= 1 and s[0] == -1 for s in shapes), shapes


@pytest.mark.parametrize("batch", [1, 3])
def test_serving_signature_runs_with_any_batch_size(recipe_name: str, batch: int, exported) -> None:
    serve = tf.saved_model.load(str(exported[recipe_name])).signatures["serving_default"]
    fixed = {s.shape[0] for s in serve.structured_input_signature[1].values()} - {None}
    if fixed:  # a fixed-batch example (all_targets: LSTM fusion and XLA AOT want a static batch)
        (batch,) = fixed
    outputs = serve(**example_inputs(serve.structured_input_signature[1], batch, np.random.default_rng(batch)))
    assert outputs
    for value in outputs.values():
        assert value.shape[0] == batch  # one output row per input row: batching rule 4
        assert np.all(np.isfinite(value.numpy()))


def test_concrete_function_name_is_stable_across_exports(recipes, script, tmp_path: Path) -> None:
    # A second export (in this process, after other exports ran) names the function the same.
    recipe = recipes["concrete_function"]
    module = script(recipe.root / recipe.canonical["model"]["export"]["script"], "concrete_again")
    module.export(str(tmp_path))
    wanted = recipe.canonical["converter"]["tpu_functions"][0]["concrete_function_name"]
    assert wanted == module.CONCRETE_FUNCTION_NAME
    assert wanted in library_names(meta_graph(tmp_path))


@pytest.mark.parametrize("name", ["quantized", "string_preprocess"])
def test_representative_dataset_is_what_its_script_writes(script, tmp_path: Path, name: str) -> None:
    maker = script(REPO / "recipes" / "data" / f"make_{name}.py", f"make_{name}")
    maker.write(str(tmp_path / "again.tfrecord"))
    committed = REPO / "recipes" / "data" / f"{name}.tfrecord"
    assert (tmp_path / "again.tfrecord").read_bytes() == committed.read_bytes()


def test_string_inputs_are_verified_on_their_own_dataset(recipes, exported) -> None:
    recipe = recipes["string_preprocess"]
    (source,) = recipe.canonical["verify"]["representative_datasets"].values()
    serve = tf.saved_model.load(str(exported["string_preprocess"])).signatures["serving_default"]
    records = list(tf.data.TFRecordDataset(str(recipe.root / source["tfrecord_file_path"])).as_numpy_iterator())
    for record in records:
        sample = quantization_options_pb2.RepresentativeDataSample.FromString(record)
        text = tf.make_ndarray(sample.tensor_proto_inputs["text"])
        assert serve(text=tf.constant(text))["score"].shape == (1,)


def test_representative_dataset_matches_the_signature(recipes, exported) -> None:
    recipe = recipes["quantized"]
    quant = recipe.canonical["converter"]["quantization_options"]
    serve = tf.saved_model.load(str(exported["quantized"])).signatures["serving_default"]
    specs = serve.structured_input_signature[1]
    for key, source in quant["representative_datasets"].items():
        assert key in quant["signature_keys"]
        records = list(tf.data.TFRecordDataset(str(recipe.root / source["tfrecord_file_path"])).as_numpy_iterator())
        assert len(records) >= 200  # converter-reference.md recommends more than 200
        for record in records:
            sample = quantization_options_pb2.RepresentativeDataSample.FromString(record)
            assert sorted(sample.tensor_proto_inputs) == sorted(specs)
            for input_name, proto in sample.tensor_proto_inputs.items():
                value = tf.make_ndarray(proto)
                assert tf.TensorSpec(value.shape, tf.as_dtype(value.dtype)).is_compatible_with(specs[input_name])


def test_recipes_start_with_their_schema_line(recipes) -> None:
    files = [r.file for r in recipes.values()] + [REPO / "recipes" / "common" / "base.yaml"]
    for path in files:
        first = path.read_text().splitlines()[0]
        prefix = "# yaml-language-server: $schema="
        assert first.startswith(prefix), path
        assert (path.parent / first[len(prefix) :]).resolve() == REPO / "schemas" / "recipe.schema.json"


def test_the_shared_base_is_used_through_extends_and_is_not_a_recipe(recipes) -> None:
    base = REPO / "recipes" / "common" / "base.yaml"
    assert base not in {r.file for r in recipes.values()}
    extending = [r for r in recipes.values() if "extends: common/base.yaml" in r.file.read_text()]
    assert len(extending) >= 2
    stated = yaml.safe_load(base.read_text())
    for recipe in extending:
        # What the base states reaches the recipe; the canonical form adds the defaults.
        (batch,) = recipe.canonical["converter"]["batch_options"]
        assert batch == {**batch, **stated["converter"]["batch_options"][0]}
        assert recipe.canonical["verify"] == {**recipe.canonical["verify"], **stated["verify"]}
