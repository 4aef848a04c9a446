"""Stage `quantize`: int8 post-training quantization with TF's quantizer (op_set XLA).

STATIC_RANGE calibrates on the representative datasets; DYNAMIC_RANGE and WEIGHT_ONLY need
none. TF's summary of quantized layers becomes the stage summary instead of terminal noise.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tpubuild.errors import ConversionError, StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, LOADS_MODEL, MODEL, StageContext, StageResult, StageSpec

SPEC = StageSpec(
    "quantize",
    runs_models=True,
    # tpu_functions: the functions named by alias or concrete name are quantized one by
    # one and keep their identity (quantize/functions.py).
    options=lambda r: {"tags": slices.tags(r), "tpu_functions": slices.converter(r)["tpu_functions"],
                       **slices.converter(r)["quantization_options"]},
    files=lambda r: slices.tfrecord_files(slices.dataset_sources(r)),
    consumes=(MODEL, DATASET),
    # Calibration statistics are float sums over the dataset: their last digit differs
    # between CPUs and kernels (oneDNN on/off), and so do the int8 scales written from them.
    machine_dependent=lambda options: options["method"] == "STATIC_RANGE",
    memory=LOADS_MODEL,  # its peak memory (stages/base.py, measured there)
)


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    from tpubuild.quantize import datasets
    from tpubuild.savedmodel.model import SavedModel, readable_copy

    method = options["method"]
    where = f"quantization ({method})"
    paths = datasets.dataset_paths(options, context)
    model = SavedModel.load(input_dir, options["tags"])
    from tpubuild.quantize.checks import refuse_xla_call_modules

    refuse_xla_call_modules(where, model)
    warnings = []
    sample_counts = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for key, path in paths.items():
        specs = datasets.signature_inputs(model, key)
        label = f"{where}: representative_datasets.{key}: {path.name}"
        samples[key] = [
            datasets.check_sample(sample, specs, f"{label}: sample {index}")
            for index, sample in enumerate(datasets.read_tfrecord(path, label))
        ]
        count = sample_counts[key] = len(samples[key])
        # A dataset the dataset stage wrote (from an npz or a generator) was counted there,
        # in the words of its source; only a TFRecord file given as it is is counted here.
        given = "tfrecord_file_path" in options.get("representative_datasets", {}).get(key, {})
        if count < datasets.RECOMMENDED_SAMPLES and method == "STATIC_RANGE" and given:
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
    # Beside output_dir, not in it: TF's quantizer writes the whole of output_dir.
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=Path(output_dir).parent) as scratch:
        # TF's quantizer loads the model in a session: it must see one handle per weight.
        readable = readable_copy(Path(input_dir), options["tags"], Path(scratch))
        summary, kept = _quantize(model, readable, output_dir, options, paths, samples, where, warnings)
    from tpubuild.report.params import parameters

    weights = parameters(SavedModel.load(output_dir, options["tags"]))["total"]
    if model.aliases and not kept:
        # TF's quantizer inlines every function into its signature; aliases cannot survive.
        names = ", ".join(sorted(model.aliases.values()))
        warnings.append(f"{where}: the quantized model has one function per signature; function aliases ({names}) are gone")
    for message in warnings:
        context.log(f"warning: {message}")
    from tpubuild.quantize.checks import check_something_quantized

    check_something_quantized(where, summary, weights, options)
    return StageResult(
        summary={
            "method": method, "op_set": options["op_set"], "samples": sample_counts,
            "parameters": weights, **summary,
        },
        warnings=warnings,
    )


def _quantize_kept(
    input_dir: Path, output_dir: Path, options: dict[str, Any], kept: dict[str, str],
    samples: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Quantize each kept function on its own; the summary adds up the per-function ones."""
    from tpubuild.quantize.functions import quantize_functions
    from tpubuild.quiet import captured_stderr

    # TF1 session loading logs deprecation notices; they belong in the log, not the terminal.
    with captured_stderr():
        per_function, removed = quantize_functions(
            input_dir, output_dir, options["tags"], kept, options["method"], options["op_set"],
            {key: samples[key] for key in options["signature_keys"] if key in samples},
            options.get("unit_wise_quantization_specs"),
        )
    # The float variables only the replaced bodies read, removed from the artifact.
    total: dict[str, Any] = {"layers": {}, "counts": {}, "text": [], "functions": {}, "removed_variables": removed}
    for label, summary in per_function.items():
        total["functions"][label] = {k: v for k, v in summary.items() if k != "text"}
        total["text"].extend(summary["text"])
        for op, row in summary["layers"].items():
            seen = total["layers"].setdefault(op, {"quantized": 0, "total": 0})
            seen["quantized"] += row["quantized"]
            seen["total"] += row["total"]
        for key, value in summary["counts"].items():
            before = total["counts"].get(key)
            if isinstance(value, list):
                total["counts"][key] = [a + b for a, b in zip(before or [0, 0], value)]
            else:
                total["counts"][key] = (before or 0) + value
    return total


def _quantize(model: Any, input_dir: Path, output_dir: Path, options: dict[str, Any], paths: dict[str, Path],
              samples: dict[str, list[dict[str, Any]]], where: str, warnings: list[str]) -> tuple[dict[str, Any], Any]:
    """TF's quantizer on `input_dir`: the kept functions one by one, else the whole model."""
    from tpubuild.quantize import tf_quantizer as quantization
    from tpubuild.quantize.functions import absorbed, kept_functions

    try:
        # Functions placed later by alias or concrete name are quantized one by one, so they
        # survive under their own names (quantize/functions.py explains how).
        kept = kept_functions(model, options.get("tpu_functions", []))
        if kept:
            summary = _quantize_kept(input_dir, output_dir, options, kept, samples)
            for caller, callee in absorbed(model, kept):
                # TF's quantizer inlines the callee into the caller's standalone model.
                warnings.append(
                    f"{where}: tpu function {caller} calls tpu function {callee}; quantized, {caller} "
                    f"holds {callee}'s int8 body inline and no longer calls it"
                )
        else:
            quant_options = quantization.build_options(
                options["method"], options["tags"], options["signature_keys"], options["op_set"],
                paths if options["method"] == "STATIC_RANGE" else {},
                options.get("unit_wise_quantization_specs"),
            )
            summary = quantization.quantize(input_dir, output_dir, quant_options)
    except quantization.QuantizerFailed as exc:
        raise ConversionError(f"{where}: TensorFlow's quantizer failed: {exc.line}") from None
    except ConversionError as exc:
        raise ConversionError(f"{where}: {exc}") from None
    return summary, kept
