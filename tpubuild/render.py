"""A canonical recipe's converter section as the Cloud TPU Inference Converter reads it.

`textproto` is the guide's `ConverterOptions` text proto (schemas/converter_options.proto)
for the converter's `--converter_options_string`, `textproto-v2` today's
`ConverterOptionsV2` (schemas/converter_options_v2.proto); `json` and `yaml` print the
canonical converter section. A field the chosen message cannot hold is an error naming
it, never left out. TensorFlow-free: the text proto and the TopologyProto bytes inside
it are written here, field by field in field-number order, the layout of protobuf's
own `text_format.MessageToString(..., as_utf8=True)`, so the output is deterministic.

Two spellings of one meaning. Without a Spelling, the canonical form is written as it is:
each of tpubuild's defaults spelled out (`num_batch_threads: 1`), lists as the canonical
form keeps them (a filterlist sorted, each op once): what a lock file's figures and `diff`
compare, since two recipes that mean the same write the same text. With one (`tpubuild
render`), the message is the one the recipe writes: each field its layers set, as they
set it (a filterlist's order and repeats, an explicit `scope: TPU`, an empty
`bfloat16_optimization_options {}`), and no field it leaves out, which then means the
converter's default (tpubuild's defaults are the converter's: num_batch_threads 1,
max_enqueued_batches 10, num_cores_per_replica 1, and TensorFlow's quantizer's, static
range, op set XLA, tags `serve`, signature `serving_default`; quantize_model.py
_populate_quantization_options_default_values). So a text proto `tpubuild import` read
renders back to the same message, field for field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tpubuild.errors import ConfigError, Diagnostic, Location

FORMATS = ("textproto", "textproto-v2", "json", "yaml")

# tpubuild's method names -> TensorFlow's QuantizationMethod.PresetMethod values.
PRESET_METHODS = {
    "STATIC_RANGE": "METHOD_STATIC_RANGE_INT8",
    "DYNAMIC_RANGE": "METHOD_DYNAMIC_RANGE_INT8",
    "WEIGHT_ONLY": "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8",
    "NO_QUANTIZE": "METHOD_NO_QUANTIZE",  # unit-wise specs only: the layers they name stay float
}
TPU_FUNCTION_FIELDS = ("function_alias", "concrete_function_name", "jit_compile_functions", "signature_name")
EXPERIMENTAL_FIELDS = ("function_alias", "concrete_function_name", "signature_name")
BATCH_SCALARS = (  # BatchOptions fields 1 to 6, in field-number order
    "num_batch_threads",
    "max_batch_size",
    "batch_timeout_micros",
    "allowed_batch_sizes",
    "max_enqueued_batches",
    "disable_large_batch_splitting",
)

# A text proto as nested fields: (name, scalar) or (name, [fields]) for a submessage.
Field = tuple[str, Any]

# TensorFlow's quantizer's defaults for tags and signature keys left unset
# (quantize_model.py _populate_quantization_options_default_values).
QUANTIZER_TAGS = ["serve"]
QUANTIZER_SIGNATURE_KEYS = ["serving_default"]


@dataclass(frozen=True)
class Spelling:
    """How a recipe writes its converter section (config/recipe.py Recipe.written_converter:
    its layers merged, dataset paths relative to `root`), and where the converter will read
    the text: relative dataset paths are written relative to `cwd` (as the converter reads
    them, and `tpubuild import` and `convert` take them), those in `absolute` (JSON paths of
    paths written absolute) as absolute paths."""

    converter: dict[str, Any]
    root: Path
    cwd: Path
    absolute: frozenset[tuple] = frozenset()

    def path(self, json_path: tuple, relative: str) -> str:
        absolute = os.path.normpath(os.path.join(self.root, relative))
        if json_path in self.absolute:
            return Path(absolute).as_posix()
        return Path(os.path.relpath(absolute, self.cwd)).as_posix()


def render(canonical: dict[str, Any], fmt: str = "textproto", *, source: str = "", path_prefix: str = "",
           spelling: Spelling | None = None) -> str:
    """The recipe's converter options in `fmt`; `source` names the recipe file in errors,
    `path_prefix` is prepended to (workspace-relative) dataset paths (where the converter sees
    the workspace), `spelling` writes the message the recipe writes (see above)."""
    converter = _without_extensions(canonical["converter"])
    if fmt == "json":
        return json.dumps(converter, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(converter, sort_keys=True, default_flow_style=False, allow_unicode=True)
    where = source or f"recipe {canonical['name']}"
    if fmt == "textproto":
        return format_fields(converter_fields(converter, where=where, path_prefix=path_prefix, spelling=spelling))
    if fmt == "textproto-v2":
        return format_fields(converter_fields_v2(converter, where=where, spelling=spelling))
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


class _Written:
    """What a recipe writes of one mapping of its converter section; `None`: everything
    (no Spelling: the canonical form is written as it is)."""

    def __init__(self, data: Any):
        self.data = data if data is None or isinstance(data, dict) else {}

    def has(self, key: str) -> bool:
        return self.data is None or key in self.data

    def get(self, key: str, canonical: Any) -> Any:
        """The value as written (its spelling) where written, else the canonical one."""
        return canonical if self.data is None or key not in self.data else self.data[key]

    def sub(self, key: str) -> "_Written":
        return _Written(None if self.data is None else self.data.get(key))

    def item(self, key: str, index: int) -> "_Written":
        if self.data is None:
            return self
        items = self.data.get(key)
        return _Written(items[index] if isinstance(items, list) and index < len(items) else {})

    def empty(self, key: str) -> bool:
        """Whether the recipe writes `key` as an empty mapping (`{}`): the empty message."""
        return self.data is not None and self.data.get(key) == {}


# Recipe keys under `converter:` that are tpubuild's own, not ConverterOptions fields.
EXTENSIONS = {"quantization_options": ("allow_unquantized",)}


def _without_extensions(converter: dict[str, Any]) -> dict[str, Any]:
    out = dict(converter)
    for section, keys in EXTENSIONS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def converter_fields(converter: dict[str, Any], *, where: str = "", path_prefix: str = "",
                     spelling: Spelling | None = None) -> list[Field]:
    """ConverterOptions as fields, proto3 defaults (0, false, "", empty) left out."""
    _refuse(where, [(f"converter.{path}", "the guide's ConverterOptions has no field for it; "
                     "render --format textproto-v2 (ConverterOptionsV2) holds it")
                    for path in _v2_only(converter)])
    written = _Written(None if spelling is None else spelling.converter)
    fields: list[Field] = [("tpu_functions", _tpu_function(entry)) for entry in converter["tpu_functions"]]
    fields += [("batch_options", _batch_options(entry, written.item("batch_options", index)))
               for index, entry in enumerate(converter["batch_options"])]
    fields += _enum("io_shape_optimization", converter["io_shape_optimization"])
    fields += _enum("bfloat16_optimization", converter["bfloat16_optimization"])
    fields += _true("disable_default_optimizations", converter["disable_default_optimizations"])
    bf16 = _bfloat16_options(converter["bfloat16_optimization_options"], written.sub("bfloat16_optimization_options"))
    if bf16 or written.empty("bfloat16_optimization_options"):
        fields.append(("bfloat16_optimization_options", bf16))
    if "xla_sharding_options" in converter:
        fields.append(("xla_sharding_options", _xla_sharding(converter["xla_sharding_options"],
                                                             written.sub("xla_sharding_options"))))
    if "quantization_options" in converter:
        quant = _quantization(converter["quantization_options"], where, path_prefix, spelling)
        fields.append(("external_feature_configs", [("quantization_options", quant)]))
    return fields


def converter_fields_v2(converter: dict[str, Any], *, where: str = "", spelling: Spelling | None = None) -> list[Field]:
    """ConverterOptionsV2 as fields, in field-number order, proto3 defaults left out."""
    if "quantization_options" in converter:
        _refuse(where, [("converter.quantization_options",
                         "ConverterOptionsV2 has no field for quantization; render --format textproto "
                         "(the guide's ConverterOptions, external_feature_configs) holds it")])
    written = _Written(None if spelling is None else spelling.converter)
    fields: list[Field] = []
    for entry in converter["tpu_functions"]:
        fields.append(("tpu_functions", _tpu_function(entry) + _true("enable_soft_device_placement",
                                                                      entry.get("enable_soft_device_placement", False))))
    fields += _true("enable_device_placement_safety_checks", converter.get("enable_device_placement_safety_checks", False))
    for index, entry in enumerate(converter["batch_options"]):
        batch = _batch_options({k: v for k, v in entry.items() if k != "experimental"}, written.item("batch_options", index))
        # V2's batch component sits at the top of BatchOptionsV2 (fields 11 to 13).
        batch += [(k, entry["experimental"][k]) for k in EXPERIMENTAL_FIELDS if k in entry.get("experimental", {})]
        fields.append(("batch_options", batch))
    fields += _enum("io_shape_optimization", converter["io_shape_optimization"])
    fields += _enum("bfloat16_optimization", converter["bfloat16_optimization"])
    fields += _true("disable_default_optimizations", converter["disable_default_optimizations"])
    options = converter["bfloat16_optimization_options"]
    bf16 = _bfloat16_options(options, written.sub("bfloat16_optimization_options"))
    if options["scope"] == "ALL":
        # What tpubuild's scope ALL does, in V2's words (V2's ALL alone would change the
        # signature to bfloat16 and keep the checkpoint float32).
        bf16 += [("preserve_signature", True), ("experimental", [("convert_checkpoint", True)])]
    if bf16 or written.empty("bfloat16_optimization_options"):
        fields.append(("bfloat16_optimization_options", bf16))
    if "xla_sharding_options" in converter:
        fields.append(("xla_sharding_options", _xla_sharding(converter["xla_sharding_options"],
                                                             written.sub("xla_sharding_options"))))
    if "experimental_options" in converter:
        pruning = converter["experimental_options"]["graph_pruning"]
        fields.append(("experimental_options", [("graph_pruning", Enum(pruning))]))
    return fields


def _v2_only(converter: dict[str, Any]) -> list[str]:
    """Where the canonical converter section uses what only ConverterOptionsV2 holds."""
    paths = [f"tpu_functions[{i}].enable_soft_device_placement"
             for i, entry in enumerate(converter["tpu_functions"]) if entry.get("enable_soft_device_placement")]
    paths += [key for key in ("enable_device_placement_safety_checks", "experimental_options") if key in converter]
    return paths


def _refuse(where: str, problems: list[tuple[str, str]]) -> None:
    if problems:
        raise ConfigError([Diagnostic(Location(where), path, message) for path, message in problems])


def _tpu_function(entry: dict[str, Any]) -> list[Field]:
    # Canonical entries hold exactly one of the oneof's fields.
    return [(key, entry[key]) for key in TPU_FUNCTION_FIELDS if key in entry]


def _batch_options(entry: dict[str, Any], written: _Written) -> list[Field]:
    fields: list[Field] = []
    for key in BATCH_SCALARS:
        value = entry.get(key)
        if not written.has(key):
            continue  # left to the converter's default, which is tpubuild's
        if isinstance(value, list):
            fields += [(key, item) for item in value]
        elif value:  # 0 and false are the proto3 defaults
            fields.append((key, value))
    experimental = entry.get("experimental")
    if experimental:
        fields.append(("experimental", [(k, experimental[k]) for k in EXPERIMENTAL_FIELDS if k in experimental]))
    return fields


def _bfloat16_options(options: dict[str, Any], written: _Written) -> list[Field]:
    # The converter's scope DEFAULT (0) means TPU, so TPU is written as the default (omitted),
    # unless the recipe spells it out.
    scope = str(written.get("scope", options["scope"])).upper()
    explicit = written.data is not None and "scope" in written.data and scope == "TPU"
    fields: list[Field] = [("scope", Enum(scope))] if explicit or scope not in ("TPU", "DEFAULT") else []
    fields += _true("skip_safety_checks", options["skip_safety_checks"])
    fields += [("filterlist", op) for op in written.get("filterlist", options["filterlist"])]
    return fields


def _xla_sharding(options: dict[str, Any], written: _Written) -> list[Field]:
    # In the canonical form always written: proto3's default is 0, the converter's is 1
    # (converter_options.proto); a recipe that leaves it out leaves it to that default.
    fields: list[Field] = _written_int("num_cores_per_replica", options["num_cores_per_replica"], written)
    fields += [("device_assignment", value) for value in options["device_assignment"]]
    if "topology" in options:
        fields.append(("topology", topology_bytes(**options["topology"])))
    return fields


def _written_int(name: str, value: int, written: _Written) -> list[Field]:
    return [(name, value)] if written.has(name) and value else []


def _quantization(options: dict[str, Any], where: str, path_prefix: str, spelling: Spelling | None) -> list[Field]:
    written = _Written(None if spelling is None else spelling.converter).sub("quantization_options")
    fields: list[Field] = []
    if written.has("method"):
        fields.append(("quantization_method", [("preset_method", Enum(PRESET_METHODS[options["method"]]))]))
    if written.has("op_set"):
        fields.append(("op_set", Enum(options["op_set"])))
    # Unwritten tags are the model's (canonical form); the quantizer's own default is `serve`.
    if written.has("tags") or options["tags"] != QUANTIZER_TAGS:
        fields += [("tags", tag) for tag in options["tags"]]
    if written.has("signature_keys") or options["signature_keys"] != QUANTIZER_SIGNATURE_KEYS:
        fields += [("signature_keys", key) for key in options["signature_keys"]]
    for index, spec in enumerate(options.get("unit_wise_quantization_specs", [])):
        units = [("unit", [(k, unit[k]) for k in ("op_type", "node_name", "func_name") if k in unit])
                 for unit in spec["unit"]]
        method = [("quantization_method", [("preset_method", Enum(PRESET_METHODS[spec["method"]]))])] \
            if written.item("unit_wise_quantization_specs", index).has("method") else []
        fields.append(("unit_wise_quantization_specs", [*units, *method]))
    for key, source in sorted(options["representative_datasets"].items()):
        if "tfrecord_file_path" not in source:
            kind = "npz" if "npz" in source else "generator"
            json_path = f"converter.quantization_options.representative_datasets.{key}"
            raise ConfigError(
                [
                    Diagnostic(
                        Location(where),
                        json_path,
                        f"the converter reads only TFRecord datasets (tfrecord_file_path), not {kind}; "
                        "write one with tf.quantization.experimental.TfRecordRepresentativeDatasetSaver",
                    )
                ]
            )
        relative = source["tfrecord_file_path"]
        json_path_tuple = ("converter", "quantization_options", "representative_datasets", key, "tfrecord_file_path")
        path = spelling.path(json_path_tuple, relative) if spelling and not path_prefix else _join(path_prefix, relative)
        fields.append(("representative_datasets", [("key", key), ("value", [("tfrecord_file_path", path)])]))
    return fields


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    return prefix.rstrip("/") + "/" + path


def _enum(name: str, value: str) -> list[Field]:
    return [] if value == "DEFAULT" else [(name, Enum(value))]


def _true(name: str, value: bool) -> list[Field]:
    return [(name, True)] if value else []


class Enum(str):
    """An enum value: written by name, without quotes."""


def format_fields(fields: list[Field], indent: int = 0) -> str:
    return "".join(_lines(fields, indent))


def _lines(fields: list[Field], indent: int) -> Iterator[str]:
    pad = " " * indent
    for name, value in fields:
        if isinstance(value, list):
            yield f"{pad}{name} {{\n"
            yield from _lines(value, indent + 2)
            yield f"{pad}}}\n"
        else:
            yield f"{pad}{name}: {_scalar(value)}\n"


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # protobuf's own escaping (pure Python, no TensorFlow): bytes fully escaped, text
    # kept as UTF-8, exactly as MessageToString(..., as_utf8=True) writes them.
    from google.protobuf.text_encoding import CEscape

    return f'"{CEscape(value, as_utf8=not isinstance(value, bytes))}"'


def topology_bytes(mesh_shape: list[int], device_coordinates: list[int]) -> bytes:
    """A serialized tensorflow.tpu.TopologyProto for one task holding every device.

    Protobuf wire format, as `TopologyProto.SerializeToString()` writes it: fields in
    number order, repeated int32 packed, zeros omitted.
    """
    devices, remainder = divmod(len(device_coordinates), len(mesh_shape))
    if remainder:
        raise ValueError(f"{len(device_coordinates)} device coordinates do not split into {len(mesh_shape)}-tuples")
    out = bytearray()
    out += _packed(1, mesh_shape)
    out += _varint_field(2, 1)  # num_tasks
    out += _varint_field(3, devices)  # num_tpu_devices_per_task
    out += _packed(4, device_coordinates)
    return bytes(out)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32 negatives are sign-extended to 10 bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _packed(number: int, values: list[int]) -> bytes:
    if not values:
        return b""
    payload = b"".join(_varint(v) for v in values)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload
