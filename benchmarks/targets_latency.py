"""Per-call latency of the example model (recipes/models/all_targets.py) on each serving target,
and the fused vs unfused op count of its LiteRT flatbuffer.

Without arguments: exports the example, converts it with the real `litert` stage twice
(`composites: all` and `none`), and times, on the same input, the source SavedModel in
TensorFlow and both flatbuffers in the LiteRT interpreter (median of --runs calls, after
warm-up; the interpreter's call resets the fused LSTM's state, as a stateless caller must).
With --built out/all_targets (a built recipe's publish directory), the published targets
are timed too: the CPU SavedModel directly, the XLA AOT library through the figures its
verify stage measured (the harness it compiles). Prints; asserts nothing.
Run: python3 benchmarks/targets_latency.py [--built out/all_targets] [--runs 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tpubuild.quiet import quiet_tensorflow

REPO = Path(__file__).resolve().parents[1]


def example() -> Any:
    spec = importlib.util.spec_from_file_location("all_targets", REPO / "recipes" / "models" / "all_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def convert(source: Path, root: Path, composites: str) -> Path:
    """The real `litert` stage, called as the engine calls it."""
    from tpubuild.stages.base import StageContext
    from tpubuild.targets.litert import stage as litert

    output = root / f"litert-{composites}"
    output.mkdir()
    options = litert.SPEC.options({"model": {"tags": ["serve"]}, "converter": {}, "verify": {},
                                   "targets": {"litert": {"composites": composites}}})
    litert.run(source, output, options, StageContext(root, inputs={"source": source}))
    return output


def tf_latency(saved_model: Path, sample: dict[str, np.ndarray], runs: int) -> float:
    import tensorflow as tf

    from tpubuild.verify.latency import median_call_seconds, signature_call

    function = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    return median_call_seconds(signature_call(function, sample), runs) * 1e6


def litert_latency(built: Path, sample: dict[str, np.ndarray], runs: int) -> float:
    from tpubuild.targets.litert.interpreter import LiteRTModel
    from tpubuild.verify.latency import median_call_seconds

    facts = json.loads((built / "litert.json").read_text())
    model = LiteRTModel(built / "model.tflite", stateful=facts["variable_tensors"] > 0)
    return median_call_seconds(lambda: model.invoke("serving_default", sample), runs) * 1e6


def describe_ops(built: Path) -> str:
    facts = json.loads((built / "litert.json").read_text())
    listed = ", ".join(f"{op} {n}" for op, n in sorted(facts["ops"].items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{facts['op_count']} ops ({listed})"


def latest_version(base: Path) -> Path | None:
    versions = sorted((int(p.name), p) for p in base.iterdir() if p.name.isdigit()) if base.is_dir() else []
    return versions[-1][1] if versions else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, help="a built recipe's publish directory, e.g. out/all_targets")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    quiet_tensorflow()
    model = example()
    rng = np.random.default_rng(0)
    sample = {"ids": rng.integers(0, model.VOCAB, size=(model.BATCH, model.STEPS)).astype(np.int32)}
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "source"
        model.export(str(source))
        fused, unfused = convert(source, root, "all"), convert(source, root, "none")
        print(f"LiteRT flatbuffer, composites fused:   {describe_ops(fused)}")
        print(f"LiteRT flatbuffer, composites unfused: {describe_ops(unfused)}")
        rows.append(("source SavedModel in TensorFlow", f"{tf_latency(source, sample, args.runs):9.1f} us"))
        rows.append(("LiteRT interpreter, fused", f"{litert_latency(fused, sample, args.runs):9.1f} us"))
        rows.append(("LiteRT interpreter, unfused", f"{litert_latency(unfused, sample, args.runs):9.1f} us"))
    if args.built:
        cpu = latest_version(args.built / "cpu_savedmodel")
        rows.append(("CPU SavedModel (published)",
                     f"{tf_latency(cpu, sample, args.runs):9.1f} us" if cpu else "not built"))
    else:
        rows.append(("CPU SavedModel", "pass --built out/all_targets"))
    print(f"per-call latency, median of {args.runs} calls on one [1, 8] input:")
    for name, figure in rows:
        print(f"  {name:<36} {figure}")
    # The XLA AOT library in the same run: its benchmark compiles the example with the real
    # stages and times Run() in the C++ harness beside the source called through TensorFlow.
    print("XLA AOT library (benchmarks/xla_aot_latency.py, same run):", flush=True)
    script = Path(__file__).with_name("xla_aot_latency.py")
    subprocess.run([sys.executable, str(script), "recipes/models/all_targets.py", "1"], check=True)


if __name__ == "__main__":
    main()
