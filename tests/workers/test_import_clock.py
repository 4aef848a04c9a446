"""A worker's TensorFlow import (workers/import_clock.py): timed apart from its stage, and
what it made frozen out of later collections' scans, while what comes after is collected."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.engine.conftest import REPO

PROBE = """
import gc, json
from tpubuild.workers import import_clock
clock = import_clock.install()
import tensorflow
frozen = gc.get_freeze_count()
class Cycle:
    pass
a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b
collected = gc.collect()
print(json.dumps({"timed": clock.take() > 0, "frozen": frozen, "collected": collected}))
"""


def test_tensorflows_import_is_timed_and_frozen_and_later_garbage_still_collected():
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # TensorFlow's objects (hundreds of thousands) are frozen; a cycle made after is collected.
    assert found["timed"] and found["frozen"] > 100_000 and found["collected"] >= 2, found
