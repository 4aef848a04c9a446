"""Stage `xla_aot_verify`: each XLA AOT library computes what the source computes.

Per (signature, batch) of the `xla_aot` stage's output, a generated C++ harness
(targets/xla_aot/harness.py) is compiled with the system C++ compiler against the
library's objects and the XLA AOT runtime (targets/xla_aot/runtime.py: a static library
in a temp dir, its objects cached in the workspace), then run on the verification samples
grouped into batches of that size. The last batch is padded by repeating its last sample;
outputs whose first dimension is the batch drop the padding rows before comparing. The
source SavedModel runs the same padded batches, so the two see identical inputs.

Tolerance: `stages/verify.py tolerances([])`, the exact kind (rtol 1e-5, atol 1e-6) unless
the recipe sets `targets.xla_aot.rtol/atol`. The source is not changed, but XLA's CPU
compiler fuses elementwise ops and emits its own dot and reduction loops (other summation
orders, and polynomial approximations of tanh/exp where TF's Eigen kernels use others), so
float32 results differ in the last bits, as between TF kernels at different batch shapes:
the exact kind's bound is meant for such reorderings.

Latency, per call, same inputs (the first batch): the AOT function's Run() timed in the
harness (median of up to `ITERATIONS` calls, argument buffers already filled), beside the
source's signature called from Python through TensorFlow's runtime
(`loaded.signatures[key](**inputs)` on tf.constant inputs made once, median of up to
`ITERATIONS` calls, `time.perf_counter`); both stop early within verify/latency.py's budget.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages import slices
from tpubuild.stages.base import DATASET, SOURCE, StageContext, StageResult, StageSpec
from tpubuild.targets.xla_aot.stage import target_options

SPEC = StageSpec(
    "xla_aot_verify",
    runs_models=True,
    options=lambda r: {
        **target_options(r),
        "tags": slices.tags(r),
        "samples": r["verify"]["samples"],
        "seed": r["verify"]["seed"],
        "representative_datasets": slices.verify_datasets(r),
    },
    files=lambda r: slices.tfrecord_files(slices.verify_datasets(r)),
    consumes=(SOURCE, DATASET, "xla_aot"),
    # Measured errors and latencies differ between CPUs.
    machine_dependent=lambda options: True,
)

VERIFY_JSON = "xla_aot_verify.json"
ITERATIONS = 200


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import versions

    from tpubuild.savedmodel.model import SavedModel
    from tpubuild.targets.xla_aot import harness as xla_aot_harness
    from tpubuild.targets.xla_aot import runtime as xla_aot_runtime
    from tpubuild.verify import compare, latency
    from tpubuild.verify.verdict import (
        error_summary,
        raise_on_failure,
        tolerances,
        vacuous_warnings,
        verification_samples,
        write_json,
    )

    kind, rtol, atol = tolerances([], options, "targets.xla_aot")
    artifact = Path(context.inputs["xla_aot"])
    facts = json.loads((artifact / "xla_aot.json").read_text())
    libraries = facts["libraries"]
    source_dir = Path(context.inputs["source"])
    keys = sorted({lib["signature"] for lib in libraries})
    samples_by_key, origin = verification_samples(SavedModel.load(source_dir, options["tags"]), keys, options, context)
    source = tf.saved_model.load(str(source_dir), tags=options["tags"])
    errors, per_library = [], []
    with tempfile.TemporaryDirectory(prefix="xla-aot-verify-") as tmp:
        work = Path(tmp)
        flags = xla_aot_runtime.compile_flags(versions.CXX11_ABI_FLAG)
        headers = [(artifact / lib["header"]).read_text() for lib in libraries]
        sources = xla_aot_runtime.needed_sources(headers)
        runtime = xla_aot_runtime.build_library(sources, flags, context.workspace, tf.__version__, work / "libruntime.a")
        cxx = xla_aot_runtime.compiler()[0]
        for lib in libraries:
            try:
                program = xla_aot_harness.build(lib, artifact, runtime, flags, cxx, work)
            except xla_aot_harness.HarnessLinkError as exc:
                if not exc.undefined:
                    raise StageError(f"xla_aot_verify: the harness of {lib['cpp_class']} did not compile: {exc.first}") from None
                # A runtime file the header scan missed: link against all of them.
                sources = sorted(set(sources) | set(xla_aot_runtime.optional_sources()))
                runtime = xla_aot_runtime.build_library(sources, flags, context.workspace, tf.__version__, runtime)
                try:
                    program = xla_aot_harness.build(lib, artifact, runtime, flags, cxx, work)
                except xla_aot_harness.HarnessLinkError as again:
                    raise StageError(f"xla_aot_verify: the harness of {lib['cpp_class']} did not link: {again.first}") from None
            samples = samples_by_key[lib["signature"]]
            batches, real_rows = _batches(lib, samples, np)
            got, aot_ns = xla_aot_harness.run(program, lib, batches, ITERATIONS, work)
            function = source.signatures[lib["signature"]]
            want = [_call_source(function, lib, batch, tf) for batch in batches]
            first = {arg["input"]: batches[0][arg["name"]] for arg in lib["args"]}
            tf_ns = round(latency.median_call_seconds(latency.signature_call(function, first), ITERATIONS) * 1e9)
            for result in lib["results"]:
                name = result["output"]
                batched = bool(result["shape"]) and result["shape"][0] == lib["batch"]
                ref = _join([w[name] for w in want], real_rows, batched, np)
                aot = _join([g[result["name"]] for g in got], real_rows, batched, np)
                try:
                    found = compare.compare_outputs(lib["signature"], {name: ref}, {name: aot}, rtol, atol)
                except ValueError as exc:
                    raise StageError(f"xla_aot_verify: batch {lib['batch']}: {exc}") from None
                for error in found:
                    error.signature = f"{lib['signature']}@batch{lib['batch']}"
                errors.extend(found)
            per_library.append({
                "signature": lib["signature"], "batch": lib["batch"], "cpp_class": lib["cpp_class"],
                "batches": len(batches), "padding_rows": len(batches) * lib["batch"] - len(samples),
                "latency_ns": {"xla_aot": aot_ns, "tensorflow": tf_ns},
                "files": {f: (artifact / f).stat().st_size for f in lib["files"]},
            })
        runtime_files = sorted(s.relative_to(xla_aot_runtime.tensorflow_dir()).as_posix() for s in sources)
    summary = {
        **error_summary(errors, (kind, rtol, atol), options, samples_by_key, origin),
        "libraries": per_library,
        "runtime_sources": runtime_files,
        "latency_method": {
            "xla_aot": f"median of up to {ITERATIONS} Run() calls in the C++ harness (fewer once they took "
                       f"{latency.BUDGET_SECONDS:g} s, at least {latency.MIN_CALLS}) after {latency.WARMUP_CALLS} "
                       "untimed ones, inputs already in the argument buffers",
            "tensorflow": latency.METHOD.format(calls=ITERATIONS) + " (the source, from Python)",
        },
        "padding": "the last batch repeats its last sample; outputs batched on dimension 0 drop those rows",
        # The keys `tpubuild report` reads for its side-by-side table (report/targets.py).
        "size": sum(f.stat().st_size for f in artifact.iterdir() if f.is_file()),
        "latency": {
            "method": "per call, same inputs (the first batch), median: the XLA AOT function's Run() in "
                      "the C++ harness; the source's signature called from Python through TensorFlow",
            "call_seconds": {
                "xla_aot": {f"{lib['signature']}@{lib['batch']}": lib["latency_ns"]["xla_aot"] / 1e9
                            for lib in per_library},
                "source": {f"{lib['signature']}@{lib['batch']}": lib["latency_ns"]["tensorflow"] / 1e9
                           for lib in per_library},
            },
        },
    }
    write_json(Path(output_dir) / VERIFY_JSON, summary)
    raise_on_failure(errors, rtol, atol, prefix="xla_aot_verify: ")
    for lib in per_library:
        context.log(f"xla_aot_verify: {lib['cpp_class']}: {lib['latency_ns']['xla_aot']} ns per call "
                    f"(TensorFlow {lib['latency_ns']['tensorflow']} ns)")
    return StageResult(summary=summary, warnings=vacuous_warnings(errors, rtol, atol, "targets.xla_aot"))


def _batches(lib: dict[str, Any], samples: list[dict[str, Any]], np: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Samples (each a batch of one) stacked into batches of the library's size; the last one
    padded with copies of its last sample. Returns (inputs by argument name, real rows)."""
    size = lib["batch"]
    batches, rows = [], []
    for start in range(0, len(samples), size):
        group = samples[start:start + size]
        rows.append(len(group))
        group = group + [group[-1]] * (size - len(group))
        batch = {}
        for arg in lib["args"]:
            values = [np.asarray(s[arg["input"]]) for s in group]
            if arg["shape"] and values[0].ndim == len(arg["shape"]):
                stacked = np.concatenate(values, axis=0)  # samples carry a batch dimension of one
            else:
                stacked = np.stack(values)
            if list(stacked.shape) != list(arg["shape"]):
                raise StageError(
                    f"xla_aot_verify: signature {lib['signature']!r} input {arg['input']!r}: samples give shape "
                    f"{list(stacked.shape)} at batch {size}, the library takes {arg['shape']}"
                )
            batch[arg["name"]] = stacked.astype(arg["dtype"])
        batches.append(batch)
    return batches, rows


def _call_source(function: Any, lib: dict[str, Any], batch: dict[str, Any], tf: Any) -> dict[str, Any]:
    inputs = {arg["input"]: tf.constant(batch[arg["name"]]) for arg in lib["args"]}
    return {name: tensor.numpy() for name, tensor in function(**inputs).items()}


def _join(values: list[Any], rows: list[int], batched: bool, np: Any) -> Any:
    """An output over all batches: batched outputs without their padding rows, end to end;
    others (no batch dimension) stacked whole."""
    if batched:
        return np.concatenate([v[:n] for v, n in zip(values, rows)], axis=0)
    return np.stack(values)
