"""Per-call latency of the example model's XLA AOT library beside the source in TensorFlow.

Exports the example model (recipes/models/all_targets.py, `export(output_dir)`), runs the
real `xla_aot` and `xla_aot_verify` stages on it (tfcompile, g++, the generated harness) and
prints, from the same run: the AOT function's Run() per call (median of the harness's
calls, inputs already in its buffers) and the source's signature called from Python through
TensorFlow (median, same inputs), with the verification's error figures.

Usage: python benchmarks/xla_aot_latency.py [MODEL_SCRIPT] [BATCH_SIZES]
  MODEL_SCRIPT defaults to recipes/models/all_targets.py; BATCH_SIZES e.g. "1" (that model's
  input shape is fixed at batch 1). The XLA AOT runtime's objects are cached under
  ./.tpubuild/xla_aot_runtime (BENCH_WORKSPACE to change).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from tpubuild.quiet import quiet_tensorflow


def main(argv: list[str]) -> int:
    quiet_tensorflow()
    from tpubuild.stages.base import StageContext
    from tpubuild.targets.xla_aot import stage as xla_aot
    from tpubuild.targets.xla_aot import verify_stage as xla_aot_verify

    script = Path(argv[0] if argv else "recipes/models/all_targets.py")
    batch_sizes = [int(b) for b in (argv[1] if len(argv) > 1 else "1").split(",")]
    spec = importlib.util.spec_from_file_location("example_model", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workspace = Path(os.environ.get("BENCH_WORKSPACE", ".")).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        source, built, checked = Path(tmp) / "source", Path(tmp) / "xla_aot", Path(tmp) / "verify"
        module.export(str(source))
        built.mkdir(), checked.mkdir()
        options = {"tags": ["serve"], "signatures": ["serving_default"], "batch_sizes": batch_sizes}
        start = time.perf_counter()
        xla_aot.run(source, built, options, StageContext(workspace, inputs={"source": source}))
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        result = xla_aot_verify.run(
            source, checked, {**options, "rtol": None, "atol": None, "samples": 32, "seed": 0,
                              "representative_datasets": {}},
            StageContext(workspace, inputs={"source": source, "xla_aot": built}),
        )
        verify_s = time.perf_counter() - start
    summary = result.summary
    print(f"model: {script}  (tfcompile {compile_s:.1f} s, harness build + verify {verify_s:.1f} s)")
    print(f"verified: passed={summary['passed']} max_abs_error={summary['max_abs_error']:.3g} "
          f"tolerance={summary['tolerance']['kind']} rtol={summary['tolerance']['rtol']} "
          f"atol={summary['tolerance']['atol']} samples={summary['samples']['serving_default']['count']}")
    print(f"{'library':40} {'XLA AOT ns/call':>16} {'TensorFlow ns/call':>19} {'ratio':>8}  bytes")
    for lib in summary["libraries"]:
        aot, tf_ns = lib["latency_ns"]["xla_aot"], lib["latency_ns"]["tensorflow"]
        print(f"{lib['cpp_class']:40} {aot:>16,} {tf_ns:>19,} {tf_ns / max(aot, 1):>7.0f}x  "
              f"{sum(lib['files'].values()):,}")
    print(f"XLA AOT: {summary['latency_method']['xla_aot']}")
    print(f"TensorFlow: {summary['latency_method']['tensorflow']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
