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
STATES = ("DEFAULT", "ENABLED", "DISABLED")
METHODS = {2: "STATIC_RANGE", 3: "DYNAMIC_RANGE", 4: "WEIGHT_ONLY"}


def converter_from_message(msg, pb2) -> dict:
    """The canonical converter section a parsed ConverterOptions stands for."""
    bf16 = msg.bfloat16_optimization_options
    scope = pb2.BFloat16OptimizationOptions.Scope.Name(bf16.scope)
    out = {
        "tpu_functions": [{f.WhichOneof("name"): getattr(f, f.WhichOneof("name"))} for f in msg.tpu_functions],
        "batch_options": [_batch(b) for b in msg.batch_options],
        "io_shape_optimization": STATES[msg.io_shape_optimization],
        "bfloat16_optimization": STATES[msg.bfloat16_optimization],
        "disable_default_optimizations": msg.disable_default_optimizations,
        "bfloat16_optimization_options": {
            "scope": "TPU" if scope == "DEFAULT" else scope,
            "skip_safety_checks": bf16.skip_safety_checks,
            "filterlist": list(bf16.filterlist),
        },
    }
    if msg.HasField("xla_sharding_options"):
        xla = msg.xla_sharding_options
        out["xla_sharding_options"] = {
            "num_cores_per_replica": xla.num_cores_per_replica,
            "device_assignment": list(xla.device_assignment),
        }
        if xla.topology:
            topology = pb2.TopologyProto.FromString(xla.topology)
            out["xla_sharding_options"]["topology"] = {
                "mesh_shape": list(topology.mesh_shape),
                "device_coordinates": list(topology.device_coordinates),
            }
    if msg.external_feature_configs.HasField("quantization_options"):
        quant = msg.external_feature_configs.quantization_options
        out["quantization_options"] = {
            "method": METHODS[quant.quantization_method.preset_method],
            "op_set": pb2.OpSet.Name(quant.op_set),
            "tags": list(quant.tags),
            "signature_keys": list(quant.signature_keys),
            "representative_datasets": {
                key: {"tfrecord_file_path": value.tfrecord_file_path}
                for key, value in quant.representative_datasets.items()
            },
        }
    return out


def _batch(b) -> dict:
    out = {
        "num_batch_threads": b.num_batch_threads,
        "max_batch_size": b.max_batch_size,
        "batch_timeout_micros": b.batch_timeout_micros,
        "allowed_batch_sizes": list(b.allowed_batch_sizes),
        "max_enqueued_batches": b.max_enqueued_batches,
        "disable_large_batch_splitting": b.disable_large_batch_splitting,
    }
    if b.HasField("experimental"):
        kind = b.experimental.WhichOneof("batch_component")
        out["experimental"] = {kind: getattr(b.experimental, kind)}
    return out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_example_parses_into_the_recipes_options(name: str, pb2) -> None:
    recipe = RECIPES[name]
    text = render(recipe.canonical, source=recipe.rel_file)
    msg = text_format.Parse(text, pb2.ConverterOptions())
    assert converter_from_message(msg, pb2) == recipe.canonical["converter"]


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
