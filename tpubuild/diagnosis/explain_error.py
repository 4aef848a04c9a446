"""`tpubuild explain-error`: which ops of a lossy stage (bfloat16, quantize) make the
artifact differ from its source, and the recipe change that brings it within tolerance.

bfloat16: the stage's input and its cached output are compared node by node on the
verification samples (diagnosis/node_errors.py). The op types where the error starts are
added to `bfloat16_optimization_options.filterlist` one round at a time, the bfloat16
stage's own `run` converts the stage's input again with that filterlist, and the result is
compared with the source as `verify` compares it, until it is within tolerance.

quantize: TF's quantizer renames every layer it replaces, so node names cannot match the
two models. TF's own quantization debugger does the matching instead
(`QuantizationOptions.debugger_config`, DEBUGGER_TYPE_INT_PER_LAYER,
tensorflow/compiler/mlir/quantization/stablehlo/quantization_config.proto): each quantized
layer runs beside its float original on the same float input, and both outputs are dumped
with the layer's unit (node name, function). The layers with the largest error are kept in
float with `quantization_options.unit_wise_quantization_specs` (METHOD_NO_QUANTIZE, TF's
option for it), 1, 2, 4 then 8 of them, each time quantized by the stage's own `run` and
verified, until the model is within tolerance.

The error is measured on the stage's own output: the stages after it reshape, wrap and
place, they do not round.

Everything is written under a scratch directory; nothing in the cache or `out/` changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpubuild.diagnosis.node_errors import (
    NodeError,
    accumulate,
    compare_nodes,
    contribution,
    first_out_of_tolerance,
)

MAX_ROUNDS = 4  # filterlist rounds before giving up (each converts and verifies once)
SHOWN_LAYERS = 5  # the int8 layers listed, worst first


@dataclass
class Attempt:
    """A recipe change tried (the filterlist, or the layers kept in float), and what
    verification measures with it."""

    entries: list[str]
    max_rel_error: float
    worst_output: str
    passed: bool


@dataclass
class Explanation:
    stage: str
    tolerance: tuple[float, float]  # rtol, atol
    samples: dict[str, int]
    output_error: Attempt  # the cached stage output against the source
    first: dict[str, list[NodeError]] = field(default_factory=dict)  # signature -> where the error starts
    contributions: dict[str, float] = field(default_factory=dict)  # tensor -> relative error added
    attempts: list[Attempt] = field(default_factory=list)
    compared: int = 0  # tensors compared in all
    # Signature -> every compared tensor in graph order (bfloat16), or "" -> every int8
    # layer (quantize): the op-level drift `report --html` draws (commands/explain_error.py).
    drift: dict[str, list[NodeError]] = field(default_factory=dict)
    note: str = ""
    ranking: str = ""  # what `first` lists

    @property
    def proposal(self) -> Attempt | None:
        return next((a for a in self.attempts if a.passed), None)

    def change(self, attempt: Attempt) -> str:
        """The recipe change an attempt stands for, as YAML under `converter:`."""
        if self.stage == "bfloat16":
            return f"bfloat16_optimization_options.filterlist: [{', '.join(attempt.entries)}]"
        units = ", ".join(f"{{unit: [{{node_name: '{re.escape(name)}'}}], method: NO_QUANTIZE}}" for name in attempt.entries)
        return f"quantization_options.unit_wise_quantization_specs: [{units}]"


def verify_against_source(source: Path, candidate: Path, tags: list[str], samples: dict[str, list[Any]],
            rtol: float, atol: float, entries: list[str]) -> Attempt:
    """Verification's comparison (verify/compare.py) of `candidate` with the source."""
    from tpubuild.verify.compare import compare_models

    errors = compare_models(source, candidate, tags, samples, rtol, atol)
    worst = max(errors, key=lambda e: e.max_rel_error)
    return Attempt(list(entries), worst.max_rel_error, f"{worst.signature}/{worst.output}",
                   all(e.passed for e in errors))


def locate(reference: Path, candidate: Path, tags: list[str], samples: dict[str, list[Any]],
           rtol: float, atol: float
           ) -> tuple[dict[str, list[NodeError]], dict[str, float], int, dict[str, list[NodeError]]]:
    """Per signature, the first tensors out of tolerance and what each adds; tensors
    compared; and per signature every compared tensor, in graph order."""
    first, added, compared, every = {}, {}, 0, {}
    for key, key_samples in sorted(samples.items()):
        errors = compare_nodes(reference, candidate, tags, key, key_samples)
        compared += len(errors)
        every[key] = sorted(errors, key=lambda e: e.order)
        first[key] = first_out_of_tolerance(errors, rtol, atol)
        for error in first[key]:
            added[error.tensor] = contribution(error, errors)
    return first, added, compared, every


def explain_bfloat16(stage_input: Path, stage_output: Path, source: Path, options: dict[str, Any],
                     samples: dict[str, list[Any]], rtol: float, atol: float, tpu_placed: bool,
                     scratch: Path) -> Explanation:
    """Where the bfloat16 stage's error starts, and the filterlist that brings its output
    within the verify tolerance (`options` are the bfloat16 stage's)."""
    tags = options["tags"]
    reference = _runnable(stage_input, scratch / "reference", tags, tpu_placed)
    candidate = _runnable(stage_output, scratch / "candidate", tags, tpu_placed)
    filterlist = list(options["bfloat16_optimization_options"].get("filterlist", []))
    result = Explanation("bfloat16", (rtol, atol), {k: len(s) for k, s in samples.items()},
                         verify_against_source(source, candidate, tags, samples, rtol, atol, sorted(filterlist)),
                         ranking="where the error starts (first ops out of tolerance")
    result.first, result.contributions, result.compared, result.drift = locate(reference, candidate, tags, samples,
                                                                               rtol, atol)
    if result.output_error.passed:
        result.note = "the bfloat16 stage's output is within tolerance: nothing to filter"
        return result
    first = result.first
    for round_number in range(1, MAX_ROUNDS + 1):
        wanted = sorted({e.op for errors in first.values() for e in errors if e.dtype == "bfloat16"} - set(filterlist))
        if not wanted:
            # Filterlisted ops still read their variables as bfloat16 stores them (the
            # converter keeps every variable of the TPU scope in bfloat16, filterlist or not).
            result.note = ("no op that computes in bfloat16 starts the error: it comes from the variables stored in "
                           "bfloat16, from ops kept in float32 or from the stages around bfloat16; loosen verify's "
                           "rtol/atol for bfloat16, or set bfloat16_optimization: DISABLED")
            break
        filterlist = filterlist + wanted
        converted = _convert(stage_input, scratch / f"round{round_number}", options, filterlist)
        candidate = _runnable(converted, scratch / f"round{round_number}-run", tags, tpu_placed)
        attempt = verify_against_source(source, candidate, tags, samples, rtol, atol, sorted(filterlist))
        result.attempts.append(attempt)
        if attempt.passed:
            break
        first, _, _, _ = locate(reference, candidate, tags, samples, rtol, atol)
    else:
        result.note = f"still out of tolerance after {MAX_ROUNDS} rounds"
    return result


def _convert(stage_input: Path, where: Path, options: dict[str, Any], filterlist: list[str]) -> Path:
    """The bfloat16 stage's own `run` on its input, with another filterlist."""
    from tpubuild.stages import bfloat16 as stage
    from tpubuild.stages.base import StageContext

    settings = {**options["bfloat16_optimization_options"], "filterlist": sorted(filterlist)}
    where.mkdir(parents=True)
    stage.run(stage_input, where, {**options, "bfloat16_optimization_options": settings}, StageContext(where))
    return where


def _runnable(model: Path, where: Path, tags: list[str], tpu_placed: bool) -> Path:
    """The model, or its CPU twin when it holds TPU calls (verify runs the same)."""
    if not tpu_placed:
        return model
    from tpubuild.tpu.twin import make_cpu_twin

    where.mkdir(parents=True)
    make_cpu_twin(model, where, tags)
    return where


def explain_quantize(stage_input: Path, source: Path, options: dict[str, Any], context: Any,
                     samples: dict[str, list[Any]], rtol: float, atol: float, stage_output: Path,
                     scratch: Path) -> Explanation:
    """Each int8 layer's own error (TF's quantization debugger) and the layers to keep in
    float (`unit_wise_quantization_specs`) that bring the quantize stage's output within the
    verify tolerance (`options` are the quantize stage's)."""
    tags = options["tags"]
    given = list(options.get("unit_wise_quantization_specs", []))
    result = Explanation("quantize", (rtol, atol), {k: len(s) for k, s in samples.items()},
                         verify_against_source(source, stage_output, tags, samples, rtol, atol, []),
                         ranking="the int8 layers by their own error (each fed its float input")
    layers = layer_errors(stage_input, options, context, samples, scratch / "debugger")
    result.compared = len(layers)
    result.first = {"": layers[:SHOWN_LAYERS]}
    result.drift = {"": layers}
    result.contributions = {e.tensor: e.max_rel_error for e in layers}
    if result.output_error.passed:
        result.note = "the quantize stage's output is within tolerance: nothing to keep in float"
        return result
    if not layers:
        result.note = f"TF's quantization debugger reported no int8 layer for method {options['method']}"
        return result
    for round_number, count in enumerate((1, 2, 4, 8), start=1):
        chosen = [e.node for e in layers[:count]]
        specs = given + [{"unit": [{"node_name": re.escape(name)}], "method": "NO_QUANTIZE"} for name in chosen]
        where = scratch / f"round{round_number}"
        where.mkdir(parents=True)
        from tpubuild.stages import quantize as stage

        stage.run(stage_input, where, {**options, "unit_wise_quantization_specs": specs}, context)
        attempt = verify_against_source(source, where, tags, samples, rtol, atol, chosen)
        result.attempts.append(attempt)
        if attempt.passed or count >= len(layers):
            break
    if result.proposal is None:
        result.note = "still out of tolerance with the 8 worst layers in float: the error is spread over many layers"
    return result


def layer_errors(stage_input: Path, options: dict[str, Any], context: Any, samples: dict[str, list[Any]],
                 scratch: Path) -> list[NodeError]:
    """Every quantized layer's error against its float original, each fed the same float
    input, as TF's quantization debugger (DEBUGGER_TYPE_INT_PER_LAYER) dumps them; worst first."""
    import tensorflow as tf
    from tensorflow.compiler.mlir.quantization.stablehlo import quantization_config_pb2
    from tensorflow.compiler.mlir.quantization.tensorflow import (
        quantization_options_pb2,
    )

    from tpubuild.quantize import datasets
    from tpubuild.quantize import tf_quantizer as quantization
    from tpubuild.savedmodel.model import readable_copy

    tags = options["tags"]
    keys = [k for k in options["signature_keys"] if k in samples]
    paths = datasets.dataset_paths(options, context) if options["method"] == "STATIC_RANGE" else {}
    quant_options = quantization.build_options(options["method"], tags, keys, options["op_set"], paths,
                                               options.get("unit_wise_quantization_specs"))
    dumps = scratch / "dumps"
    quant_options.debugger_config.debugger_type = quantization_config_pb2.DebuggerConfig.DEBUGGER_TYPE_INT_PER_LAYER
    quant_options.debugger_config.log_dir_path = str(dumps)
    scratch.mkdir(parents=True)
    readable = readable_copy(stage_input, tags, scratch / "readable")
    quantization.run_quantizer(readable, scratch / "debug-model", quant_options)
    # A v1 session, closed before reading: the DumpTensor kernels write when they are destroyed.
    with tf.compat.v1.Session(graph=tf.Graph()) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, tags, str(scratch / "debug-model"))
        for key in keys:
            signature = meta.signature_def[key]
            fetches = {name: info.name for name, info in signature.outputs.items()}
            for sample in samples[key]:
                session.run(fetches, {signature.inputs[name].name: value for name, value in sample.items()})
    errors = []
    for layer in sorted(dumps.iterdir()) if dumps.is_dir() else []:
        unit = quantization_options_pb2.UnitWiseQuantizationSpec.QuantizationUnit()
        unit.ParseFromString((layer / "quant_unit.pb").read_bytes())
        error = NodeError(unit.node_name, layer.name, "int8", 0)
        for ref, got in zip(_dumped(layer / "unquantized_tensor_data.pb"), _dumped(layer / "quantized_tensor_data.pb")):
            accumulate(error, ref, got)
        errors.append(error)
    errors.sort(key=lambda e: (-e.max_rel_error, e.node))
    for rank, error in enumerate(errors):
        error.order = rank
    return errors


def _dumped(path: Path) -> list[Any]:
    """The tensors a DumpTensor op wrote: a ZLIB TFRecord of TensorProtos, one per call."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    tensors = []
    for record in tf.data.TFRecordDataset(str(path), compression_type="ZLIB").as_numpy_iterator():
        proto = tensor_pb2.TensorProto()
        proto.ParseFromString(record)
        tensors.append(tf.make_ndarray(proto))
    return tensors
