"""`tpubuild validate` on a workspace of 200 recipes: wall time and TensorFlow-freeness.

Target: under 1 s, no TensorFlow import. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from timing import best_of, probe_in_process

RECIPE = """\
# yaml-language-server: $schema=../schemas/recipe.schema.json
model: {{saved_model: ../models/m{i}}}
converter:
  tpu_functions:
    - function_alias: tpu_func
  batch_options:
    - num_batch_threads: 2
      max_batch_size: 8
      batch_timeout_micros: 5000
      allowed_batch_sizes: [2, 4, 8]
  bfloat16_optimization_options: {{scope: TPU, filterlist: [Softmax]}}
verify: {{samples: 16, rtol: 0.02}}
"""


def main(count: int = 200, runs: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "tpubuild.yaml").write_text("recipes: [recipes/*.yaml]\n")
        (root / "recipes").mkdir()
        for i in range(count):
            (root / "models" / f"m{i}").mkdir(parents=True)
            (root / "models" / f"m{i}" / "saved_model.pb").write_bytes(b"")
            (root / "recipes" / f"r{i:03d}.yaml").write_text(RECIPE.format(i=i))
        best = best_of(runs, [sys.executable, "-m", "tpubuild", "validate"], root)
        python_start = best_of(runs, [sys.executable, "-c", "pass"], root)
        print(f"tpubuild validate, {count} recipes: {best:.3f} s wall (best of {runs}; target < 1 s)")
        print(f"  for reference, a bare python start: {python_start:.3f} s")
        probe_in_process(["validate"], root)


if __name__ == "__main__":
    main()
