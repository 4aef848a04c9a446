"""Every example recipe renders to a text proto that parses against
schemas/converter_options.proto and holds exactly the recipe's converter options."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from tpubuild.config import load_recipes
from tpubuild.render import render
from tpubuild.workspace import load_workspace

REPO = Path(__file__).resolve().parents[2]
RECIPES = {r.name: r for r in load_recipes(load_workspace(override=REPO))}
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
    from tensorflow.compiler.mlir.quantization.tensorflow import quantization_options_pb2

    quantized = [r for r in RECIPES.values() if "quantization_options" in r.canonical["converter"]]
    assert quantized
    for recipe in quantized:
        msg = text_format.Parse(render(recipe.canonical), pb2.ConverterOptions())
        ours = msg.external_feature_configs.quantization_options
        # Same text and same wire bytes: the field names and numbers are TensorFlow's.
        theirs = text_format.Parse(text_format.MessageToString(ours), quantization_options_pb2.QuantizationOptions())
        assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(deterministic=True)
        canonical = recipe.canonical["converter"]["quantization_options"]
        assert theirs.quantization_method.preset_method == quantization_options_pb2.QuantizationMethod.METHOD_STATIC_RANGE_INT8
        assert theirs.op_set == quantization_options_pb2.XLA
        assert list(theirs.signature_keys) == canonical["signature_keys"]
        assert {k: v.tfrecord_file_path for k, v in theirs.representative_datasets.items()} == {
            k: v["tfrecord_file_path"] for k, v in canonical["representative_datasets"].items()
        }
