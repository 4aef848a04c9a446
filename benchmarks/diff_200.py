"""`tpubuild diff` on a git repository holding 200 recipes: wall time and TensorFlow-freeness.

Recipes like benchmarks/noop_build.py's (TPU placement and batching, one model each),
sharing their batching through an `extends` base. Nothing is built (no lock files, no
cache): diff reads the models only to hash them, so each model directory holds a
saved_model.pb and a variables file of random bytes of a tiny SavedModel's size.
Measured: no change, one recipe edited, and the shared base edited (every recipe
affected: the worst case, each one also resolved against the cache).
Target: under 1 s for 200 recipes. Prints the figures; asserts nothing.
Usage: python3 benchmarks/diff_200.py [RECIPES]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import probe_in_process

BASE = """\
converter:
  batch_options:
    - {num_batch_threads: 1, max_batch_size: 8, batch_timeout_micros: TIMEOUT, allowed_batch_sizes: [2, 4, 8],
       max_enqueued_batches: 10, experimental: {signature_name: serving_default}}
verify: {samples: 2}
"""

RECIPE = """\
# Recipe {i}.
name: r{i:03d}
extends: common/base.yaml
model: {{saved_model: ../models/m{i:03d}}}
converter:
  tpu_functions: [{{function_alias: tpu_func}}]
"""


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b", *args],
                   check=True, capture_output=True)


def repository(root: Path, count: int) -> None:
    (root / "recipes" / "common").mkdir(parents=True)
    (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
    (root / ".gitignore").write_text("/.tpubuild/\n")
    (root / "recipes" / "common" / "base.yaml").write_text(BASE.replace("TIMEOUT", "1000"))
    for i in range(count):
        model = root / "models" / f"m{i:03d}"
        (model / "variables").mkdir(parents=True)
        (model / "saved_model.pb").write_bytes(os.urandom(24_000))
        (model / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(400))
        (model / "variables" / "variables.index").write_bytes(os.urandom(150))
        (root / "recipes" / f"r{i:03d}.yaml").write_text(RECIPE.format(i=i))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "recipes")


def timed(root: Path, runs: int = 5) -> tuple[float, str]:
    best, summary = float("inf"), ""
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tpubuild", "diff", "main"], cwd=root, capture_output=True,
                              text=True)
        best = min(best, time.perf_counter() - start)
        assert done.returncode == 0, done.stderr
        summary = done.stdout.splitlines()[1]
    return best, summary


def main(count: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        repository(root, count)
        print(f"`tpubuild diff main` on {count} recipes (best of 5; target < 1 s):")
        seconds, summary = timed(root)
        print(f"  no change: {seconds:.3f} s ({summary})")
        recipe = root / "recipes" / "r007.yaml"
        recipe.write_text(recipe.read_text() + "verify: {samples: 4}\n")
        seconds, summary = timed(root)
        print(f"  one recipe edited: {seconds:.3f} s ({summary})")
        (root / "recipes" / "common" / "base.yaml").write_text(BASE.replace("TIMEOUT", "2000"))
        seconds, summary = timed(root)
        print(f"  the shared base edited: {seconds:.3f} s ({summary})")
        probe_in_process(["diff", "main"], root)
        python = min(_python() for _ in range(3))
        print(f"  reference, same run: `python -c pass` {python:.3f} s")


def _python() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
