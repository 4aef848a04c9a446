"""Rendering edge cases on canonical dicts: every oneof, state, scope, topology bytes,
the quantization map, errors, and a property test that parse(render(x)) is x."""

from __future__ import annotations

import json

import pytest
import yaml
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st

from tpubuild.errors import ConfigError
from tpubuild.render import render, topology_bytes

BF16_DEFAULTS = {"scope": "TPU", "skip_safety_checks": False, "filterlist": []}


def canonical(**converter) -> dict:
    """A canonical recipe whose converter section is the defaults plus `converter`."""
    return {
        "name": "unit",
        "model": {"saved_model": "models/unit", "tags": ["serve"]},
        "converter": {
            "tpu_functions": [],
            "batch_options": [],
            "io_shape_optimization": "DEFAULT",
            "bfloat16_optimization": "DEFAULT",
            "disable_default_optimizations": False,
            "bfloat16_optimization_options": dict(BF16_DEFAULTS),
            **converter,
        },
        "verify": {"samples": 32, "seed": 0, "rtol": None, "atol": None},
    }


def batch(**fields) -> dict:
    return {
        "num_batch_threads": 1,
        "max_batch_size": 8,
        "batch_timeout_micros": 0,
        "allowed_batch_sizes": [],
        "max_enqueued_batches": 10,
        "disable_large_batch_splitting": False,
        **fields,
    }


def quantization(**fields) -> dict:
    return {
        "method": "STATIC_RANGE",
        "tags": ["serve"],
        "signature_keys": ["serving_default"],
        "op_set": "XLA",
        "representative_datasets": {},
        **fields,
    }


def test_all_defaults_render_to_an_empty_message(pb2) -> None:
    assert render(canonical()) == ""
    assert text_format.Parse("", pb2.ConverterOptions()) == pb2.ConverterOptions()


def test_every_tpu_function_kind(pb2) -> None:
    entries = [
        {"function_alias": "tpu_func"},
        {"concrete_function_name": "__inference_serve_24"},
        {"jit_compile_functions": True},
        {"signature_name": "serving_default"},
    ]
    text = render(canonical(tpu_functions=entries))
    assert text == (
        'tpu_functions {\n  function_alias: "tpu_func"\n}\n'
        'tpu_functions {\n  concrete_function_name: "__inference_serve_24"\n}\n'
        "tpu_functions {\n  jit_compile_functions: true\n}\n"
        'tpu_functions {\n  signature_name: "serving_default"\n}\n'
    )
    parsed = text_format.Parse(text, pb2.ConverterOptions())
    assert [f.WhichOneof("name") for f in parsed.tpu_functions] == [next(iter(e)) for e in entries]


def test_batch_options_leave_out_proto_defaults_and_repeat_allowed_sizes() -> None:
    # num_batch_threads 1 and max_enqueued_batches 10 are tpubuild's defaults, not the
    # proto's (0), so they are written; a zero timeout and false are not.
    text = render(canonical(batch_options=[batch(allowed_batch_sizes=[2, 8])]))
    assert text == (
        "batch_options {\n"
        "  num_batch_threads: 1\n"
        "  max_batch_size: 8\n"
        "  allowed_batch_sizes: 2\n"
        "  allowed_batch_sizes: 8\n"
        "  max_enqueued_batches: 10\n"
        "}\n"
    )


@pytest.mark.parametrize("kind", ["function_alias", "concrete_function_name", "signature_name"])
def test_each_experimental_oneof(kind: str, pb2) -> None:
    entry = batch(batch_timeout_micros=100, disable_large_batch_splitting=True, experimental={kind: "batch_func"})
    text = render(canonical(batch_options=[entry]))
    assert text.endswith(
        "  batch_timeout_micros: 100\n  max_enqueued_batches: 10\n  disable_large_batch_splitting: true\n"
        f'  experimental {{\n    {kind}: "batch_func"\n  }}\n}}\n'
    )
    parsed = text_format.Parse(text, pb2.ConverterOptions()).batch_options[0]
    assert parsed.experimental.WhichOneof("batch_component") == kind


@pytest.mark.parametrize("state, line", [("DEFAULT", ""), ("ENABLED", "{}: ENABLED\n"), ("DISABLED", "{}: DISABLED\n")])
@pytest.mark.parametrize("field", ["io_shape_optimization", "bfloat16_optimization"])
def test_states_by_name_default_left_out(field: str, state: str, line: str) -> None:
    assert render(canonical(**{field: state})) == line.format(field)


def test_disable_default_optimizations() -> None:
    assert render(canonical(disable_default_optimizations=True)) == "disable_default_optimizations: true\n"


def test_bfloat16_scope_all_checks_and_filterlist(pb2) -> None:
    options = {"scope": "ALL", "skip_safety_checks": True, "filterlist": ["Softmax", "TopKV2"]}
    text = render(canonical(bfloat16_optimization_options=options))
    assert text == (
        "bfloat16_optimization_options {\n"
        "  scope: ALL\n"
        "  skip_safety_checks: true\n"
        '  filterlist: "Softmax"\n'
        '  filterlist: "TopKV2"\n'
        "}\n"
    )
    assert text_format.Parse(text, pb2.ConverterOptions()).bfloat16_optimization_options.scope == 2


def test_bfloat16_scope_tpu_is_the_converters_default() -> None:
    # The converter's scope DEFAULT (0) means TPU: nothing to write.
    options = {"scope": "TPU", "skip_safety_checks": False, "filterlist": ["Softmax"]}
    assert render(canonical(bfloat16_optimization_options=options)) == (
        'bfloat16_optimization_options {\n  filterlist: "Softmax"\n}\n'
    )


def test_xla_sharding_without_topology_still_writes_num_cores() -> None:
    text = render(canonical(xla_sharding_options={"num_cores_per_replica": 1, "device_assignment": [0, 0, 0, 1]}))
    assert text == (
        "xla_sharding_options {\n"
        "  num_cores_per_replica: 1\n"
        "  device_assignment: 0\n  device_assignment: 0\n  device_assignment: 0\n  device_assignment: 1\n"
        "}\n"
    )


def test_topology_is_an_escaped_serialized_topology_proto(pb2) -> None:
    # df_1x1: one chip with two cores, mesh (1, 1, 1, 2).
    topology = {"mesh_shape": [1, 1, 1, 2], "device_coordinates": [0, 0, 0, 0, 0, 0, 0, 1]}
    text = render(canonical(xla_sharding_options={"num_cores_per_replica": 2, "device_assignment": [], "topology": topology}))
    assert text == (
        "xla_sharding_options {\n"
        "  num_cores_per_replica: 2\n"
        '  topology: "\\n\\004\\001\\001\\001\\002\\020\\001\\030\\002\\"\\010\\000\\000\\000\\000\\000\\000\\000\\001"\n'
        "}\n"
    )
    parsed = text_format.Parse(text, pb2.ConverterOptions())
    assert parsed.xla_sharding_options.topology == topology_bytes(**topology)


@pytest.mark.parametrize(
    "mesh_shape, device_coordinates",
    [
        ([1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0, 1]),  # df_1x1
        ([1, 2, 1, 1], [0, 0, 0, 0, 0, 1, 0, 0]),  # pf_1x2x1
        ([2, 2, 1, 2], [x for y in range(2) for x_ in range(2) for core in range(2) for x in (x_, y, 0, core)]),
        ([300, 1, 1, 1], [299, 0, 0, 0]),  # multi-byte varints
    ],
)
def test_topology_bytes_are_tensorflows_topology_proto(mesh_shape, device_coordinates) -> None:
    import tensorflow as tf
    from tensorflow.core.protobuf.tpu import topology_pb2

    ours = topology_bytes(mesh_shape, device_coordinates)
    devices = len(device_coordinates) // 4
    theirs = topology_pb2.TopologyProto(
        mesh_shape=mesh_shape, num_tasks=1, num_tpu_devices_per_task=devices, device_coordinates=device_coordinates
    )
    assert ours == theirs.SerializeToString(deterministic=True)
    # TensorFlow's own Topology reads it back: one task holding every device.
    topology = tf.tpu.experimental.Topology(serialized=ours)
    assert list(topology.mesh_shape) == mesh_shape
    assert topology.device_coordinates.tolist() == [[device_coordinates[i : i + 4] for i in range(0, len(device_coordinates), 4)]]


def test_topology_coordinates_must_split_into_mesh_tuples() -> None:
    with pytest.raises(ValueError) as excinfo:
        topology_bytes([1, 1, 1, 2], [0, 0, 0])
    assert str(excinfo.value) == "3 device coordinates do not split into 4-tuples"


@pytest.mark.parametrize(
    "method, preset",
    [
        ("STATIC_RANGE", "METHOD_STATIC_RANGE_INT8"),
        ("DYNAMIC_RANGE", "METHOD_DYNAMIC_RANGE_INT8"),
        ("WEIGHT_ONLY", "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8"),
    ],
)
def test_quantization_methods(method: str, preset: str) -> None:
    text = render(canonical(quantization_options=quantization(method=method)))
    assert text == (
        "external_feature_configs {\n"
        "  quantization_options {\n"
        "    quantization_method {\n"
        f"      preset_method: {preset}\n"
        "    }\n"
        "    op_set: XLA\n"
        '    tags: "serve"\n'
        '    signature_keys: "serving_default"\n'
        "  }\n"
        "}\n"
    )


def test_representative_datasets_map_sorted_by_key_with_a_path_prefix(pb2) -> None:
    datasets = {
        "serving_default": {"tfrecord_file_path": "data/serve.tfrecord"},
        "classify": {"tfrecord_file_path": "data/classify.tfrecord"},
    }
    options = quantization(signature_keys=["serving_default", "classify"], representative_datasets=datasets)
    text = render(canonical(quantization_options=options), path_prefix="/ws/")
    assert text.endswith(
        '    signature_keys: "serving_default"\n'
        '    signature_keys: "classify"\n'
        "    representative_datasets {\n"
        '      key: "classify"\n'
        "      value {\n"
        '        tfrecord_file_path: "/ws/data/classify.tfrecord"\n'
        "      }\n"
        "    }\n"
        "    representative_datasets {\n"
        '      key: "serving_default"\n'
        "      value {\n"
        '        tfrecord_file_path: "/ws/data/serve.tfrecord"\n'
        "      }\n"
        "    }\n"
        "  }\n"
        "}\n"
    )
    quant = text_format.Parse(text, pb2.ConverterOptions()).external_feature_configs.quantization_options
    assert dict((k, v.tfrecord_file_path) for k, v in quant.representative_datasets.items()) == {
        "classify": "/ws/data/classify.tfrecord",
        "serving_default": "/ws/data/serve.tfrecord",
    }


@pytest.mark.parametrize(
    "source, kind",
    [
        ({"npz": "data/q.npz"}, "npz"),
        ({"generator": "data.gen:samples", "num_samples": 200, "module_file": "data/gen.py"}, "generator"),
    ],
)
def test_datasets_the_converter_cannot_read_are_an_error(source: dict, kind: str) -> None:
    recipe = canonical(quantization_options=quantization(representative_datasets={"serving_default": source}))
    with pytest.raises(ConfigError) as excinfo:
        render(recipe, source="recipes/q.yaml")
    assert excinfo.value.lines() == [
        "recipes/q.yaml: converter.quantization_options.representative_datasets.serving_default: "
        f"the converter reads only TFRecord datasets (tfrecord_file_path), not {kind}; "
        "write one with tf.quantization.experimental.TfRecordRepresentativeDatasetSaver"
    ]
    # json and yaml show the canonical section, which can hold any source.
    assert json.loads(render(recipe, "json"))["quantization_options"]["representative_datasets"] == {"serving_default": source}


def test_strings_are_escaped_as_protobuf_does(pb2) -> None:
    names = ['quote"d', "back\\slash", "tab\tand\nnewline", "unicodé_函数", "it's"]
    text = render(canonical(tpu_functions=[{"function_alias": n} for n in names]))
    assert 'function_alias: "quote\\"d"\n' in text
    assert 'function_alias: "unicodé_函数"\n' in text
    parsed = text_format.Parse(text, pb2.ConverterOptions())
    assert [f.function_alias for f in parsed.tpu_functions] == names


def test_json_and_yaml_are_the_canonical_converter_section() -> None:
    recipe = canonical(batch_options=[batch(experimental={"signature_name": "serving_default"})])
    assert json.loads(render(recipe, "json")) == recipe["converter"]
    assert yaml.safe_load(render(recipe, "yaml")) == recipe["converter"]


@pytest.mark.parametrize("fmt", ["textproto", "json", "yaml"])
def test_output_does_not_depend_on_key_order(fmt: str) -> None:
    recipe = canonical(
        tpu_functions=[{"function_alias": "f"}],
        batch_options=[batch(allowed_batch_sizes=[4, 8])],
        quantization_options=quantization(representative_datasets={"b": {"tfrecord_file_path": "b"}, "a": {"tfrecord_file_path": "a"}}),
    )
    shuffled = json.loads(json.dumps(recipe), object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    assert shuffled == recipe and list(shuffled["converter"]) != list(recipe["converter"])
    assert render(shuffled, fmt) == render(recipe, fmt)


def test_unknown_format() -> None:
    with pytest.raises(ValueError) as excinfo:
        render(canonical(), "pbtxt")
    assert str(excinfo.value) == "unknown format 'pbtxt'; expected one of textproto, textproto-v2, json, yaml"


# Property: any canonical converter section survives render -> protobuf parse unchanged,
# printed exactly as protobuf prints it.
names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
int32s = st.integers(min_value=0, max_value=2**31 - 1)
tpu_function = st.one_of(
    st.builds(lambda n: {"function_alias": n}, names),
    st.builds(lambda n: {"concrete_function_name": n}, names),
    st.builds(lambda n: {"signature_name": n}, names),
    st.just({"jit_compile_functions": True}),
)
experimental = st.one_of(
    *(st.builds(lambda n, k=kind: {k: n}, names) for kind in ("function_alias", "concrete_function_name", "signature_name"))
)
batch_entry = st.builds(
    lambda threads, size, timeout, sizes, queue, split, exp: batch(
        num_batch_threads=threads, max_batch_size=size, batch_timeout_micros=timeout, allowed_batch_sizes=sizes,
        max_enqueued_batches=queue, disable_large_batch_splitting=split, **({"experimental": exp} if exp else {}),
    ),
    int32s, int32s, int32s, st.lists(int32s, max_size=4), int32s, st.booleans(), st.none() | experimental,
)
topology = st.integers(1, 3).flatmap(
    lambda devices: st.builds(
        lambda mesh, coords: {"mesh_shape": mesh, "device_coordinates": coords},
        st.lists(st.integers(1, 4096), min_size=4, max_size=4),
        st.lists(st.integers(0, 4096), min_size=4 * devices, max_size=4 * devices),
    )
)
xla = st.builds(
    lambda cores, assignment, topo: {"num_cores_per_replica": cores, "device_assignment": assignment, **({"topology": topo} if topo else {})},
    st.integers(1, 64), st.lists(int32s, max_size=8), st.none() | topology,
)
quant = st.builds(
    lambda method, tags, keys, datasets: quantization(method=method, tags=tags, signature_keys=keys, representative_datasets=datasets),
    st.sampled_from(["STATIC_RANGE", "DYNAMIC_RANGE", "WEIGHT_ONLY"]),
    st.lists(names, max_size=2), st.lists(names, max_size=3),
    st.dictionaries(names, st.builds(lambda p: {"tfrecord_file_path": p}, names), max_size=3),
)
converter = st.fixed_dictionaries(
    {
        "tpu_functions": st.lists(tpu_function, max_size=4),
        "batch_options": st.lists(batch_entry, max_size=1),
        "io_shape_optimization": st.sampled_from(["DEFAULT", "ENABLED", "DISABLED"]),
        "bfloat16_optimization": st.sampled_from(["DEFAULT", "ENABLED", "DISABLED"]),
        "disable_default_optimizations": st.booleans(),
        "bfloat16_optimization_options": st.fixed_dictionaries(
            {"scope": st.sampled_from(["TPU", "ALL"]), "skip_safety_checks": st.booleans(), "filterlist": st.lists(names, max_size=3)}
        ),
    },
    optional={"xla_sharding_options": xla, "quantization_options": quant},
)


@settings(max_examples=150, deadline=None)
@given(converter)
def test_any_converter_section_round_trips_through_protobuf(pb2, from_message, converter) -> None:
    text = render(canonical(**converter))
    parsed = text_format.Parse(text, pb2.ConverterOptions())
    assert from_message(parsed) == converter
    assert text == text_format.MessageToString(parsed, as_utf8=True)
