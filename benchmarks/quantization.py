"""int8 artifact size beside its float32 source, for each TPU placement and method.

Builds, with `tpubuild build` in a fresh workspace, a 256-wide dense model (three layers,
weights in its TPU function) placed by function alias, by concrete function name and by
signature, each with static-range, dynamic-range and weight-only int8, by alias in
bfloat16, and a Keras
MobileNetV2 (weights=None, 96x96) with static-range int8 placed by signature. Then reads
the example recipes' published reports (run `tpubuild build` at the repository root
first). Prints, per build: source and artifact size on disk, their ratio, float32
parameters left in the artifact, and the verification error. The goals: static-range,
dynamic-range and weight-only <= 0.30x; bfloat16 <= 0.52x; MobileNetV2 int8 <= 0.35x.
Asserts nothing.

Run: python3 benchmarks/quantization.py [--skip-keras | --keras-only] [--examples-only]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH = 256
METHODS = ("STATIC_RANGE", "DYNAMIC_RANGE", "WEIGHT_ONLY")

EXPORT = '''
import sys
import numpy as np
import tensorflow as tf

WIDTH = {width}


class Wide(tf.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.ws = [tf.Variable((rng.normal(size=(WIDTH, WIDTH)) / 16).astype("float32"), name=f"w{{i}}")
                   for i in range(3)]
        self.bs = [tf.Variable(np.zeros(WIDTH, "float32"), name=f"b{{i}}") for i in range(3)]

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    def tpu_func(self, x):
        for w, b in zip(self.ws, self.bs):
            x = tf.nn.relu(tf.matmul(x, w) + b)
        return x

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
    def serve(self, x):
        return {{"y": self.tpu_func(x)}}


def keras_cnn(output_dir):
    import keras
    inputs = keras.Input((96, 96, 3), name="inputs")  # the signature's input name
    model = keras.applications.MobileNetV2(weights=None, input_tensor=inputs, classes=10)
    model.export(output_dir)


if __name__ == "__main__":
    if sys.argv[1] == "wide":
        m = Wide()
        tf.saved_model.save(m, sys.argv[2], signatures={{"serving_default": m.serve}},
                            options=tf.saved_model.SaveOptions(function_aliases={{"tpu_func": m.tpu_func}}))
    else:
        keras_cnn(sys.argv[2])
'''

DATA = '''
import numpy as np


def wide():
    rng = np.random.default_rng(1)
    for _ in range(64):
        yield {{"x": rng.normal(size=(1, {width})).astype("float32")}}


def images():
    rng = np.random.default_rng(2)
    for _ in range(16):
        yield {{"inputs": rng.uniform(size=(1, 96, 96, 3)).astype("float32")}}
'''


def recipe(name: str, source: str, placement: str, method: str, generator: str) -> str:
    if method == "BFLOAT16":  # the TPU function in bfloat16 instead of int8
        return (f"name: {name}\nmodel: {{saved_model: {source}}}\nconverter:\n  tpu_functions:\n    - {placement}\n"
                "  bfloat16_optimization: ENABLED\n")
    dataset = (f"    representative_datasets:\n      serving_default: {{generator: \"data_gen:{generator}\", "
               "num_samples: 16}\n") if method == "STATIC_RANGE" else ""
    return (f"name: {name}\nmodel: {{saved_model: {source}}}\nconverter:\n  tpu_functions:\n    - {placement}\n"
            f"  quantization_options:\n    method: {method}\n{dataset}")


def concrete_name(saved_model: Path) -> str:
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((saved_model / "saved_model.pb").read_bytes())
    names = [f.signature.name for f in proto.meta_graphs[0].graph_def.library.function
             if re.fullmatch(r"__inference_tpu_func_\d+", f.signature.name)]
    return names[0]


def row(label: str, report: dict, seconds: float | None) -> str:
    size = report["size"]
    float_left = report["parameters"]["artifact"].get("float32", {}).get("bytes", 0)
    verify = report.get("verify", {})
    took = f"{seconds:7.1f}" if seconds is not None else "      -"
    return (f"{label:42} {size['source']['total'] / 2**20:9.2f} {size['artifact']['total'] / 2**20:9.2f} "
            f"{size['artifact']['total'] / size['source']['total']:6.3f} {float_left / 2**20:8.2f} "
            f"{verify.get('max_rel_error', float('nan')):9.4g} {'pass' if verify.get('passed') else 'FAIL':>5} {took}")


def build(ws: Path, names: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tpubuild", "build", "-k", *names], cwd=ws,
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-keras", action="store_true")
    parser.add_argument("--examples-only", action="store_true")
    parser.add_argument("--keras-only", action="store_true")
    args = parser.parse_args()
    header = (f"{'build':42} {'src MiB':>9} {'art MiB':>9} {'ratio':>6} {'f32 MiB':>8} {'max rel':>9} "
              f"{'ok':>5} {'secs':>7}")
    print(header)
    if not args.examples_only:
        with tempfile.TemporaryDirectory(prefix="tpubuild-quant-bench-") as tmp:
            ws = Path(tmp)
            (ws / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
            (ws / "recipes").mkdir()
            (ws / "models").mkdir()
            (ws / "export.py").write_text(EXPORT.format(width=WIDTH))
            (ws / "data_gen.py").write_text(DATA.format(width=WIDTH))
            subprocess.run([sys.executable, "export.py", "wide", str(ws / "models" / "wide")], cwd=ws, check=True,
                           capture_output=True)
            placements = {"alias": "function_alias: tpu_func",
                          "concrete": f"concrete_function_name: {concrete_name(ws / 'models' / 'wide')}",
                          "signature": "signature_name: serving_default"}
            builds = []
            for where, placement in ({} if args.keras_only else placements).items():
                for method in METHODS:
                    name = f"wide-{where}-{method.lower().replace('_', '-')}"
                    (ws / "recipes" / f"{name}.yaml").write_text(recipe(name, "../models/wide", placement, method, "wide"))
                    builds.append(name)
            if not args.keras_only:
                (ws / "recipes" / "wide-alias-bfloat16.yaml").write_text(
                    recipe("wide-alias-bfloat16", "../models/wide", placements["alias"], "BFLOAT16", "wide"))
                builds.append("wide-alias-bfloat16")
            if not args.skip_keras:
                subprocess.run([sys.executable, "export.py", "cnn", str(ws / "models" / "cnn")], cwd=ws, check=True,
                               capture_output=True)
                (ws / "recipes" / "mobilenetv2-int8.yaml").write_text(
                    recipe("mobilenetv2-int8", "../models/cnn", "signature_name: serving_default", "STATIC_RANGE", "images"))
                builds.append("mobilenetv2-int8")
            for name in builds:
                seconds = build(ws, [name])
                report_file = ws / "out" / name / "1" / "tpubuild-report.json"
                if report_file.is_file():
                    print(row(name, json.loads(report_file.read_text()), seconds), flush=True)
                else:
                    print(f"{name:42} (build failed)", flush=True)
    for name in ("quantized", "quantized_tpu_func", "static_range_generator", "dynamic_range", "weight_only",
                 "bfloat16"):
        versions = sorted((REPO / "out" / name).glob("[0-9]*"), key=lambda p: int(p.name))
        if versions and (versions[-1] / "tpubuild-report.json").is_file():
            print(row(f"example {name}", json.loads((versions[-1] / "tpubuild-report.json").read_text()), None))


if __name__ == "__main__":
    main()
