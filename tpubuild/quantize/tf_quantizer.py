"""TF's own post-training quantizer (`tf.quantization.experimental.quantize_saved_model`).

The quantizer prints its summary ("Number of quantized layers ...") from C++ straight to
file descriptor 2, so we redirect that descriptor while it runs and parse what it wrote.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.compiler.mlir.quantization.tensorflow import (
    quantization_options_pb2 as qpb,
)

from tpubuild.quiet import captured_stderr
from tpubuild.savedmodel.reproducible import make_reproducible

METHODS = {
    "STATIC_RANGE": "METHOD_STATIC_RANGE_INT8",
    "DYNAMIC_RANGE": "METHOD_DYNAMIC_RANGE_INT8",
    "WEIGHT_ONLY": "METHOD_STATIC_RANGE_WEIGHT_ONLY_INT8",
    "NO_QUANTIZE": "METHOD_NO_QUANTIZE",  # unit-wise specs only: the layers they name stay float
}
OP_SETS = {"XLA": qpb.XLA, "TF": qpb.TF, "UNIFORM_QUANTIZED": qpb.UNIFORM_QUANTIZED, "STABLEHLO": qpb.STABLEHLO}
SUMMARY_START = "-------- Quantization Summary --------"


class QuantizerFailed(Exception):
    """The quantizer raised; `line` is its first meaningful line, `log` what it printed."""

    def __init__(self, line: str, log: str):
        super().__init__(line)
        self.line, self.log = line, log


def build_options(
    method: str, tags: list[str], signature_keys: list[str], op_set: str, datasets: dict[str, Path],
    unit_specs: list[dict[str, Any]] | None = None,
) -> Any:
    """QuantizationOptions for one of tpubuild's method names; datasets are TFRecord paths;
    `unit_specs` are the recipe's unit_wise_quantization_specs (layers kept in float)."""
    Q = tf.quantization.experimental
    # TF's quantizer matches a unit's node_name and func_name against each quantizable op's
    # name and function as whole-string patterns (selective quantization in
    # tensorflow/compiler/mlir/quantization/tensorflow/passes/lift_quantizable_spots_as_functions.cc).
    specs = [
        qpb.UnitWiseQuantizationSpec(
            unit=[qpb.UnitWiseQuantizationSpec.QuantizationUnit(**unit) for unit in spec["unit"]],
            quantization_method=Q.QuantizationMethod(
                preset_method=getattr(Q.QuantizationMethod.PresetMethod, METHODS[spec["method"]])),
        )
        for spec in unit_specs or []
    ]
    return Q.QuantizationOptions(
        unit_wise_quantization_specs=specs,
        quantization_method=Q.QuantizationMethod(
            preset_method=getattr(Q.QuantizationMethod.PresetMethod, METHODS[method])
        ),
        op_set=OP_SETS[op_set],
        tags=tags,
        signature_keys=signature_keys,
        representative_datasets={
            key: qpb.RepresentativeDatasetFile(tfrecord_file_path=str(path)) for key, path in datasets.items()
        },
    )


def run_quantizer(src: Path, dst: Path, options: Any) -> list[str]:
    """Run TF's quantizer on `src`, writing its (TF1-style) output to `dst`; returns its log."""
    with captured_stderr() as log:
        try:
            tf.quantization.experimental.quantize_saved_model(
                str(src), str(dst), quantization_options=options, overwrite_output_directory=True
            )
            failure = None
        except Exception as exc:  # the quantizer raises ValueError, RuntimeError, OpError...
            failure = exc
    if failure is not None:
        raise QuantizerFailed(_first_line(failure), "\n".join(log)) from failure
    return log


def quantize(src: Path, dst: Path, options: Any) -> dict[str, Any]:
    """Quantize `src` into the empty directory `dst`; return the parsed quantization summary.

    TF's quantizer writes a TF1-style SavedModel (signatures only, no object graph) that the
    later stages cannot read as TF2, so it is loaded and saved again as a TF2 SavedModel.
    """
    with tempfile.TemporaryDirectory(prefix="tpubuild-quantize-") as scratch:
        raw = Path(scratch) / "quantized"
        log = run_quantizer(src, raw, options)
        loaded = tf.saved_model.load(str(raw), tags=list(options.tags))
        tf.saved_model.save(loaded, str(dst), signatures=dict(loaded.signatures))
    # The re-save traces every function again under this process's counters.
    make_reproducible(dst)
    return parse_summary(log)


def _first_line(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


_ROW = re.compile(r"^(\w+)\s+(\d+)/(\d+)$")
_COUNT = re.compile(r"^(Number of [^:]+):\s*(\d+)(?:/(\d+))?$")


def parse_summary(lines: list[str]) -> dict[str, Any]:
    """The quantizer's summary: quantized layers per op type and the added (de)quantize ops."""
    summary: dict[str, Any] = {"layers": {}, "counts": {}, "text": []}
    inside = False
    for raw in lines:
        line = raw.strip()
        if line == SUMMARY_START:
            inside = True
            summary = {"layers": {}, "counts": {}, "text": []}  # keep the last summary printed
        if not inside:
            continue
        summary["text"].append(raw.rstrip())
        if match := _ROW.match(line):
            summary["layers"][match[1]] = {"quantized": int(match[2]), "total": int(match[3])}
        elif match := _COUNT.match(line):
            key = match[1][len("Number of ") :].replace(" ", "_")
            summary["counts"][key] = int(match[2]) if match[3] is None else [int(match[2]), int(match[3])]
            if key.startswith("dequantize"):
                inside = False  # the last line of the summary
    return summary
