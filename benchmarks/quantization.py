"""int8 quantization of a small transformer: artifact size, CPU latency and error vs float32.

The example transformer (recipes/models/transformer.py, `export_large`: embedding,
self-attention, dense layers; about 2.8M parameters) is quantized with each method by the
real stages (dataset -> quantize -> verify -> report), then source and artifact are timed
on CPU on the same batches. Prints, per method: parameter and on-disk size ratio
(int8 / float32), latency ratio (int8 / float32) and the verification error. Asserts nothing.
The XLA op set targets TPUs: on CPU its int8 ops run as emulating TF kernels, so int8 is
expected to be no faster (often slower) here; the size ratio is the point on CPU.
Run: python3 benchmarks/quantization.py [--batch 8] [--repeats 50] [--methods DYNAMIC_RANGE,...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from tpubuild.savedmodel.report_format import parameter_bytes
from tpubuild.stages import dataset, quantize, report, verify
from tpubuild.stages.base import StageContext

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "recipes" / "models" / "transformer.py"
GENERATOR = "recipes.models.transformer_data:samples"
TAGS = ["serve"]


def load_transformer() -> Any:
    spec = importlib.util.spec_from_file_location("benchmark_transformer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage(module: Any, name: str, input_dir: Path, work: Path, options: dict, context: StageContext) -> dict:
    out = work / name
    out.mkdir()
    result = module.run(input_dir, out, options, context)
    context.inputs[name] = out
    context.results[name] = result.summary
    return result.summary


def latency(path: Path, tokens: np.ndarray, repeats: int) -> float:
    """Median seconds per call of serving_default on one batch (after warm-up)."""
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    batch = tf.constant(tokens)
    for _ in range(5):
        fn(tokens=batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(tokens=batch)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def build(method: str, source: Path, work: Path, samples: int) -> tuple[Path, dict]:
    """Run the recipe's stages for one method; returns the artifact and the report."""
    context = StageContext(workspace=REPO, recipe_name=f"transformer-{method.lower()}",
                           recipe_file=REPO / "recipes" / "dynamic_range.yaml", inputs={"source": source})
    datasets = {}
    if method == "STATIC_RANGE":
        datasets = {"serving_default": {"generator": GENERATOR, "num_samples": 200,
                                        "module_file": "recipes/models/transformer_data.py"}}
        stage(dataset, "dataset", source, work, {"tags": TAGS, "datasets": datasets}, context)
    quant_options = {"tags": TAGS, "method": method, "signature_keys": ["serving_default"], "op_set": "XLA",
                     "representative_datasets": datasets}
    stage(quantize, "quantize", source, work, quant_options, context)
    artifact = context.inputs["quantize"]
    stage(verify, "verify", artifact, work, {"tags": TAGS, "applied": ["quantize"], "representative_datasets": datasets,
                                             "samples": samples, "seed": 0, "rtol": None, "atol": None}, context)
    stage(report, "report", artifact, work, {"tags": TAGS}, context)
    return artifact, json.loads((context.inputs["report"] / "tpubuild-report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--samples", type=int, default=32, help="verification samples")
    parser.add_argument("--methods", default="DYNAMIC_RANGE,WEIGHT_ONLY,STATIC_RANGE")
    args = parser.parse_args()
    transformer = load_transformer()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = work / "source"
        transformer.export_large(str(source))
        tokens = np.random.default_rng(1).integers(0, 8000, (args.batch, transformer.SEQUENCE)).astype(np.int32)
        base = latency(source, tokens, args.repeats)
        rows = []
        for method in args.methods.split(","):
            (work / method).mkdir()
            artifact, rep = build(method, source, work / method, args.samples)
            params = rep["parameters"]
            rows.append((
                method,
                parameter_bytes(params["source"]),
                parameter_bytes(params["artifact"]),
                rep["size"]["artifact"]["total"] / rep["size"]["source"]["total"],
                latency(artifact, tokens, args.repeats) / base,
                rep["verify"]["max_abs_error"],
                rep["verify"]["max_rel_error"],
                rep["verify"]["outputs"][0]["argmax_agreement"],
            ))
    count = sum(v["elements"] for v in params["source"].values())
    print(f"transformer: {count / 1e6:.2f}M float32 parameters; CPU batch {args.batch}, "
          f"float32 median latency {base * 1e3:.2f} ms")
    print(f"{'method':14} {'params MiB':>17} {'param ratio':>11} {'disk ratio':>10} {'latency ratio':>13} "
          f"{'max abs err':>11} {'max rel err':>11} {'argmax':>7}")
    for method, src, art, disk, lat, abs_err, rel_err, agree in rows:
        print(f"{method:14} {src / 2**20:7.2f} -> {art / 2**20:5.2f} {art / src:11.3f} {disk:10.3f} {lat:13.2f} "
              f"{abs_err:11.4g} {rel_err:11.4g} {agree:7.1%}")


if __name__ == "__main__":
    main()
