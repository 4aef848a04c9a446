"""SavedModel -> LiteRT flatbuffer with TensorFlow's converter (tf.lite.TFLiteConverter).

`convert()` returns the flatbuffer's bytes. The float converter is deterministic for a
given SavedModel and TensorFlow release (measured: the same bytes from two processes and
from two copies of the SavedModel at different paths; its only metadata,
`min_runtime_version` and `CONVERSION_METADATA`, hold versions and options, no time or
path). int8 quantization is not: it leaves buffers no tensor refers to holding bytes that
differ from run to run, which `litert_inspect.zero_unreferenced_buffers` zeroes. Its
scales, from float calibration runs, may still differ between machines (see
targets/litert/stage.py, machine_dependent).

Its failures become one line: the converter reports each op it cannot lower as a
ConverterErrorData proto (tensorflow/compiler/mlir/lite/metrics/converter_error_data.proto)
on `ConverterError.errors` (tensorflow/lite/python/convert_phase.py), with the op
(`operator.name`, "tf.MatrixInverse"), where it is (`location`, node@function call sites)
and why: ERROR_NEEDS_FLEX_OPS (not a LiteRT builtin, but in the select-TF allowlist,
tensorflow/compiler/mlir/lite/delegates/flex/allowlisted_flex_ops.cc) or
ERROR_NEEDS_CUSTOM_OPS (neither). The same facts are in its message text ("TF Select ops:
X", "Custom ops: X", from tensorflow/compiler/mlir/lite/flatbuffer_export.cc).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from tpubuild.errors import ConversionError

QUANTIZATIONS = ("none", "dynamic_range", "float16", "int8")
WHERE = "targets.litert"


def convert(
    saved_model: Path, tags: list[str], signature_keys: list[str], quantization: str,
    select_tf_ops: bool, representative: Callable[[], Iterator[Any]] | None = None,
) -> bytes:
    """The flatbuffer; ConversionError with one line when the converter fails."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=signature_keys, tags=set(tags))
    builtins = tf.lite.OpsSet.TFLITE_BUILTINS
    if quantization != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if quantization == "int8":
        # Full integer post-training quantization: every op int8 or the conversion fails
        # (the TFLite PTQ guide, "Integer only"); inputs and outputs stay float so the
        # model is called like its source.
        converter.representative_dataset = representative
        builtins = tf.lite.OpsSet.TFLITE_BUILTINS_INT8
    converter.target_spec.supported_ops = [builtins, *([tf.lite.OpsSet.SELECT_TF_OPS] if select_tf_ops else [])]
    with captured_output(), warnings.catch_warnings():
        # int8 calibration runs the deprecated tf.lite.Interpreter, which warns on creation.
        warnings.simplefilter("ignore")
        try:
            flatbuffer = converter.convert()
        except Exception as exc:  # ConverterError, or ValueError/RuntimeError from the Python side
            raise ConversionError(describe_converter_error(exc, select_tf_ops)) from None
    from tpubuild.targets.litert.flatbuffer import zero_unreferenced_buffers

    return zero_unreferenced_buffers(flatbuffer)


def describe_converter_error(exc: Exception, select_tf_ops: bool) -> str:
    """One line: the op the converter could not lower and what would let it through."""
    for error in getattr(exc, "errors", []):
        code = _error_code_name(error)
        op = error.operator.name
        if not op or code not in ("ERROR_NEEDS_FLEX_OPS", "ERROR_NEEDS_CUSTOM_OPS"):
            continue
        where = _location(error)
        if code == "ERROR_NEEDS_FLEX_OPS" and not select_tf_ops:
            return (f"op {op}{where} has no LiteRT builtin kernel; the flex runtime runs it as a TensorFlow op: "
                    f"set {WHERE}.select_tf_ops: true")
        return f"op {op}{where} has no LiteRT kernel, builtin or select-TF (flex); LiteRT cannot run this model"
    message = str(exc)
    for pattern, advice in ((r"TF Select ops: ([\w, ]+)", f"; set {WHERE}.select_tf_ops: true"),
                            (r"Custom ops: ([\w, ]+)", "; no builtin or select-TF (flex) kernel")):
        match = re.search(pattern, message)
        if match:
            return f"ops without a LiteRT builtin kernel: {match.group(1).strip()}{'' if select_tf_ops else advice}"
    return f"TensorFlow's LiteRT converter failed: {first_error_line(message)}"


def _error_code_name(error: Any) -> str:
    from tensorflow.compiler.mlir.lite.metrics import converter_error_data_pb2

    return converter_error_data_pb2.ConverterErrorData.ErrorCode.Name(error.error_code)


def _location(error: Any) -> str:
    """' (node N in function F)' from the innermost call site `node@__inference_F_123`."""
    calls = [c.name for c in error.location.call] or ([error.location.name] if error.location.name else [])
    if not calls or "@" not in calls[0]:
        return ""
    node, function = calls[0].split("@", 1)
    return f" (node {node} in function {readable_function(function)})"


def readable_function(name: str) -> str:
    """`__inference_serve_11` -> `serve`: the name the user gave the tf.function."""
    return re.sub(r"_\d+$", "", re.sub(r"^__inference_", "", name))


def first_error_line(message: str) -> str:
    """The converter's first `error:` line without MLIR's location prefix."""
    for line in message.splitlines():
        if "error:" in line:
            text = line.split("error:", 1)[1].strip()
            # `loc(...)` and `<unknown>:0:` prefixes say where in MLIR, not in the model.
            text = re.sub(r"^loc\(.*?\)\):\s*", "", text)
            if text:
                return text
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else "no message"


@contextlib.contextmanager
def captured_output() -> Iterator[None]:
    """File descriptors 1 and 2 point at a discarded temporary file for the block.

    The converter's and the interpreter's C++ code write to both ("fully_quantize: 0,
    inference_type: 6" on stdout during int8 calibration; absl's "All log messages before
    absl::InitializeLog()" from the converter's own copy of absl; "INFO: Created TensorFlow
    Lite XNNPACK delegate for CPU."): none of it reaches the user, and what matters comes
    back as exceptions (ConverterError.errors, the interpreter's RuntimeError).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
