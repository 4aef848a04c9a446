"""Stage `quantize`: int8 post-training quantization with TF's quantizer (op_set XLA).

STATIC_RANGE calibrates on the representative datasets; DYNAMIC_RANGE and WEIGHT_ONLY need
none. TF's summary of quantized layers becomes the stage summary instead of terminal noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import ConversionError, StageError
from tpubuild.stages.base import StageContext, StageResult


def dataset_paths(options: dict[str, Any], context: StageContext) -> dict[str, Path]:
    """Signature key -> TFRecord file: given ones from the workspace, generated ones from `dataset`."""
    paths = {}
    for key, source in sorted(options.get("representative_datasets", {}).items()):
        if "tfrecord_file_path" in source:
            paths[key] = context.workspace / source["tfrecord_file_path"]
        else:
            paths[key] = context.inputs["dataset"] / f"{key}.tfrecord"
    return paths


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.savedmodel import datasets, quantization
    from tpubuild.savedmodel.model import SavedModel

    method = options["method"]
    where = f"{context.recipe_name}: quantization ({method})"
    paths = dataset_paths(options, context)
    model = SavedModel.load(input_dir, options["tags"])
    warnings = []
    sample_counts = {}
    for key, path in paths.items():
        specs = datasets.signature_inputs(model, key)
        label = f"{where}: representative_datasets.{key}: {path.name}"
        count = 0
        for count, sample in enumerate(datasets.read_tfrecord(path, label), start=1):
            datasets.check_sample(sample, specs, f"{label}: sample {count - 1}")
        sample_counts[key] = count
        if count < datasets.RECOMMENDED_SAMPLES and method == "STATIC_RANGE":
            warnings.append(
                f"{label}: only {count} samples; the converter recommends at least "
                f"{datasets.RECOMMENDED_SAMPLES} for calibration"
            )
    if method == "STATIC_RANGE":
        missing = [key for key in options["signature_keys"] if key not in paths]
        if missing:
            raise StageError(f"{where}: signature {missing[0]!r} has no representative dataset; STATIC_RANGE calibrates on one")
    for key in options["signature_keys"]:
        datasets.signature_inputs(model, key)  # a clear error for an unknown signature key
    quant_options = quantization.build_options(
        method, options["tags"], options["signature_keys"], options["op_set"],
        paths if method == "STATIC_RANGE" else {},
    )
    try:
        summary = quantization.quantize(input_dir, output_dir, quant_options)
    except quantization.QuantizerFailed as exc:
        raise ConversionError(f"{where}: TensorFlow's quantizer failed: {exc.line}") from None
    from tpubuild.savedmodel.params import parameters

    weights = parameters(SavedModel.load(output_dir, options["tags"]))["total"]
    if model.aliases:
        # TF's quantizer inlines every function into its signature; aliases cannot survive.
        names = ", ".join(sorted(model.aliases.values()))
        warnings.append(f"{where}: the quantized model has one function per signature; function aliases ({names}) are gone")
    for message in warnings:
        context.log(f"warning: {message}")
    from tpubuild.savedmodel.quantization_checks import check_something_quantized

    check_something_quantized(where, summary, weights, options)
    return StageResult(
        summary={
            "method": method, "op_set": options["op_set"], "samples": sample_counts,
            "parameters": weights, **summary,
        },
        warnings=warnings,
    )
