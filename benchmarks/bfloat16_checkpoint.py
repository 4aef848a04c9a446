"""The bfloat16 stage's peak memory on a float32 model of SIZE_MIB (default 1024): the stage
(tpubuild/stages/bfloat16.py `run`, scope ALL) in a fresh process per run, its checkpoint
rewritten three ways, each process's max RSS and wall time printed:

- `streaming`: checkpoint.write_bfloat16 as shipped (savedmodel/tensor_bundle.py: tensor by
  tensor, a chunk at a time);
- `whole`: checkpoint._write_bfloat16_whole, the SaveV2 of every tensor at once that the
  stage used before (issue 54), kept as the fallback for bundles tensor_bundle.py does not read;
- `none`: no checkpoint rewrite at all (the graph rewrite alone: TensorFlow imported, the
  SavedModel's protos loaded and converted), the floor the other two stand on.

Target (issue 54, item 1): `streaming` within a few chunks (tensor_bundle.CHUNK, 8 MiB) of
`none`, whatever the model's size; `whole` holds about the model above `none`.
With CHECKOUT, also `before`: the stage of another tpubuild checkout (e.g. main's, before
issue 54), run the same way.
Usage: python3 benchmarks/bfloat16_checkpoint.py [SIZE_MIB] [LAYERS] [CHECKOUT]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from tpubuild.quiet import quiet_tensorflow
quiet_tensorflow()
from tpubuild.savedmodel import checkpoint
from tpubuild.stages import bfloat16
from tpubuild.stages.base import StageContext
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode == "whole":
    checkpoint.write_bfloat16 = checkpoint._write_bfloat16_whole
elif mode == "none":
    checkpoint.write_bfloat16 = lambda *args: None
options = {"tags": ["serve"], "tpu_functions": [], "bfloat16_optimization_options": {"scope": "ALL"}}
start = time.perf_counter()
bfloat16.run(src, out, options, StageContext(out.parent, inputs={"source": src}))
print(json.dumps({"seconds": time.perf_counter() - start,
                  "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_model(path: Path, size_mib: int, layers: int) -> None:
    """A stack of `layers` float32 square matrices with tanh between, `size_mib` in all."""
    code = f"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from tpubuild.quiet import quiet_tensorflow
quiet_tensorflow()
import numpy as np, tensorflow as tf
n = int(({size_mib} * 2**20 / 4 / {layers}) ** 0.5)
class Stack(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.kernels = [tf.Variable(rng.standard_normal((n, n), dtype=np.float32) / n**0.5) for _ in range({layers})]
    @tf.function(input_signature=[tf.TensorSpec([None, n], tf.float32)])
    def serve(self, x):
        for kernel in self.kernels:
            x = tf.tanh(x @ kernel)
        return {{"y": x}}
m = Stack()
tf.saved_model.save(m, {str(path)!r}, signatures={{"serving_default": m.serve}})
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def run(mode: str, src: Path, scratch: Path, checkout: str | None = None) -> dict:
    out = Path(tempfile.mkdtemp(dir=scratch)) / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": checkout} if checkout else None  # cwd is not a checkout: PYTHONPATH decides
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out)], check=True, cwd=scratch,
                          capture_output=True, text=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    data = sum(p.stat().st_size for p in (out / "variables").iterdir() if ".data-" in p.name)
    result["written_mib"] = data / 2**20
    subprocess.run(["rm", "-rf", str(out.parent)], check=True)
    return result


def main() -> None:
    size_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    with tempfile.TemporaryDirectory(prefix="tpubuild-bench-bf16-") as scratch:
        src = Path(scratch) / "model"
        make_model(src, size_mib, layers)
        data = sum(p.stat().st_size for p in (src / "variables").iterdir())
        print(f"model: {layers} float32 matrices, {data / 2**20:.0f} MiB of variables "
              f"(largest tensor {data / layers / 2**20:.0f} MiB)")
        runs = [("none", "none", None), ("streaming", "streaming", None), ("whole", "whole", None)]
        if len(sys.argv) > 3:
            runs.append(("before", "streaming", sys.argv[3]))  # the checkout's own write_bfloat16
        for label, mode, checkout in runs:
            r = run(mode, src, Path(scratch), checkout)
            print(f"  {label:<9} max RSS {r['max_rss_mib']:7.0f} MiB   {r['seconds']:6.1f} s   "
                  f"output data {r['written_mib']:6.0f} MiB")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
