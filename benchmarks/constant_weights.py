"""The graph-only stages on a model whose weights are constants of its graph (a frozen export).

A TPU function of LAYERS float32 matrices, each a Const node (tf.constant of a numpy array
inside the tf.function), tanh between: the weights live in saved_model.pb, not variables/.
Each of these runs in a fresh process, in the same run: the reference, a
`tf.saved_model.load` + `tf.saved_model.save` of the model; the tpu stage (stages/tpu.py
run, its checks and placement) on the model; the batch stage on the tpu stage's output.
Prints each one's wall time and max RSS (the child's own rusage), and each stage's
beside the reference's. Issue 54: before tpu/splat.py, at 576 MiB of constants, the
tpu stage peaked at 8,567 MiB and the batch stage's worker passed 11 GiB over 8 minutes
(the MLIR bridge's module printed as text, every constant in hex).

Run: python3 benchmarks/constant_weights.py [--mib 576] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIDE = 2048  # each matrix 2048 x 2048 float32: 16 MiB

MAKE = """
import sys
import numpy as np
import tensorflow as tf
layers, out = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
mats = [rng.standard_normal(({side}, {side}), dtype=np.float32) / {side} ** 0.5 for _ in range(layers)]
class M(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, {side}], tf.float32)])
    def tpu_func(self, x):
        for m in mats:
            x = tf.tanh(tf.matmul(x, tf.constant(m)))
        return x
    @tf.function(input_signature=[tf.TensorSpec([None, {side}], tf.float32)])
    def serve(self, x):
        return {{"y": self.tpu_func(x)}}
m = M()
tf.saved_model.save(m, out, signatures={{"serving_default": m.serve}},
                    options=tf.saved_model.SaveOptions(function_aliases={{"tpu_func": m.tpu_func}}))
""".format(side=SIDE)

LOAD_SAVE = """
import sys
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
tf.saved_model.save(model, sys.argv[2], signatures=model.signatures)
"""

STAGE = """
import json, sys
from pathlib import Path
from tpubuild.stages.base import StageContext
stage, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
out.mkdir()
options = {"tags": ["serve"], "tpu_functions": [{"function_alias": "tpu_func"}], "xla_sharding_options": None}
if stage == "batch":
    from tpubuild.stages.batch import run
    options["batch_options"] = [{"num_batch_threads": 1, "max_batch_size": 8, "batch_timeout_micros": 1000,
                                 "allowed_batch_sizes": [8], "max_enqueued_batches": 100}]
else:
    from tpubuild.stages.tpu import run
run(src, out, options, StageContext(workspace=src.parent))
"""


def _child(code: str, *args: str) -> tuple[float, int]:
    """(wall seconds, max RSS in bytes) of `python -c code args` in a fresh process: its own
    rusage, from wait4 (RUSAGE_CHILDREN would be the largest child's so far)."""
    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"constant_weights: {args[0] if args else 'child'} failed:\n"
                     f"{err.read().decode(errors='replace')[-2000:]}")
    return seconds, usage.ru_maxrss * 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=576, help="MiB of constants (16 MiB per layer)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary directory)")
    args = parser.parse_args()
    layers = max(1, args.mib // 16)
    work = args.keep or Path(tempfile.mkdtemp(prefix="constant-weights-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if not model.exists():
        _child(MAKE, str(layers), str(model))
    graph = (model / "saved_model.pb").stat().st_size
    for name in ("saved", "tpu", "batch"):
        if (work / name).exists():
            subprocess.run(["rm", "-rf", str(work / name)], check=True)
    figures = {}
    figures["load + save"] = _child(LOAD_SAVE, str(model), str(work / "saved"))
    figures["tpu stage"] = _child(STAGE, "tpu", str(model), str(work / "tpu"))
    figures["batch stage"] = _child(STAGE, "batch", str(work / "tpu"), str(work / "batch"))
    mib = 2**20
    print(f"constants: {layers} x {SIDE} x {SIDE} float32, saved_model.pb {graph / mib:,.0f} MiB")
    reference = figures["load + save"]
    for name, (seconds, peak) in figures.items():
        ratio = "" if name == "load + save" else \
            f", {seconds / reference[0]:.2f}x the time, {peak / reference[1]:.2f}x the memory of the load + save"
        print(f"  {name}: {seconds:.1f} s, max RSS {peak / mib:,.0f} MiB{ratio}")
    print(json.dumps({name: {"seconds": round(s, 2), "max_rss_bytes": p} for name, (s, p) in figures.items()}))


if __name__ == "__main__":
    main()
