"""Issue 47: today's ConverterOptionsV2, restated in schemas/converter_options_v2.proto.

Every example recipe renders (`--format textproto-v2`) to text that V2, compiled by
protoc, parses into the recipe's options, or is refused naming the field V2 cannot hold;
the committed descriptor set (what `tpubuild` parses text protos with, TensorFlow-free)
is what protoc makes of the .proto files now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, text_format

from tests.cli import REPO
from tpubuild.config.recipe import load_recipes
from tpubuild.config.workspace import load_workspace
from tpubuild.errors import ConfigError
from tpubuild.render import render

SCHEMAS = REPO / "schemas"
RECIPES = {r.name: r for r in load_recipes(load_workspace(override=REPO))}
QUANTIZED = sorted(name for name, r in RECIPES.items() if "quantization_options" in r.canonical["converter"])
V2_RECIPES = sorted(set(RECIPES) - set(QUANTIZED))


def test_the_committed_descriptor_set_is_what_protoc_makes_of_the_protos(tmp_path: Path) -> None:
    out = tmp_path / "set.binpb"
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{SCHEMAS}", f"--descriptor_set_out={out}",
         "converter_options.proto", "converter_options_v2.proto"],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    committed = descriptor_pb2.FileDescriptorSet.FromString((SCHEMAS / "converter_options.binpb").read_bytes())
    assert committed == fresh, "run: python -m grpc_tools.protoc -Ischemas " \
        "--descriptor_set_out=schemas/converter_options.binpb converter_options.proto converter_options_v2.proto"


def test_v2_numbers_the_fields_as_google_does(pb2_v2) -> None:
    batch = pb2_v2.BatchOptionsV2.DESCRIPTOR
    assert {f.name: f.number for f in batch.oneofs_by_name["batch_component"].fields} == {
        "function_alias": 11, "concrete_function_name": 12, "signature_name": 13}
    assert "experimental" not in batch.fields_by_name
    written = descriptor_pb2.DescriptorProto()
    batch.CopyToProto(written)
    assert [(r.start, r.end) for r in written.reserved_range] == [(7, 8)]  # the guide's `experimental`
    assert pb2_v2.TpuFunction.DESCRIPTOR.fields_by_name["enable_soft_device_placement"].number == 2
    bf16 = pb2_v2.BFloat16OptimizationOptions.DESCRIPTOR.fields_by_name
    assert (bf16["preserve_signature"].number, bf16["experimental"].number, bf16["enable_cast_outside"].number) == \
        (4, 5, 110)
    top = pb2_v2.ConverterOptionsV2.DESCRIPTOR.fields_by_name
    assert {name: top[name].number for name in (
        "tpu_functions", "enable_device_placement_safety_checks", "enable_shared_replicate_cluster_name",
        "xla_functions", "batch_options", "io_shape_optimization", "bfloat16_optimization",
        "disable_default_optimizations", "bfloat16_optimization_options", "xla_sharding_options",
        "non_xla_device_placement_options", "xla_io_optimization", "xla_io_optimization_options",
        "experimental_options")} == {
        "tpu_functions": 1, "enable_device_placement_safety_checks": 2, "enable_shared_replicate_cluster_name": 3,
        "xla_functions": 4, "batch_options": 100, "io_shape_optimization": 200, "bfloat16_optimization": 201,
        "disable_default_optimizations": 202, "bfloat16_optimization_options": 203, "xla_sharding_options": 204,
        "non_xla_device_placement_options": 206, "xla_io_optimization": 207, "xla_io_optimization_options": 208,
        "experimental_options": 209}


@pytest.mark.parametrize("name", V2_RECIPES)
def test_example_renders_to_v2_that_parses_into_the_recipes_options(name: str, pb2_v2) -> None:
    from tpubuild.converter_text import read_text_proto

    recipe = RECIPES[name]
    text = render(recipe.canonical, "textproto-v2", source=recipe.rel_file)
    message = text_format.Parse(text, pb2_v2.ConverterOptionsV2())
    # Laid out as protobuf prints it, and read back into the same converter section.
    assert text == text_format.MessageToString(message, as_utf8=True)
    imported = read_text_proto(text, "rendered")
    from tpubuild.config.canonical import canonicalize

    again = canonicalize({"model": recipe.canonical["model"], "converter": imported.converter}, name, REPO)
    assert again["converter"] == recipe.canonical["converter"]


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_example_is_refused_naming_the_field(name: str) -> None:
    recipe = RECIPES[name]
    with pytest.raises(ConfigError) as info:
        render(recipe.canonical, "textproto-v2", source=recipe.rel_file)
    assert info.value.lines() == [
        f"{recipe.rel_file}: converter.quantization_options: ConverterOptionsV2 has no field for quantization; "
        "render --format textproto (the guide's ConverterOptions, external_feature_configs) holds it"]


def test_v2_writes_the_batch_component_at_the_top_and_soft_placement(pb2_v2) -> None:
    canonical = _canonical({
        "tpu_functions": [{"function_alias": "tpu_func", "enable_soft_device_placement": True}],
        "batch_options": [{"max_batch_size": 8, "experimental": {"signature_name": "serving_default"}}],
        "bfloat16_optimization_options": {"scope": "ALL"},
    })
    assert render(canonical, "textproto-v2") == (
        'tpu_functions {\n  function_alias: "tpu_func"\n  enable_soft_device_placement: true\n}\n'
        "batch_options {\n  num_batch_threads: 1\n  max_batch_size: 8\n  max_enqueued_batches: 10\n"
        '  signature_name: "serving_default"\n}\n'
        "bfloat16_optimization_options {\n  scope: ALL\n  preserve_signature: true\n"
        "  experimental {\n    convert_checkpoint: true\n  }\n}\n"
    )
    text_format.Parse(render(canonical, "textproto-v2"), pb2_v2.ConverterOptionsV2())


def test_the_guides_format_refuses_what_only_v2_holds() -> None:
    canonical = _canonical({
        "tpu_functions": [{"function_alias": "tpu_func", "enable_soft_device_placement": True}],
        "enable_device_placement_safety_checks": True,
        "experimental_options": {"graph_pruning": "DISABLED"},
    })
    with pytest.raises(ConfigError) as info:
        render(canonical, "textproto", source="recipes/x.yaml")
    why = "the guide's ConverterOptions has no field for it; render --format textproto-v2 (ConverterOptionsV2) holds it"
    assert info.value.lines() == [
        f"recipes/x.yaml: converter.enable_device_placement_safety_checks: {why}",
        f"recipes/x.yaml: converter.experimental_options: {why}",
        f"recipes/x.yaml: converter.tpu_functions[0].enable_soft_device_placement: {why}",
    ]


def _canonical(converter: dict) -> dict:
    from tpubuild.config.canonical import canonicalize

    return canonicalize({"model": {"saved_model": "m"}, "converter": converter}, "x", REPO)
