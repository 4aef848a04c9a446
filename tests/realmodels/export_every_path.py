"""Run the export stage on every export path users take, in this process; print each
output's files and their SHA-256 as JSON.

`python -m tests.realmodels.export_every_path OUT [--perturb]` from the repository root.
tests/realmodels/test_reproducible_exports.py runs it twice, in two processes with other
hash seeds, one of them perturbed (before each export it traces throwaway functions, so
TensorFlow's per-process counters and the objects' addresses differ), and compares the
bytes. The paths run in one order in both: Keras names layers by a per-process count
(`dense`, `dense_1`), so, as in the export stage, each export's own process state matters.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from tests.cli import REPO

KERAS = "tests/realmodels/keras_exports.py"
JAX = "tests/realmodels/jax_models.py"
PATHS = {
    "keras_sequential": (KERAS, "export_sequential"),
    "keras_functional": (KERAS, "export_functional"),
    "keras_subclassed": (KERAS, "export_subclassed"),
    "keras_export_archive": (KERAS, "export_archive"),
    "keras_hub": (KERAS, "export_keras_hub"),
    "jax2tf": (JAX, "export_jax2tf"),
    "orbax": (JAX, "export_orbax"),
}
NEEDS = {"jax2tf": ("jax",), "orbax": ("jax", "orbax.export")}


def available() -> list[str]:
    """The paths this machine can export (JAX and orbax-export are test extras)."""
    def importable(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            return False

    return [name for name in PATHS if all(importable(m) for m in NEEDS.get(name, ()))]


def digests(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def perturb(rounds: int) -> list:
    """Trace and keep throwaway functions: TF's uid counter moves on, memory shifts."""
    import tensorflow as tf

    kept = []
    for index in range(rounds):
        function = tf.function(lambda x, k=index: tf.nn.relu(x * float(k + 1)))
        kept.append(function.get_concrete_function(tf.TensorSpec([None, 3], tf.float32)))
        kept.append(bytearray(4096 * (index + 1)))
    return kept


def main(out: Path, perturbed: bool) -> None:
    from tpubuild.stages import export
    from tpubuild.stages.base import StageContext

    names = available()
    found = {}
    kept = []
    for name in names:
        if perturbed:
            kept += perturb(7)
        script, function = PATHS[name]
        output = out / name
        output.mkdir(parents=True)
        export.run(None, output, {"script": script, "function": function}, StageContext(workspace=REPO))
        found[name] = digests(output)
    print(json.dumps(found, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--perturb" in sys.argv[2:])
