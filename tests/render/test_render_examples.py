"""Every example recipe renders to a text proto that parses against
schemas/converter_options.proto and holds exactly the recipe's converter options."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from tests.cli import REPO
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.render import render

ALL_RECIPES = {r.name: r for r in load_recipes(load_workspace(override=REPO))}


def _tfrecord_only(recipe) -> bool:
    datasets = recipe.canonical["converter"].get("quantization_options", {}).get("representative_datasets", {})
    return all("tfrecord_file_path" in source for source in datasets.values())


# The official converter reads TFRecord datasets only; npz and generator sources are
# tpubuild's own (turned into TFRecord by the dataset stage) and cannot be rendered.
RECIPES = {name: r for name, r in ALL_RECIPES.items() if _tfrecord_only(r)}
GENERATED = sorted(set(ALL_RECIPES) - set(RECIPES))


@pytest.mark.parametrize("name", GENERATED)
def test_generated_datasets_cannot_be_rendered_for_the_converter(name: str) -> None:
    from tpubuild.errors import ConfigError

    recipe = ALL_RECIPES[name]
    with pytest.raises(ConfigError) as info:
        render(recipe.canonical, source=recipe.rel_file)
    (line,) = info.value.lines()
    assert line.startswith(f"{recipe.rel_file}: converter.quantization_options.representative_datasets.")
    assert "the converter reads only TFRecord datasets (tfrecord_file_path)" in line


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_example_parses_into_the_recipes_options(name: str, pb2, from_message) -> None:
    recipe = RECIPES[name]
    text = render(recipe.canonical, source=recipe.rel_file)
    msg = text_format.Parse(text, pb2.ConverterOptions())
    assert from_message(msg) == recipe.canonical["converter"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_example_is_laid_out_as_protobuf_prints_it(name: str, pb2) -> None:
    text = render(RECIPES[name].canonical)
    assert text == text_format.MessageToString(text_format.Parse(text, pb2.ConverterOptions()), as_utf8=True)


def test_quantization_options_parse_as_tensorflows_own_message(pb2) -> None:
    from tensorflow.compiler.mlir.quantization.tensorflow import (
        quantization_options_pb2,
    )

    quantized = [r for r in RECIPES.values() if "quantization_options" in r.canonical["converter"]]
    assert quantized
    for recipe in quantized:
        msg = text_format.Parse(render(recipe.canonical), pb2.ConverterOptions())
        ours = msg.external_feature_configs.quantization_options
        # Same text and same wire bytes: the field names and numbers are TensorFlow's.
        theirs = text_format.Parse(text_format.MessageToString(ours), quantization_options_pb2.QuantizationOptions())
        assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(deterministic=True)
        canonical = recipe.canonical["converter"]["quantization_options"]
        preset = {"STATIC_RANGE": "METHOD_STATIC_RANGE_INT8", "DYNAMIC_RANGE": "METHOD_DYNAMIC_RANGE_INT8",
                  "WEIGHT_ONLY": "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8"}[canonical["method"]]
        assert theirs.quantization_method.preset_method == quantization_options_pb2.QuantizationMethod.PresetMethod.Value(preset)
        assert theirs.op_set == quantization_options_pb2.XLA
        assert list(theirs.signature_keys) == canonical["signature_keys"]
        assert {k: v.tfrecord_file_path for k, v in theirs.representative_datasets.items()} == {
            k: v["tfrecord_file_path"] for k, v in canonical["representative_datasets"].items()
        }


def test_layers_kept_in_float_render_as_tensorflows_unit_wise_specs(pb2, from_message) -> None:
    """`unit_wise_quantization_specs` (what `explain-error --stage quantize` proposes) parse
    against the converter proto and as TensorFlow's own QuantizationOptions, unchanged."""
    import copy

    from tensorflow.compiler.mlir.quantization.tensorflow import (
        quantization_options_pb2,
    )

    canonical = copy.deepcopy(RECIPES["quantized"].canonical)
    specs = [{"unit": [{"node_name": "dense/MatMul"}, {"op_type": "Conv2D", "func_name": "__inference_f_1"}],
              "method": "NO_QUANTIZE"}]
    canonical["converter"]["quantization_options"]["unit_wise_quantization_specs"] = specs
    msg = text_format.Parse(render(canonical), pb2.ConverterOptions())
    assert from_message(msg) == canonical["converter"]
    ours = msg.external_feature_configs.quantization_options
    theirs = text_format.Parse(text_format.MessageToString(ours), quantization_options_pb2.QuantizationOptions())
    assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(deterministic=True)
    (spec,) = theirs.unit_wise_quantization_specs
    assert [u.node_name for u in spec.unit] == ["dense/MatMul", ""] and spec.unit[1].op_type == "Conv2D"
    assert spec.quantization_method.preset_method == quantization_options_pb2.QuantizationMethod.METHOD_NO_QUANTIZE
