"""Checks on what TF's quantizer did: a quantization that quantized nothing is an error.

TF's quantizer succeeds on a model it cannot quantize (weights under its size threshold,
ranges it could not calibrate) and returns the float model: `MatMul 0/2` in its summary.
Published as an int8 artifact, that is a silent lie, so the build stops.
"""

from __future__ import annotations

from typing import Any

from tpubuild.errors import StageError

# Recipe key that would accept an unquantized result; not in the schema yet (config/ owns it).
ACKNOWLEDGE_KEY = "allow_unquantized"


def check_something_quantized(
    where: str, summary: dict[str, Any], parameters: dict[str, Any], options: dict[str, Any]
) -> None:
    """StageError unless the quantizer quantized at least one layer or the recipe accepts none.

    `summary` is quantization.parse_summary's result; `parameters` the artifact's parameter
    counts by dtype (savedmodel.params). WEIGHT_ONLY prints no summary: its int8 weights count.
    """
    if options.get(ACKNOWLEDGE_KEY):
        return
    layers = summary.get("layers") or {}
    if layers:
        quantized = sum(row["quantized"] for row in layers.values())
        if quantized:
            return
        total = sum(row["total"] for row in layers.values())
        rows = ", ".join(f"{op} {row['quantized']}/{row['total']}" for op, row in sorted(layers.items()))
        raise StageError(
            f"{where}: TensorFlow's quantizer quantized 0 of {total} layers ({rows}); "
            "the artifact would be the float model (set quantization_options.allow_unquantized: true to accept it)"
        )
    if not (parameters.get("int8") or {}).get("elements"):
        raise StageError(
            f"{where}: TensorFlow's quantizer quantized nothing (no quantization summary, no int8 "
            "weights in the artifact); the artifact would be the float model (set "
            "quantization_options.allow_unquantized: true to accept it)"
        )


def refuse_xla_call_modules(where: str, model: Any) -> None:
    """ConversionError naming the first XlaCallModule the serving graph runs: TF's quantizer
    rewrites TensorFlow ops (MatMul, Conv2D ...) and sees a jax2tf computation as one opaque
    op, so nothing inside it would become int8, and the build refuses rather than publish
    a float model as int8."""
    from tpubuild.errors import ConversionError
    from tpubuild.savedmodel.model import GRAPH
    from tpubuild.savedmodel.xla_call_module import OP

    for fn in sorted(model.reachable(GRAPH)):
        for node in model.functions[fn].node_def:
            if node.op == OP:
                raise ConversionError(
                    f"{where}: XlaCallModule node {node.name!r} in function {model.describe(fn)} holds a jax2tf "
                    "StableHLO computation, which TF's quantizer cannot quantize (it rewrites TensorFlow ops); "
                    "quantize the JAX model before export, or drop quantization_options")
