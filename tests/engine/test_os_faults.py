"""The machine failing under a build: a full disk anywhere (cache, out/, logs, the cache
index) is one line naming the path, exit 1, nothing published; the worker logs a
failure points to outlive later builds until that recipe builds successfully."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.cli import REPO, tpubuild
from tests.engine.conftest import export_recipe, source_recipe, statuses

# Each step of the disk-full scenario, run in a mount namespace of its own (`unshare -rm`:
# no root needed where user namespaces are allowed) on a real tmpfs: `fill` writes a
# file until the file system says ENOSPC, `free` removes it.
DRIVER = r"""
import json, os, subprocess, sys
disk, ws_src, out = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", disk], check=True)
ws = os.path.join(disk, "ws")
subprocess.run(["cp", "-r", ws_src, ws], check=True)
steps = []
def build():
    done = subprocess.run([sys.executable, "-m", "tpubuild", "build"], cwd=ws, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.environ["TPUBUILD_REPO"]})
    lock = os.path.join(ws, "recipes", "toy.lock.yaml")
    versions = os.path.join(ws, "out", "toy")
    steps.append({"code": done.returncode, "stderr": done.stderr,
                  "versions": sorted(os.listdir(versions)) if os.path.isdir(versions) else [],
                  "lock": open(lock).read() if os.path.exists(lock) else None})
build()
recipe = os.path.join(ws, "recipes", "toy.yaml")
with open(recipe) as f:
    text = f.read()
with open(recipe, "w") as f:
    f.write(text.replace("batch_timeout_micros: 100", "batch_timeout_micros: 200"))  # a new model
try:
    with open(os.path.join(disk, "filler"), "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
except OSError as exc:
    assert exc.errno == 28, exc
build()
os.unlink(os.path.join(disk, "filler"))
build()
with open(out, "w") as f:
    json.dump({"disk": disk, "steps": steps}, f)
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || "
                            "mount -t tmpfs -o size=1m tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` and a tmpfs mount (user namespaces)")
def test_a_full_disk_fails_the_build_in_one_line_and_publishes_nothing(make_workspace, tmp_path):
    ws = make_workspace({"toy": source_recipe("toy")})
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    done = subprocess.run(["unshare", "-rm", sys.executable, str(tmp_path / "driver.py"), str(disk), str(ws),
                           str(tmp_path / "result.json")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TPUBUILD_REPO": str(REPO)})
    assert done.returncode == 0, done.stderr
    first, full, freed = json.loads((tmp_path / "result.json").read_text())["steps"]
    assert (first["code"], first["versions"]) == (0, ["1"]), first["stderr"]
    assert full["code"] == 1
    assert "Traceback" not in full["stderr"] and "internal error" not in full["stderr"], full["stderr"]
    faults = [line for line in full["stderr"].splitlines() if "No space left on device: " in line]
    assert faults and all(f"No space left on device: {disk}/ws/" in line for line in faults), full["stderr"]
    # Nothing published, the lock file as the last good build left it.
    assert (full["versions"], full["lock"]) == (["1"], first["lock"])
    assert (freed["code"], freed["versions"]) == (0, ["1", "2"]), freed["stderr"]


DIES = ("import os\n\n\ndef export(output_dir):\n    print('about to die', flush=True)\n    os._exit(3)\n")


CRASHES = ("import ctypes\n\n\ndef read_nothing():\n    return ctypes.string_at(0)\n\n\n"
           "def export(output_dir):\n    read_nothing()\n")


def test_a_worker_crashed_by_native_code_names_the_signal_and_the_frame(make_workspace):
    """A segfault in a stage (a kernel, an op library, user code through ctypes) leaves no
    Python traceback: the one line names the signal and, from faulthandler's dump in the
    worker's log, the function it crashed in."""
    ws = make_workspace({"crashes": export_recipe("crashes", "models/crashes.py", "models/helper.py")})
    (ws / "recipes" / "models" / "crashes.py").write_text(CRASHES)
    result = tpubuild(ws, "build", "crashes")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    line = next(line for line in result.stderr.splitlines() if "stage export" in line)
    assert "the worker process died (exit code -11, SIGSEGV) while running stage export: " \
           "Segmentation fault in string_at (" in line, line
    assert "crashes.py" in open(line.rsplit("; see ", 1)[1]).read()  # the whole stack is in the log


@pytest.mark.slow
def test_the_log_a_failure_points_to_outlives_later_builds_until_the_recipe_builds(make_workspace):
    ws = make_workspace({"dies": export_recipe("dies", "models/dies.py", "models/helper.py"),
                         "toy": source_recipe("toy")})
    (ws / "recipes" / "models" / "dies.py").write_text(DIES)
    result = tpubuild(ws, "build", "dies")
    assert result.returncode == 1
    line = next(line for line in result.stderr.splitlines() if "stage export" in line)
    assert "the worker process died (exit code 3) while running stage export" in line, line
    log = line.rsplit("; see ", 1)[1]
    assert "about to die" in open(log).read()
    # Another recipe builds: its workers write other logs.
    assert tpubuild(ws, "build", "toy").returncode == 0
    assert "about to die" in open(log).read(), "the log the failure pointed to was overwritten"
    # The recipe builds again and fails again: both failures' logs are there.
    assert tpubuild(ws, "build", "dies").returncode == 1
    assert "about to die" in open(log).read()
    # Fixed and built: its failures' logs go (at the end of that build).
    (ws / "recipes" / "models" / "dies.py").write_text(
        "import shutil\nfrom pathlib import Path\n\n\ndef export(output_dir):\n"
        "    shutil.copytree(Path(__file__).parent / 'prebuilt', output_dir, dirs_exist_ok=True)\n")
    result = tpubuild(ws, "build", "--json", "dies")
    assert result.returncode == 0, result.stderr
    assert statuses(json.loads(result.stdout), "dies")["publish"] == "built"
    logs = ws / ".tpubuild" / "logs"
    assert not [p for p in logs.glob("worker-*.log") if "about to die" in p.read_text()]
