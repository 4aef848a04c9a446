"""The export stage's time beside running the same export script directly.

A Keras ResNet50 (weights=None) export script (or MobileNetV2, or real_models.py's
BERT-base encoder behind tensorflow_text), run two ways in the same session:
directly (`python -c "import export; export.export(DIR)"` in a fresh process, the floor)
and as the `export` stage of `tpubuild build` (a fresh worker that records the user
code's imports), whose time comes from `build --json`: the stage's own `seconds` plus
its `worker_startup_seconds` (the worker's process start and TensorFlow's import, which
the direct run pays too). The goal: the stage within
1.3x the direct run. Asserts nothing.

Run: python benchmarks/export_overhead.py [--model resnet50|mobilenetv2|bert_base] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPORT = '''
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def export(output_dir):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    net = {builder}

    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, {size}, {size}, 3], tf.float32)])
        def tpu_func(self, x):
            return self.net(x)

        @tf.function(input_signature=[tf.TensorSpec([None, {size}, {size}, 3], tf.float32, name="images")])
        def serve(self, images):
            return {{"probabilities": self.tpu_func(images)}}

    m = M()
    tf.saved_model.save(m, output_dir, signatures={{"serving_default": m.serve}},
                        options=tf.saved_model.SaveOptions(function_aliases={{"tpu_func": m.tpu_func}}))
'''

MODELS = {
    "resnet50": ("keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))", 224),
    "mobilenetv2": ("keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3))", 96),
    # benchmarks/real_models.py's BERT-base encoder (keras_hub) behind tensorflow_text.
    "bert_base": (None, None),
}


def export_script(model: str) -> str:
    if model == "bert_base":
        from real_models import EXPORTS

        return EXPORTS + "\n\ndef export(output_dir):\n    bert_base(output_dir)\n"
    builder, size = MODELS[model]
    return EXPORT.format(builder=builder, size=size)


RECIPE = """name: exported
model:
  export: {script: ../models/export.py, function: export}
converter: {}
verify: {samples: 2}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    print(f"{args.model}; python {sys.version.split()[0]}; {os.cpu_count()} CPUs")
    print(f"{'run':>4} {'direct s':>9} {'export stage s':>15} {'ratio':>6}")
    with tempfile.TemporaryDirectory(prefix="tpubuild-export-bench-") as tmp:
        ws = Path(tmp)
        (ws / "models").mkdir()
        (ws / "recipes").mkdir()
        (ws / "models" / "export.py").write_text(export_script(args.model))
        # The BERT model's tokenizer ops are tensorflow_text's: the stages after export load it.
        libraries = "op_libraries: [tensorflow_text]\n" if args.model == "bert_base" else ""
        (ws / "recipes" / "exported.yaml").write_text(RECIPE + libraries)
        (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
        for run in range(1, args.runs + 1):
            out = ws / "direct"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import export; export.export({str(out)!r})"],
                           cwd=ws / "models", env=env, check=True, capture_output=True)
            direct = time.perf_counter() - start
            shutil.rmtree(ws / ".tpubuild", ignore_errors=True)  # a cold cache: the export stage runs
            shutil.rmtree(ws / "out", ignore_errors=True)
            done = subprocess.run([sys.executable, "-m", "tpubuild", "build", "--json"], cwd=ws, env=env,
                                  capture_output=True, text=True)
            rows = {r["stage"]: r for r in json.loads(done.stdout)["rows"]} if done.stdout else {}
            if "export" not in rows or rows["export"]["status"] != "built":
                print(f"build failed: {done.stderr.strip().splitlines()[-1:]}")
                return
            stage = rows["export"]["seconds"] + (rows["export"].get("worker_startup_seconds") or 0.0)
            print(f"{run:>4} {direct:9.2f} {stage:15.2f} {stage / direct:6.2f}", flush=True)


if __name__ == "__main__":
    main()
