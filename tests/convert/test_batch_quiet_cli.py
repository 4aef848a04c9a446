"""TensorFlow's own log lines stay off the terminal of `tpubuild convert` / `inspect`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cli import tpubuild

# What TensorFlow's logging looks like: absl/glog-style C++ lines ("I0000 00:00:... port.cc:153]"),
# the absl banner, the timestamped tsl format ("2026-01-01 ...: I tensorflow/..."), and the
# Python logger's and AutoGraph's notices.
TF_LINE = re.compile(
    r"^[IWEF]\d{4} \d\d:\d\d:\d\d|absl::InitializeLog|^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] |"
    r"oneDNN|cuda|This TensorFlow binary|AutoGraph|^WARNING:tensorflow|^INFO:tensorflow",
    re.IGNORECASE,
)
CONVERTER = {
    "tpu_functions": [{"function_alias": "tpu_func"}],
    "batch_options": [{"num_batch_threads": 2, "max_batch_size": 8, "batch_timeout_micros": 1000,
                       "allowed_batch_sizes": [4, 8], "max_enqueued_batches": 10}],
}


# The user's environment: none of TensorFlow's logging switches set.
USER_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TPUBUILD_", "AUTOGRAPH"))}


def _tf_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if TF_LINE.search(line)]


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("quiet")
    (root / "converter.yaml").write_text(yaml.safe_dump(CONVERTER))
    out = root / "out"
    done = tpubuild(None, "convert", str(models["toy"]), str(out), "--options-file", str(root / "converter.yaml"),
                    base_env=USER_ENV)
    return out, done


def test_convert_prints_tpubuild_lines_only(converted, models):
    out, done = converted
    assert done.returncode == 0, done.stderr
    assert _tf_lines(done) == []
    assert done.stdout == f"converted {models['toy']} -> {out} (tpu, bfloat16, io_shape, batch)\n"
    stages = ("tpu: ", "bfloat16: ", "io_shape: ", "batch: ")
    assert [line for line in done.stderr.splitlines() if not line.startswith(stages)] == []


@pytest.fixture(scope="module")
def quiet_inspect(converted) -> subprocess.CompletedProcess:
    return tpubuild(None, "inspect", str(converted[0]), base_env=USER_ENV)


def test_inspect_is_quiet(quiet_inspect):
    assert quiet_inspect.returncode == 0, quiet_inspect.stderr
    assert (_tf_lines(quiet_inspect), quiet_inspect.stderr) == ([], "")


def test_debug_shows_tensorflows_log_and_verbose_does_not(converted, quiet_inspect):
    # TensorFlow's lines come back, so the pattern above really matches what TensorFlow
    # prints on this machine; tpubuild's own output is the same.
    loud = tpubuild(None, "--debug", "inspect", str(converted[0]), base_env=USER_ENV)
    assert loud.returncode == 0
    assert _tf_lines(loud) != []
    assert loud.stdout == quiet_inspect.stdout
    # -v asks tpubuild for more rows (build), not for TensorFlow's log (issue 30).
    verbose = tpubuild(None, "-v", "inspect", str(converted[0]), base_env=USER_ENV)
    assert (verbose.returncode, _tf_lines(verbose), verbose.stdout) == (0, [], quiet_inspect.stdout)
