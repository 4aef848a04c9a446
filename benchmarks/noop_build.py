"""No-op `tpubuild build` and `tpubuild build --check` of a monorepo: N recipes in 20 team
folders, each recipe with its own SavedModel directory, timed beside `python -c pass` in the
same run (issue 48's table).

Layout: `teams/teamNN/rNNNN.yaml`, each naming `teams/teamNN/models/rNNNN/`, a copy of one
tiny SavedModel saved once with TensorFlow. The copies are byte for byte the same, so their
stage keys are the same: the first build runs the stages once and every other recipe finds
them in the cache and publishes its own version (its own `out/rNNNN/1/`, its own lock file).
That is sound, not a shortcut: it is what the build does for any two recipes whose inputs
hash the same, and the no-op still stats, and the fast paths still prove, every recipe's own
files. The recipe is the cheapest that publishes: no TPU function, no bfloat16, no IO shape
change, two verify samples.

What is printed (medians of fresh processes, each command paired run by run with
`python -c pass`, so that a drift of the machine's speed moves both):
  no-op `tpubuild build` / `python -c pass`        goal <= 12x  (2,000 recipes)
  `tpubuild build --check` / `python -c pass`      goal <= 6x   (2,000 recipes)
  no-op of the largest count / no-op of the smallest   goal <= 2.5x
Asserts nothing in its figures (each command must exit 0 with its up-to-date line).

Usage: python benchmarks/noop_build.py [COUNT ...]      (default: 200 2000)
       NOOP_BENCH_KEEP=DIR keeps the workspaces in DIR and reuses what is built there.
       NOOP_BENCH_RUNS=N pairs per figure (default 11).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEAMS = 20

SAVE = """
import sys, tensorflow as tf
class Tiny(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable([[1.0], [2.0]])
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w)}
m = Tiny()
tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.serve})
"""

RECIPE = """\
name: r{i:04d}
model: {{saved_model: models/r{i:04d}}}
converter: {{disable_default_optimizations: true}}
verify: {{samples: 2}}
"""

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}


def lay_out(root: Path, model: Path, count: int) -> None:
    """`count` recipes in TEAMS team folders, each with its own copy of `model`."""
    root.mkdir(parents=True)
    (root / "tpubuild.yaml").write_text('recipes: ["teams/*/*.yaml"]\noutput_dir: out\ncache_dir: ../cache\n'
                                        "keep_versions: 2\n")
    for i in range(count):
        team = root / "teams" / f"team{i % TEAMS:02d}"
        shutil.copytree(model, team / "models" / f"r{i:04d}")
        (team / f"r{i:04d}.yaml").write_text(RECIPE.format(i=i))


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=ENV, check=False)


def paired(runs: int, a: list[str], b: list[str], cwd: Path, expect: str) -> tuple[float, float, float]:
    """(median wall of A, median wall of B, median of the pairwise ratios A/B): A and B in
    turn, after one warm-up of each; A's output must end with `expect`."""
    walls_a, walls_b, ratios = [], [], []
    for i in range(runs + 1):
        start = time.perf_counter()
        out = run(a, cwd)
        wall_a = time.perf_counter() - start
        assert out.returncode == 0 and out.stdout.rstrip().endswith(expect), out.stdout[-500:] + out.stderr[-2000:]
        start = time.perf_counter()
        run(b, cwd)
        wall_b = time.perf_counter() - start
        if i:  # the first pair warms the page cache
            walls_a.append(wall_a)
            walls_b.append(wall_b)
            ratios.append(wall_a / wall_b)
    return statistics.median(walls_a), statistics.median(walls_b), statistics.median(ratios)


def compile_tpubuild() -> None:
    """tpubuild's bytecode, as pip writes it on install (an editable checkout under
    PYTHONDONTWRITEBYTECODE would compile every module on every run)."""
    import compileall

    import tpubuild

    compileall.compile_dir(str(Path(tpubuild.__file__).parent), quiet=1)


def main(counts: list[int]) -> None:
    keep = os.environ.get("NOOP_BENCH_KEEP")
    runs = int(os.environ.get("NOOP_BENCH_RUNS", "11"))
    compile_tpubuild()
    cli = [sys.executable, "-m", "tpubuild"]
    python = [sys.executable, "-c", "pass"]
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()) as tmp:
        base = Path(tmp)
        model = base / "model"
        if not (model / "saved_model.pb").is_file():
            subprocess.run([sys.executable, "-c", SAVE, str(model)], check=True, capture_output=True)
        noop: dict[int, float] = {}
        for count in counts:
            root = base / f"ws{count}" / "ws"  # cache_dir: ../cache, one per count
            if not (root / "tpubuild.yaml").is_file():
                lay_out(root, model, count)
            start = time.perf_counter()
            first = run([*cli, "build", "-j", "2", "-q"], root)
            assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
            print(f"{count} recipes in {TEAMS} team folders: first build {time.perf_counter() - start:.1f} s "
                  f"({first.stdout.strip().splitlines()[-1]})")
            run([*cli, "build"], root)  # a second build: the memo is written for files older than a build
            a, b, ratio = paired(runs, [*cli, "build"], python, root, "cached")
            noop[count] = a
            print(f"  no-op `tpubuild build`: {a:.3f} s; `python -c pass` {b:.3f} s; {ratio:.1f}x "
                  f"(median of {runs} pairs; goal <= 12x at 2,000)")
            a, b, ratio = paired(runs, [*cli, "build", "--check"], python, root, "up to date")
            print(f"  `tpubuild build --check`: {a:.3f} s; `python -c pass` {b:.3f} s; {ratio:.1f}x "
                  f"(goal <= 6x at 2,000)")
        if len(noop) > 1:
            small, large = min(noop), max(noop)
            print(f"no-op of {large} / no-op of {small}: {noop[large] / noop[small]:.2f}x (goal <= 2.5x)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [200, 2000])
