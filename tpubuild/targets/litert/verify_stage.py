"""Stage `litert_verify`: the flatbuffer, run by the LiteRT interpreter, computes what the source computes.

Each signature of the flatbuffer runs on verify's samples (stages/verify.py
`verification_samples`) through the `ai_edge_litert` interpreter's signature runner, and
its outputs are compared with the source SavedModel's in TensorFlow, within the
tolerances of the LiteRT conversion's kind (`tolerance_stages`). An op without a kernel in the
interpreter (a fused custom op, a select-TF op) fails the stage with one line naming it.
The summary adds per-call latency (median) of the interpreter and of the source in
TensorFlow on the same input, the flatbuffer's ops, fused composites and size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, SOURCE, StageContext, StageResult, StageSpec
from tpubuild.targets.litert.stage import FACTS_FILE, MODEL_FILE, target_options

VERIFY_JSON = "litert_verify.json"
LATENCY_RUNS = 50  # timed calls per figure; the median is reported


def _options(recipe: dict[str, Any]) -> dict[str, Any]:
    verify = recipe["verify"]
    return {
        "tags": slices.tags(recipe),
        **target_options(recipe),
        "samples": verify["samples"],
        "seed": verify["seed"],
        "representative_datasets": slices.verify_datasets(recipe),
    }


SPEC = StageSpec(
    "litert_verify",
    runs_models=True,
    options=_options,
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(SOURCE, DATASET, "litert"),
    # Measured errors and latencies differ between CPUs.
    machine_dependent=lambda options: True,
)


def tolerance_stages(quantization: str) -> list[str]:
    """The stage names whose default tolerances (compare.default_tolerances) fit the mode.

    none: float32 kernels that sum in another order than TensorFlow's (XNNPACK, the fused
    LSTM kernel): the exact kind. dynamic_range and int8: int8 weights (and, for int8,
    activations): quantize's. float16: weights rounded to float16 (11-bit significand,
    finer than bfloat16's 8) and computed in float32: bfloat16's bound covers it.
    """
    return {"int8": ["quantize"], "dynamic_range": ["quantize"], "float16": ["bfloat16"]}.get(quantization, [])


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    import tensorflow as tf

    from tpubuild.atomic import write_atomic
    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.targets.litert.interpreter import LiteRTModel
    from tpubuild.verify import compare
    from tpubuild.verify.verdict import (
        error_summary,
        raise_on_failure,
        tolerances,
        vacuous_warnings,
        verification_samples,
    )

    applied = tolerance_stages(options["quantization"])
    kind, rtol, atol = tolerances(applied, options, "targets.litert")
    built = context.inputs["litert"]
    facts = json.loads((built / FACTS_FILE).read_text())
    source_dir = context.inputs["source"]
    source = SavedModel.load(source_dir, options["tags"])
    keys = facts["signatures"]
    samples_by_key, origin = verification_samples(source, keys, options, context)
    litert = LiteRTModel(built / MODEL_FILE, stateful=facts["variable_tensors"] > 0)
    reference_model = tf.saved_model.load(str(source_dir), tags=options["tags"])
    errors = []
    for key in keys:
        try:
            reference = compare.run_signature(reference_model, key, samples_by_key[key])
            errors.extend(compare.compare_outputs(key, reference, litert.run_signature(key, samples_by_key[key]), rtol, atol))
        except ValueError as exc:
            raise StageError(str(exc)) from None
    latency = _latency(reference_model, litert, keys[0], samples_by_key[keys[0]][0])
    summary = {
        "applied": applied,
        **error_summary(errors, (kind, rtol, atol), options, samples_by_key, origin),
        "latency": latency,
        "size": facts["size"],
        "ops": facts["ops"],
        "fused": facts["fused"],
        "composites": facts["composites"],
        "quantization": options["quantization"],
    }
    write_atomic(output_dir / VERIFY_JSON, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    raise_on_failure(errors, rtol, atol)
    return StageResult(summary=summary, warnings=vacuous_warnings(errors, rtol, atol, "targets.litert"))


def _latency(reference_model: Any, litert: Any, key: str, sample: dict[str, Any]) -> dict[str, Any]:
    """Per-call median latency of the source in TensorFlow and of the interpreter, on the
    same sample of the first signature, each called through its Python API (the
    interpreter's call includes resetting a stateful model's variables, as verified)."""
    from tpubuild.verify import latency
    from tpubuild.verify.latency import median_call_seconds, signature_call

    source_us = median_call_seconds(signature_call(reference_model.signatures[key], sample), LATENCY_RUNS) * 1e6
    litert_us = median_call_seconds(lambda: litert.invoke(key, sample), LATENCY_RUNS) * 1e6
    return {
        "signature": key,
        "runs": LATENCY_RUNS,
        "source_tf_us": round(source_us, 1),
        "litert_us": round(litert_us, 1),
        # The names `tpubuild report` reads for every target (report/targets.py).
        "method": latency.METHOD.format(calls=LATENCY_RUNS) + ", each runtime through its Python API",
        "call_seconds": {"litert": {key: litert_us / 1e6}, "source": {key: source_us / 1e6}},
    }
