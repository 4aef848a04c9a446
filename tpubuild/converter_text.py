"""A converter text proto (the converter's --converter_options_string, or a file of it)
read into a recipe's `converter:` section, in either dialect.

The guide's `ConverterOptions` (schemas/converter_options.proto) and today's
`ConverterOptionsV2` (schemas/converter_options_v2.proto) are told apart by what their
fields mean: the text is parsed as both, and when only one reads it, that one is its
dialect; when both do and tpubuild reads the same options from each (fields they share
mean the same in both), it is taken as the guide's; when both do and the two readings
differ (V2's `scope: ALL` alone keeps neither the signature nor tpubuild's bfloat16
variables), the text is ambiguous and `--dialect v1|v2` says which it is. Every field
set in the message is either carried into the recipe or refused with one line naming it
and why; a field this module has no rule for is refused too, and so is what protobuf's
parser would drop without a word (a second map entry with the same key, a field of a
TopologyProto tpubuild does not read), so none is ever dropped silently.
TensorFlow-free: protobuf's text parser on our messages.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tpubuild.converter_protos import GUIDE, MESSAGES, TOPOLOGY, V2, message_class, short_names
from tpubuild.errors import ConfigError, Diagnostic, Location, UsageError

# `--dialect` -> the dialect it names.
DIALECTS = {"v1": GUIDE, "v2": V2}
# A converter text proto is a few kilobytes; a file is read up to this much, never more
# (`tpubuild import /dev/zero`). Above the recipe's own bound (config/yamlload.py
# MAX_DOCUMENT_BYTES), so a text too big for a recipe is told so by import, not cut here.
MAX_TEXT_BYTES = 4 << 20
# How much of an input line or value an error message quotes.
QUOTED_LINE = 80
QUOTED_WORD = 60
# Fields of TensorFlow's tensorflow.tpu.TopologyProto (tensorflow/core/protobuf/tpu/
# topology.proto) beyond the four schemas/converter_options.proto restates, by number.
TOPOLOGY_FIELDS = {5: "tpu_hardware_feature"}

# TensorFlow's QuantizationMethod.PresetMethod values -> tpubuild's method names
# (the reverse of render.PRESET_METHODS).
METHODS = {
    "METHOD_STATIC_RANGE_INT8": "STATIC_RANGE",
    "METHOD_DYNAMIC_RANGE_INT8": "DYNAMIC_RANGE",
    "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8": "WEIGHT_ONLY",
    "METHOD_NO_QUANTIZE": "NO_QUANTIZE",
}
GPU_ONLY = "GPU only (tpubuild converts for the TPU)"
# Why tpubuild refuses a field, by "Message.field" (Google's message names).
REFUSED = {
    "ConverterOptionsV2.enable_shared_replicate_cluster_name":
        "one TPU cluster name for every TPU function is for Pathways models; tpubuild gives each "
        "TPU function its own cluster",
    "ConverterOptionsV2.xla_io_optimization": f"packs inputs of XLA GPU functions: {GPU_ONLY}",
    "ConverterOptionsV2.xla_io_optimization_options": f"packs inputs of XLA GPU functions: {GPU_ONLY}",
    "ConverterOptionsV2.non_xla_device_placement_options": f"placement beside XLA GPU functions: {GPU_ONLY}",
    "XlaFunctionSpec.device_name": f"names the GPU of a GPU function: {GPU_ONLY}",
    "XlaFunctionSpec.device_execution_type": f"single or multiple device execution of XLA GPU functions: {GPU_ONLY}",
    "BatchOptionsV2.low_priority_batch_options":
        "priority queue batching: tpubuild's batch stage does not set BatchFunction's low-priority attributes",
    "BFloat16OptimizationOptions.enable_cast_outside":
        "tpubuild casts inside the function (after its arguments, before its results), not around the call",
    "XlaShardingOptions.sharding_specs": "tpubuild does not annotate variables with shardings",
    "XlaShardingOptions.function_sharding_specs": "tpubuild does not annotate function arguments with shardings",
    "XlaShardingOptions.experimental": "policy-based sharding: tpubuild does not annotate variables with shardings",
    "XlaShardingOptions.use_shardy_partitioner": "tpubuild leaves the choice of partitioner to the TPU runtime",
}


@dataclass
class Imported:
    dialect: str  # GUIDE or V2
    converter: dict[str, Any]  # the recipe's `converter:` section, only what the text sets
    message: Any = None  # the text parsed as `dialect`'s message: what the recipe must render back to


def read_text_file(path: Path | str, origin: str) -> str:
    """The text of the file `path` (named `origin` in errors), read up to MAX_TEXT_BYTES:
    UsageError when it cannot be read or is larger, ConfigError at FILE:L:C when it is not
    UTF-8."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{origin}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise UsageError(f"{origin}: larger than {MAX_TEXT_BYTES >> 20} MiB, not read (a converter text proto is a "
                         "few kilobytes)")
    return decode_text(data, origin)


def decode_text(data: bytes | str, origin: str) -> str:
    """`data` as text; bytes that are not UTF-8 are one ConfigError at their line and
    column (in characters, as protobuf's parser counts them). A str is a command-line
    argument, whose undecodable bytes Python kept as surrogates (os.fsencode gives them back)."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return data
        except UnicodeEncodeError:
            data = os.fsencode(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line_start = before.rfind(b"\n") + 1
        line = before.count(b"\n") + 1
        column = len(before[line_start:].decode("utf-8", errors="replace")) + 1
        message = f"not UTF-8 text: byte 0x{data[exc.start]:02x} here; a text proto is UTF-8"
        raise ConfigError([Diagnostic(Location(origin, line, column), "", message)]) from None


def read_text_proto(text: str, origin: str, dialect: str | None = None) -> Imported:
    """`text` in whichever dialect reads it (or in `dialect`, GUIDE or V2, when given);
    `origin` names it in errors (a file, or `--converter_options_string`). Raises
    ConfigError: a parse error at its line and column, a text both dialects read with
    different meanings, or every refused field, one line each."""
    parsed: dict[str, Any] = {}
    failures: list[tuple[int, int, str, str]] = []
    for name in (dialect,) if dialect else (GUIDE, V2):
        message = message_class(MESSAGES[name])()
        try:
            _parse(text, message)
        except _TextError as exc:
            failures.append((exc.line, exc.column, name, exc.detail))
            continue
        parsed[name] = message
    if not parsed:
        # The dialect that read further; at the same place, the guide's (the older spelling).
        line, column, name, detail = max(failures, key=lambda f: (f[0], f[1], f[2] == GUIDE))
        if len(failures) == 2 and failures[0][:2] != failures[1][:2]:
            other = V2 if name == GUIDE else GUIDE
            detail += f" (reading it as {name}; as {other} it fails earlier)"
        raise ConfigError([Diagnostic(Location(origin, line, column), "", detail)])
    readings = {name: _read(name, message, origin) for name, message in parsed.items()}
    if len(readings) == 2 and readings[GUIDE] != readings[V2]:
        raise ConfigError([Diagnostic(Location(origin), "", _ambiguity(readings))])
    chosen = GUIDE if GUIDE in readings else V2
    converter, problems = readings[chosen]
    if problems:
        raise ConfigError(problems)
    return Imported(chosen, converter, parsed[chosen])


def _read(dialect: str, message: Any, origin: str) -> tuple[dict[str, Any], list[Diagnostic]]:
    """What tpubuild reads from `message`: (the converter section, the fields it refuses)."""
    reader = _Reader(origin)
    converter = (reader.guide if dialect == GUIDE else reader.v2)(message)
    return converter, sorted(reader.problems)


def _ambiguity(readings: dict[str, tuple[dict[str, Any], list[Diagnostic]]]) -> str:
    """Why a text both dialects parse means different things in each, in words."""
    def said(dialect: str) -> str:
        converter, problems = readings[dialect]
        if problems:
            first = problems[0]
            return f"as {dialect}, {first.json_path}: {first.message}" if first.json_path else f"as {dialect}, {first.message}"
        if readings[_other(dialect)][1]:
            return f"as {dialect}, accepted"
        return f"as {dialect}, {_first_difference(converter, readings[_other(dialect)][0])}"

    first = V2 if readings[V2][1] or not readings[GUIDE][1] else GUIDE
    return (f"valid as both {GUIDE} and {V2}, which mean different things here ({said(first)}; "
            f"{said(_other(first))}): say which it is with --dialect v1 ({GUIDE}, the guide's) or --dialect v2 ({V2})")


def _other(dialect: str) -> str:
    return V2 if dialect == GUIDE else GUIDE


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """The first place where two converter sections differ, as `path: value`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    return f"{path or 'converter'}: {a!r}"


class _TextError(Exception):
    def __init__(self, line: int, column: int, detail: str):
        super().__init__(detail)
        self.line, self.column, self.detail = line, column, detail


def parse_message(text: str, message: Any) -> None:
    """protobuf's text_format.Parse of `text` into `message`, with this module's two
    refusals (_parser); text_format.ParseError as protobuf raises it."""
    _parser().ParseLines(text.split("\n"), message)


def _parse(text: str, message: Any) -> None:
    from google.protobuf import text_format

    try:
        parse_message(text, message)
    except text_format.ParseError as exc:
        line, column = exc.GetLine() or 1, exc.GetColumn() or 1
        # str(exc) is "LINE:COL : detail"; the position is reported by Location.
        detail = re.sub(r"^\d+:\d+ : ", "", str(exc)).rstrip(".")
        raise _TextError(line, column, short_names(_cut(detail, text, line, column))) from None


def _cut(detail: str, text: str, line: int, column: int) -> str:
    """`detail` with the input line protobuf quotes ("'LINE': ...") cut to the part around
    `column`, and any long word in the rest shortened: a one-line file of megabytes must
    not come back whole in an error message."""
    quote = ""
    lines = text.split("\n")
    if 0 < line <= len(lines) and detail.startswith(f"'{lines[line - 1]}': "):
        source = lines[line - 1]
        detail = detail[len(source) + 4:]
        start = max(0, column - 1 - QUOTED_LINE // 2) if len(source) > QUOTED_LINE else 0
        end = min(len(source), start + QUOTED_LINE)
        quote = "'" + ("..." if start else "") + source[start:end] + ("..." if end < len(source) else "") + "': "
    return quote + re.sub(r"\S{%d,}" % (QUOTED_WORD + 1),
                          lambda m: f"{m.group(0)[:QUOTED_WORD]}... ({len(m.group(0))} characters)", detail)


def _is_map(field: Any) -> bool:
    kind = field.message_type
    return kind is not None and kind.has_options and kind.GetOptions().map_entry


def _parser() -> Any:
    """protobuf's text parser, refusing two things it would otherwise let through: an
    enum number outside int32, which upb's setattr meets as a ValueError with no line
    (a traceback), and a second entry of a map with a key it already has, which would
    replace the first without a word."""
    from google.protobuf import text_format

    class Parser(text_format._Parser):  # type: ignore[name-defined,misc]  # its parse steps are its own
        def _MergeScalarField(self, tokenizer: Any, message: Any, field: Any) -> None:
            try:
                super()._MergeScalarField(tokenizer, message, field)
            except text_format.ParseError:
                raise
            except ValueError as exc:
                raise tokenizer.ParseErrorPreviousToken(f"{exc} (an enum's values are int32)") from None

        def _MergeMessageField(self, tokenizer: Any, message: Any, field: Any) -> None:
            if not (field.is_repeated and _is_map(field)):
                super()._MergeMessageField(tokenizer, message, field)
                return
            scratch = type(message)()  # the entry alone, to see its key before it replaces one
            super()._MergeMessageField(tokenizer, scratch, field)
            entries, (key,) = getattr(message, field.name), list(getattr(scratch, field.name))
            if key in entries:
                raise tokenizer.ParseErrorPreviousToken(
                    f'a second "{field.name}" entry with the key {key!r}: the first would be dropped; give each key '
                    "once")
            value = getattr(scratch, field.name)[key]
            if field.message_type.fields_by_name["value"].message_type is not None:
                entries[key].CopyFrom(value)
            else:
                entries[key] = value

    return Parser()


class _Reader:
    """One message's fields -> the recipe's spelling; each field handled or refused."""

    def __init__(self, origin: str):
        self.origin = origin
        self.problems: list[Diagnostic] = []

    def refuse(self, path: str, why: str) -> None:
        self.problems.append(Diagnostic(Location(self.origin), path, f"refused: {why}"))

    def take(self, message: Any, path: str, rules: dict[str, Callable[[Any, str], None]]) -> None:
        """Run the rule of each field set in `message`; a field without one is refused."""
        type_name = short_names(message.DESCRIPTOR.full_name)
        for field, value in message.ListFields():
            where = f"{path}.{field.name}" if path else field.name
            rule = rules.get(field.name)
            if rule is not None:
                rule(value, where)
            else:
                key = f"{type_name}.{field.name}"
                self.refuse(where, REFUSED.get(key, f"tpubuild has no equivalent of {key}"))

    # -- the guide's ConverterOptions -------------------------------------------------------

    def guide(self, message: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.take(message, "", {
            **self._shared(out, batch=self._guide_batch),
            "external_feature_configs": lambda v, p: self.take(v, p, {
                "quantization_options": lambda q, qp: out.__setitem__("quantization_options",
                                                                       self._quantization(q, qp)),
            }),
        })
        return out

    def _guide_batch(self, entry: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.take(entry, path, {
            **self._batch_scalars(out),
            "experimental": lambda v, p: out.__setitem__("experimental", self._oneof(v, p, "batch_component")),
        })
        return out

    def _quantization(self, message: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}

        def method(value: Any, where: str) -> None:
            self.take(value, where, {"preset_method": lambda v, p: self._method(out, "method", value, p)})

        def datasets(value: Any, where: str) -> None:
            out["representative_datasets"] = {}
            for key in sorted(value):
                source = self._oneof(value[key], f"{where}[{key}]", "dataset_file")
                out["representative_datasets"][key] = source

        def specs(value: Any, where: str) -> None:
            out["unit_wise_quantization_specs"] = []
            for index, spec in enumerate(value):
                item: dict[str, Any] = {}
                self.take(spec, f"{where}[{index}]", {
                    "unit": lambda units, p: item.__setitem__(
                        "unit", [{f.name: v for f, v in unit.ListFields()} for unit in units]),
                    "quantization_method": lambda m, p: self.take(m, p, {
                        "preset_method": lambda v, pp: self._method(item, "method", m, pp)}),
                })
                out["unit_wise_quantization_specs"].append(item)

        self.take(message, path, {
            "quantization_method": method,
            "op_set": lambda v, p: out.__setitem__("op_set", _enum_name(message, "op_set", v)),
            "tags": lambda v, p: out.__setitem__("tags", list(v)),
            "signature_keys": lambda v, p: out.__setitem__("signature_keys", list(v)),
            "representative_datasets": datasets,
            "unit_wise_quantization_specs": specs,
        })
        return out

    def _method(self, out: dict[str, Any], key: str, holder: Any, path: str) -> None:
        name = _enum_name(holder, "preset_method", holder.preset_method)
        if name in METHODS:
            out[key] = METHODS[name]
        else:
            self.refuse(path, f"{name} has no tpubuild method")

    # -- today's ConverterOptionsV2 -------------------------------------------------------

    def v2(self, message: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.take(message, "", {
            **self._shared(out, batch=self._v2_batch),
            "xla_functions": lambda v, p: self._xla_functions(out, v, p),
            "enable_device_placement_safety_checks":
                lambda v, p: out.__setitem__("enable_device_placement_safety_checks", True),
            "experimental_options": lambda v, p: self.take(v, p, {
                "graph_pruning": lambda s, sp: self._graph_pruning(out, v, s, sp)}),
        })
        if out.get("batch_options") and len(out["batch_options"]) > 1:
            self.refuse("batch_options[1]", "tpubuild batches one component: give one batch_options entry")
        return out

    def _v2_batch(self, entry: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        component = entry.WhichOneof("batch_component")
        rules = dict(self._batch_scalars(out))
        if component:
            # The recipe spells V2's top-level component as the guide did: `experimental`.
            rules[component] = lambda v, p: out.__setitem__("experimental", {component: v})
        self.take(entry, path, rules)
        return out

    def _xla_functions(self, out: dict[str, Any], specs: Any, path: str) -> None:
        for index, spec in enumerate(specs):
            where = f"{path}[{index}]"
            device = _enum_name(spec, "device_type", spec.device_type)
            if device == "GPU":
                self.refuse(f"{where}.device_type", f"GPU: {GPU_ONLY}")
                continue
            if device != "TPU":
                self.refuse(f"{where}.device_type", "a device type must be given (the converter refuses "
                            f"{device})")
                continue
            entry: dict[str, Any] = {}
            kind = spec.WhichOneof("function_spec")
            rules = {"device_type": lambda v, p: None,
                     "enable_soft_device_placement":
                         lambda v, p: entry.__setitem__("enable_soft_device_placement", True)}
            if kind:
                rules[kind] = lambda v, p: entry.__setitem__(kind, v)
            self.take(spec, where, rules)
            # A TPU XLA function is what a tpu_functions entry says (read as one).
            out.setdefault("tpu_functions", []).append(entry)

    def _graph_pruning(self, out: dict[str, Any], holder: Any, value: int, path: str) -> None:
        name = _enum_name(holder, "graph_pruning", value)
        if name == "DISABLED":
            out["experimental_options"] = {"graph_pruning": name}
        else:
            self.refuse(path, f"{name}: tpubuild keeps every function of the model (it has no pruning)")

    # -- what both dialects share -----------------------------------------------------------

    def _shared(self, out: dict[str, Any], batch: Callable[[Any, str], dict[str, Any]]) -> dict[str, Callable]:
        def tpu_functions(entries: Any, path: str) -> None:
            functions = out.setdefault("tpu_functions", [])
            for index, function in enumerate(entries):
                entry: dict[str, Any] = {}
                kind = function.WhichOneof("name")
                rules: dict[str, Callable] = {
                    "enable_soft_device_placement":
                        lambda v, p: entry.__setitem__("enable_soft_device_placement", True)}
                if kind:
                    rules[kind] = lambda v, p, kind=kind: entry.__setitem__(kind, v)
                self.take(function, f"{path}[{index}]", rules)
                functions.append(entry)

        def state(name: str) -> Callable[[Any, str], None]:
            return lambda v, p: out.__setitem__(name, _state_name(v))

        return {
            "tpu_functions": tpu_functions,
            "batch_options": lambda v, p: out.__setitem__(
                "batch_options", [batch(entry, f"{p}[{i}]") for i, entry in enumerate(v)]),
            "io_shape_optimization": state("io_shape_optimization"),
            "bfloat16_optimization": state("bfloat16_optimization"),
            "disable_default_optimizations": lambda v, p: out.__setitem__("disable_default_optimizations", True),
            "bfloat16_optimization_options": lambda v, p: out.__setitem__(
                "bfloat16_optimization_options", self._bfloat16(v, p)),
            "xla_sharding_options": lambda v, p: out.__setitem__("xla_sharding_options", self._sharding(v, p)),
        }

    def _batch_scalars(self, out: dict[str, Any]) -> dict[str, Callable]:
        names = ("num_batch_threads", "max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
                 "disable_large_batch_splitting")
        rules: dict[str, Callable] = {name: (lambda v, p, name=name: out.__setitem__(name, v)) for name in names}
        rules["allowed_batch_sizes"] = lambda v, p: out.__setitem__("allowed_batch_sizes", list(v))
        return rules

    def _bfloat16(self, message: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        v2 = message.DESCRIPTOR.full_name.startswith("tpubuild.converter.v2.")

        def scope(value: int, where: str) -> None:
            name = _enum_name(message, "scope", value)
            if name == "GPU":
                self.refuse(where, f"GPU: XLA GPU computation is {GPU_ONLY}")
            else:
                out["scope"] = name

        self.take(message, path, {
            "scope": scope,
            "skip_safety_checks": lambda v, p: out.__setitem__("skip_safety_checks", True),
            "filterlist": lambda v, p: out.__setitem__("filterlist", list(v)),
            "preserve_signature": lambda v, p: out.__setitem__("preserve_signature", True),
            "experimental": lambda v, p: self.take(v, p, {
                "convert_checkpoint": lambda c, cp: out.setdefault("experimental", {}).__setitem__(
                    "convert_checkpoint", True)}),
        })
        if v2 and out.get("scope") == "ALL":
            # V2's scope ALL alone turns the signature's float32 to bfloat16 and leaves the
            # checkpoint float32; tpubuild's rewrite keeps the signature and stores the variables
            # in bfloat16, which is what these two fields say.
            if "preserve_signature" not in out:
                self.refuse(f"{path}.preserve_signature",
                            "scope ALL without preserve_signature changes the signature to bfloat16, and tpubuild "
                            "always keeps the signature's types: set preserve_signature: true")
            if "convert_checkpoint" not in out.get("experimental", {}):
                self.refuse(f"{path}.experimental.convert_checkpoint",
                            "scope ALL without convert_checkpoint keeps the checkpoint float32, and tpubuild stores "
                            "the variables it converts in bfloat16: set experimental { convert_checkpoint: true }")
        return out

    def _sharding(self, message: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.take(message, path, {
            "num_cores_per_replica": lambda v, p: out.__setitem__("num_cores_per_replica", v),
            "device_assignment": lambda v, p: out.__setitem__("device_assignment", list(v)),
            "topology": lambda v, p: self._topology(out, v, p),
        })
        return out

    def _topology(self, out: dict[str, Any], data: bytes, path: str) -> None:
        from google.protobuf.message import DecodeError
        from google.protobuf.unknown_fields import UnknownFieldSet

        topology = message_class(TOPOLOGY)()
        try:
            topology.ParseFromString(data)
        except DecodeError:
            self.refuse(path, "not a serialized tensorflow.tpu.TopologyProto")
            return
        # Fields our restatement does not declare would be dropped on the way to the recipe.
        unknown = sorted({field.field_number for field in UnknownFieldSet(topology)})
        if unknown:
            names = ", ".join(f"{number} ({TOPOLOGY_FIELDS[number]})" if number in TOPOLOGY_FIELDS else str(number)
                              for number in unknown)
            self.refuse(path, f"TopologyProto field {names}: tpubuild reads only mesh_shape, num_tasks, "
                        "num_tpu_devices_per_task and device_coordinates (a recipe's topology holds no more)")
            return
        mesh, coordinates = list(topology.mesh_shape), list(topology.device_coordinates)
        devices, spare = divmod(len(coordinates), len(mesh)) if mesh else (0, 1)
        # render.topology_bytes writes one task holding every device; anything else would not
        # come back the same.
        if topology.num_tasks != 1 or topology.num_tpu_devices_per_task != devices or spare:
            self.refuse(path, f"a topology of {topology.num_tasks} task(s) with {topology.num_tpu_devices_per_task} "
                        f"device(s) each and {len(coordinates)} coordinates of a {len(mesh)}-dimensional mesh: "
                        "tpubuild writes topologies of one task holding every device")
            return
        if topology.SerializeToString(deterministic=True) != data:
            # The recipe keeps the topology, not its bytes: render would write other bytes.
            self.refuse(path, "not encoded as TopologyProto.SerializeToString() encodes it (fields in number order, "
                        "repeated fields packed, zeros left out): re-serialize it so the recipe renders the same bytes")
            return
        out["topology"] = {"mesh_shape": mesh, "device_coordinates": coordinates}

    def _oneof(self, message: Any, path: str, oneof: str) -> dict[str, Any]:
        kind = message.WhichOneof(oneof)
        out: dict[str, Any] = {}
        self.take(message, path, {kind: lambda v, p: out.__setitem__(kind, v)} if kind else {})
        return out


def rebase_datasets(converter: dict[str, Any], old: Path, new: Path) -> dict[str, Any]:
    """`converter` with each relative tfrecord_file_path (relative to `old`, where the text's
    reader stands: the converter reads them from its working directory) made relative to `new`."""
    import os

    quant = converter.get("quantization_options")
    if not quant or not quant.get("representative_datasets"):
        return converter
    datasets = {}
    for key, source in quant["representative_datasets"].items():
        path = source.get("tfrecord_file_path")
        if path and not os.path.isabs(path):
            source = {**source, "tfrecord_file_path": Path(os.path.relpath(old / path, new)).as_posix()}
        datasets[key] = source
    return {**converter, "quantization_options": {**quant, "representative_datasets": datasets}}


def _enum_name(message: Any, field: str, value: int) -> str:
    enum = message.DESCRIPTOR.fields_by_name[field].enum_type
    number = enum.values_by_number.get(value)
    return number.name if number is not None else str(value)


STATES = ("DEFAULT", "ENABLED", "DISABLED")


def _state_name(value: int) -> str:
    return STATES[value] if 0 <= value < len(STATES) else str(value)
