"""A worker imports TensorFlow without JAX (workers/lean_import.py); JAX still imports after."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.cli import REPO

PROBE = """
import json, sys
from tpubuild.workers import lean_import
lean_import.install()
import tensorflow
during = "jax" in sys.modules
from tensorflow.lite.python import util
import jax, jaxlib.mlir.ir
print(json.dumps({"during": during, "jit_none": util._jit is None, "after": jax.__name__}))
"""


def test_tensorflow_imports_without_jax_and_jax_imports_after_it():
    if importlib.util.find_spec("jax") is None:  # not importorskip: JAX stays out of this pytest worker
        pytest.skip("jax is not installed")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # TensorFlow's TFLite util took its no-JAX path; a stage's later `import jax` works.
    assert found == {"during": False, "jit_none": True, "after": "jax"}, found
