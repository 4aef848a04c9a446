"""Two large recipes built with `-j 2` on one machine: do both build, and at what peak?

Two SavedModels of N GiB each (random-weight dense stacks: LAYERS float32 matrices of
width W with tanh between, the whole stack the TPU function; different seeds, so no stage
of one is a cache hit of the other), each in a recipe with bfloat16 and verify on 8
samples, built together with `tpubuild build -j 2`. The pool starts a stage only while the
stages' memory estimates fit the available memory (workers/pool.py MemoryGate), so where
the two builds' peaks together would not fit, their big stages run one after the other.

Printed: whether both built, the build's wall seconds, the machine's peak used memory
(MemTotal - MemAvailable, sampled every 0.25 s, above what was used before it started),
the lock files' `peak_memory` figures, and, as the reference, the same figures for a
fresh-process `tf.saved_model.load` + `tf.saved_model.save` of one of the models.
The machine may be shared: the used memory counts everyone's. Asserts nothing.

With --memory-available BYTES the build runs under TPUBUILD_MEMORY_AVAILABLE=BYTES: a smaller
machine, to see the pool hold stages back with small models. The seconds stages waited for
memory are read from the build's trace (`build --profile`).

Run: python benchmarks/memory_fit.py [--gib 6] [--memory-available BYTES] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

LAYERS = 32

MAKE = textwrap.dedent('''\
    import sys
    import numpy as np
    import tensorflow as tf

    out, width, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(seed)


    class Stack(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = [tf.Variable(rng.standard_normal((width, width), dtype=np.float32) / np.float32(np.sqrt(width)),
                                  name=f"w{{i}}") for i in range({layers})]

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32)])
        def tpu_func(self, x):
            for w in self.w:
                x = tf.tanh(tf.matmul(x, w))
            return x

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
        def serve(self, x):
            return {{"y": self.tpu_func(x)}}


    m = Stack()
    tf.saved_model.save(m, out, signatures={{"serving_default": m.serve}},
                        options=tf.saved_model.SaveOptions(function_aliases={{"tpu_func": m.tpu_func}}))
''').format(layers=LAYERS)

LOAD_SAVE = ("import sys, tensorflow as tf\n"
             "tf.saved_model.save(tf.saved_model.load(sys.argv[1]), sys.argv[2])\n")

RECIPE = textwrap.dedent('''\
    name: {name}
    model: {{saved_model: models/{name}}}
    converter:
      tpu_functions:
        - function_alias: tpu_func
      bfloat16_optimization: ENABLED
      bfloat16_optimization_options: {{scope: TPU}}
    verify: {{samples: 8}}
''')


def meminfo() -> dict[str, int]:
    with open("/proc/meminfo") as f:
        return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}


def used() -> int:
    info = meminfo()
    return info["MemTotal"] - info["MemAvailable"]


class Sampler:
    """The machine's used memory every 0.25 s while the block runs; `peak` above `before`."""

    def __enter__(self) -> Sampler:
        self.before = used()
        self.peak = self.before
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            self.peak = max(self.peak, used())

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, used())

    @property
    def above(self) -> int:
        return self.peak - self.before


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def run(cmd: list[str], cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float, int]:
    with Sampler() as sampler:
        start = time.monotonic()
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        seconds = time.monotonic() - start
    return result, seconds, sampler.above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=6.0, help="each model's size in GiB of float32 (default 6)")
    parser.add_argument("--keep", type=Path, help="build in this directory and keep it")
    parser.add_argument("--memory-available", type=int, help="TPUBUILD_MEMORY_AVAILABLE for the build (bytes)")
    args = parser.parse_args()
    width = max(64, int(round((args.gib * 2**30 / 4 / LAYERS) ** 0.5 / 64)) * 64)
    root = args.keep or Path(tempfile.mkdtemp(prefix="tpubuild-memory-fit-"))
    root.mkdir(parents=True, exist_ok=True)
    ws = root / "ws"
    models = ws / "recipes" / "models"
    models.mkdir(parents=True, exist_ok=True)
    (ws / "tpubuild.yaml").write_text('recipes: ["recipes/*.yaml"]\n')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    names = ("first", "second")
    for seed, name in enumerate(names):
        if not (models / name / "saved_model.pb").exists():
            subprocess.run([sys.executable, "-c", MAKE, str(models / name), str(width), str(seed)], check=True, env=env,
                           stderr=subprocess.DEVNULL)
        (ws / "recipes" / f"{name}.yaml").write_text(RECIPE.format(name=name))
    size = sum(f.stat().st_size for f in (models / names[0]).rglob("*") if f.is_file())
    info = meminfo()
    print(f"models: 2 x {LAYERS} x {width} x {width} float32, {mib(size)} each; machine: MemTotal "
          f"{mib(info['MemTotal'])}, MemAvailable {mib(info['MemAvailable'])} at start (a shared machine: "
          "the used memory below counts every process on it)")

    saved = root / "load_save_out"
    shutil.rmtree(saved, ignore_errors=True)
    result, seconds, peak = run([sys.executable, "-c", LOAD_SAVE, str(models / names[0]), str(saved)])
    shutil.rmtree(saved, ignore_errors=True)
    print(f"reference: load+save of one model: {seconds:.1f} s, machine peak used +{mib(peak)}"
          + ("" if result.returncode == 0 else f" (FAILED: exit {result.returncode})"))

    shutil.rmtree(ws / ".tpubuild", ignore_errors=True)
    shutil.rmtree(ws / "out", ignore_errors=True)
    trace = root / "trace.json"
    if args.memory_available is not None:
        os.environ["TPUBUILD_MEMORY_AVAILABLE"] = str(args.memory_available)
        print(f"the build runs under TPUBUILD_MEMORY_AVAILABLE={args.memory_available} ({mib(args.memory_available)})")
    result, seconds, peak = run([sys.executable, "-m", "tpubuild", "build", "-j", "2", "--json",
                                 "--profile", str(trace)], cwd=ws)
    os.environ.pop("TPUBUILD_MEMORY_AVAILABLE", None)
    try:
        document = json.loads(result.stdout)
    except ValueError:
        document = {}
    built = {name: all(r["status"] in ("built", "cached") for r in document.get("rows", []) if r["recipe"] == name)
             and any(r["recipe"] == name and r["stage"] == "publish" for r in document.get("rows", []))
             for name in names}
    print(f"tpubuild build -j 2 of both: exit {result.returncode}, {seconds:.1f} s, machine peak used +{mib(peak)} "
          f"({peak / max(size, 1):.2f}x one model's size)")
    from tpubuild.lock import read_lock

    for name in names:
        lock = read_lock(ws / "recipes" / f"{name}.lock.yaml") or {}
        figures = ", ".join(f"{s['stage']} {mib(s['peak_memory'])}" for s in lock.get("stages", [])
                            if "peak_memory" in s)
        print(f"  {name}: {'built' if built[name] else 'NOT built'}; lock file peak_memory: {figures or '-'}")
    try:
        events = json.loads(trace.read_text())["traceEvents"]
    except (OSError, ValueError, KeyError):
        events = []
    waited = [e["dur"] / 1e6 for e in events if e.get("ph") == "X" and e.get("name") == "waiting for memory"]
    print(f"  stages that waited for memory: {len(waited)}, {sum(waited):.1f} s in all")
    warnings = [line for line in result.stderr.splitlines() if "memory" in line]
    for line in warnings:
        print(f"  stderr: {line}")
    if result.returncode != 0:
        print("  " + "\n  ".join(result.stderr.strip().splitlines()[-5:]))
    print(f"both built: {'yes' if all(built.values()) else 'no'}")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
