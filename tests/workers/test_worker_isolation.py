"""What a worker may run: only tpubuild, the toolchain and the workspace's own code.

The directory a build is started from is not the workspace and is not keyed: a module
there must never be imported by a worker (neither shadowing `json` nor answering an export
script's `import`), and every tpubuild module a stage runs in a subprocess is in its key.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.cli import REPO
from tests.engine.conftest import export_recipe
from tpubuild.keys import PACKAGE_ROOT, closure
from tpubuild.pipeline import ENGINE_STEPS, STAGE_ORDER, stage_module


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is 3.11+ (workers get an empty cwd instead)")
def test_neither_the_callers_directory_nor_the_users_home_reaches_a_stage(make_workspace, tmp_path):
    """One build, started from a directory holding modules and with a HOME holding a Keras
    configuration: no worker may import the former, or read the latter (Keras reads
    $HOME/.keras/keras.json, floatx and backend, when it is imported: a stage that saw the
    user's home would build from a file no key covers)."""
    home = tmp_path / "home"
    (home / ".keras").mkdir(parents=True)
    (home / ".keras" / "keras.json").write_text('{"floatx": "float16", "backend": "tensorflow"}')
    ws = make_workspace({"iso": export_recipe("iso", "models/iso_export.py", "models/helper.py")})
    (ws / "recipes" / "models" / "iso_export.py").write_text(
        (ws / "recipes" / "models" / "tiny_export.py").read_text().replace(
            "def export(", "import os\n\ntry:\n    import stray_helper  # only in the caller's directory\n"
            "    raise SystemExit('stray_helper was imported from the caller\\'s directory')\n"
            "except ImportError:\n    pass\n\n\ndef _home_is_private():\n"
            "    import keras\n\n    assert keras.config.floatx() == 'float32', keras.config.floatx()\n"
            "    assert os.environ['HOME'] != " + repr(str(home)) + "\n\n\ndef export(", 1).replace(
            "def export(output_dir):\n", "def export(output_dir):\n    _home_is_private()\n", 1))
    caller = tmp_path / "caller"
    caller.mkdir()
    marker = tmp_path / "shadowed"
    for name in ("json", "numpy", "stray_helper"):  # a worker imports the first two itself
        (caller / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    # `python -P -m tpubuild` as the `tpubuild` console script runs: its own sys.path[0] is
    # the script's directory, not the caller's; what is tested is what the workers see.
    result = subprocess.run([sys.executable, "-P", "-m", "tpubuild", "--workspace", str(ws), "build"], cwd=caller,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"a worker imported {marker.read_text()!r} from the build's current directory"
    assert not [p for p in (ws / ".tpubuild" / "logs").iterdir() if "-home-" in p.name], "a worker's home was left"


def _subprocess_modules(path) -> set[str]:
    """tpubuild modules a source file runs as `python -m NAME` (a '-m' then a string)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, name in zip(items, items[1:]):
                if isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(name, ast.Constant) \
                        and str(name.value).startswith("tpubuild."):
                    found.add(name.value)
    return found


def test_every_module_a_stage_runs_in_a_subprocess_is_in_its_code_digest():
    stages = [m for m in STAGE_ORDER if m not in ENGINE_STEPS]
    checked = 0
    for stage in stages:
        files = closure((stage_module(stage),))
        for path in files.values():
            for module in _subprocess_modules(path):
                checked += 1
                assert module in files, f"stage {stage} runs {module} (from {path.relative_to(PACKAGE_ROOT)}) " \
                                        "but its code digest does not cover it"
    assert checked, "no stage starts a tpubuild subprocess: the check above checked nothing"


def test_a_worker_runs_only_stages_that_load_the_libraries_it_loaded(tmp_path):
    """Ops a worker registered (op_libraries) stay registered: it is reused for stages
    loading exactly the same installed modules (BERT behind tensorflow_text: one worker for
    all its stages instead of one per stage), never for a stage loading others or none
    (that stage could pass there and fail in a fresh worker), and never after a `.so`
    (its file may change between two stages). Real worker processes."""
    from tpubuild.digests import worker_env
    from tpubuild.workers import WorkerPool, loaded_libraries

    text = {"options": {"op_libraries": [{"module": "tensorflow_text", "version": "2.21.1"}]}}
    none = {"options": {}}
    shared = {"options": {"op_libraries": [{"module": "tensorflow_text", "version": "2.21.1"},
                                           {"library": "ops/custom.so"}]}}
    assert loaded_libraries(none) == () and loaded_libraries(shared) is None
    pool = WorkerPool(1, tmp_path / "logs", worker_env())
    try:
        first = pool._acquire(loaded_libraries(text))
        first.libraries = loaded_libraries(text)  # what run() records after its stage
        pool.idle.put(first)
        assert pool._acquire(loaded_libraries(text)) is first  # the same libraries: reused
        pool.idle.put(first)
        other = pool._acquire(loaded_libraries(none))  # none loaded: not that worker
        assert other is not first and other.libraries == ()
        assert first.proc.wait(timeout=30) is not None  # closed to make room (pool size 1)
        pool.idle.put(other)
        assert pool._acquire(loaded_libraries(text)) is other  # a clean worker takes any
    finally:
        pool.close(kill=True)


@pytest.mark.slow
def test_a_stage_running_a_large_model_gets_a_worker_of_its_own(make_workspace):
    """TensorFlow keeps part of everything a process loaded (~200 MiB after ResNet50's
    stages), so on a large model a stage that loads and runs models (verify, report,
    warmup) would peak on top of what ran before it: there it runs in a worker of its own.
    On small models a TensorFlow import per stage would cost more than it saves: they share
    workers. The threshold is lowered here to put the small model over it; read from the
    real build's worker logs."""
    import re
    import shutil

    from tests.engine.conftest import build_json, source_recipe
    from tpubuild.pipeline import spec

    def per_worker(ws):
        return [re.findall(r"^--- stage (\S+) \(pid", log.read_text(), re.M)
                for log in sorted((ws / ".tpubuild" / "logs").glob("worker-*.log"))]

    ws = make_workspace({"toy": source_recipe("toy")})
    build_json(ws)
    shared = per_worker(ws)
    assert any(len(stages) > 1 and any(spec(s).runs_models for s in stages) for stages in shared), shared
    # A small model starts no spare for a stage of its own either: it would import TensorFlow
    # for nothing. The one spare is the cold source's (WorkerPool.prestart): its import ran
    # beside the source's copy into the store, and the first stage after it ran in it.
    spares = [log.read_text() for log in (ws / ".tpubuild" / "logs").glob("worker-*.log")
              if "--- spare" in log.read_text()]
    assert len(spares) == 1 and "--- stage " in spares[0], spares

    shutil.rmtree(ws / ".tpubuild")  # cache and logs: build every stage again
    build_json(ws, env={"TPUBUILD_OWN_WORKER_MIN_BYTES": "1"})
    own = per_worker(ws)
    # No stage that runs models after another in one worker, but verify's, handed to report
    # (engine/loop.py HANDOFF: the CPU twin it loaded is report's HLO; test_worker_handoff.py).
    # The stage before verify (no models of its own to leave behind but the transform's)
    # hands its worker on to verify: one TensorFlow import less (engine/loop.py _hands_on).
    for stages in own:
        running = [stage for stage in stages if spec(stage).runs_models]
        assert not running or stages[-len(running):] == running, own
        assert len(running) <= 1 or running == ["verify", "report"], own
    [verifying] = [stages for stages in own if "verify" in stages]
    assert len(verifying) > 3 and verifying[-2:] == ["verify", "report"], own
    # The build left no worker running.
    logs = {tuple(stages): log.read_text() for stages, log in
            zip(own, sorted((ws / ".tpubuild" / "logs").glob("worker-*.log")))}
    for pid in {int(p) for text in logs.values() for p in re.findall(r"\(pid (\d+)\)", text)}:
        assert "tpubuild.workers.process" not in _cmdline(pid), f"worker {pid} outlived the build"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_an_unused_spare_is_stopped_at_once_when_the_build_ends(tmp_path):
    """A spare (a worker that imported TensorFlow for a later stage of its own) that no stage
    took ran nothing: closing the pool kills it rather than waiting for its import and its
    exit (a build would end seconds later for nothing). Real worker processes."""
    import threading
    import time

    from tpubuild.digests import worker_env
    from tpubuild.workers import WorkerPool

    pool = WorkerPool(1, tmp_path / "logs", worker_env())
    asking = [threading.Thread(target=pool._start_spare) for _ in range(4)]  # -j: stages ask at once
    for thread in asking:
        thread.start()
    for thread in asking:
        thread.join()
    spare = pool.spare
    pool._start_spare()  # one spare at most
    assert pool.spare is spare and len(pool.all) == 1
    assert spare.proc.poll() is None
    started = time.monotonic()
    pool.close()
    assert spare.proc.poll() is not None
    assert time.monotonic() - started < 5, "close() waited for the spare's import"
    assert not list((tmp_path / "logs").glob("*-home-*")), "the spare's home was left"


# Run in a process of its own: getrusage's children maximum of the pytest worker holds
# whatever builds it ran before.
STAGE_PEAK_CHECK = """
import subprocess, sys
from tpubuild.workers.process import _peak_rss_bytes, _rusage_peak, _stage_peak

grow = "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096])"  # touched: resident
before = _rusage_peak("RUSAGE_CHILDREN")
assert not before, before  # no child yet
subprocess.run([sys.executable, "-c", grow], check=True)
after = _rusage_peak("RUSAGE_CHILDREN")
assert after >= 400 * 2**20 > _peak_rss_bytes(), (after, _peak_rss_bytes())
assert _stage_peak(before) == after
# A later stage whose child stayed below that maximum: its own peak, not the earlier child's.
subprocess.run([sys.executable, "-c", "pass"], check=True)
assert _stage_peak(after) == _peak_rss_bytes()
"""


def test_a_stage_peak_counts_a_process_it_started_when_that_one_peaked_higher():
    """A stage's `peak_rss_bytes` is the worker's own peak or that of a process the stage
    started and waited for, when higher (xla_aot runs tfcompile in a process of its own:
    ResNet50 peaks at ~2.2 GB there while its worker holds ~550 MiB). Real processes,
    measured by the kernel (getrusage RUSAGE_CHILDREN)."""
    done = subprocess.run([sys.executable, "-c", STAGE_PEAK_CHECK], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr


def test_an_own_worker_threshold_that_is_not_a_number_stops_the_build_before_it_starts(make_workspace):
    """TPUBUILD_OWN_WORKER_MIN_BYTES=64M was ignored without a word (the default applied):
    now one line naming the variable and what it takes, exit 2, nothing built."""
    from tests.cli import tpubuild
    from tests.engine.conftest import source_recipe

    ws = make_workspace({"toy": source_recipe("toy")})
    for command in (("build",), ("build", "--dry-run")):
        result = tpubuild(ws, *command, env={"TPUBUILD_OWN_WORKER_MIN_BYTES": "64M"})
        assert result.returncode == 2, result.stderr
        assert result.stderr == ("error: TPUBUILD_OWN_WORKER_MIN_BYTES='64M': expected a whole number of bytes "
                                 "(default 67108864)\n")
        assert "Traceback" not in result.stdout + result.stderr
    assert not (ws / "out").exists()


def test_a_spare_loads_the_op_libraries_of_the_stage_it_is_for_and_only_such_a_stage_takes_it(tmp_path):
    """A spare started for a later stage of a recipe with op_libraries loads them while it
    waits (tensorflow_text: 0.2 s off that stage); registered ops stay registered, so a
    stage loading other libraries or none never gets it. Real worker processes."""
    from tpubuild.digests import worker_env
    from tpubuild.workers import WorkerPool, loaded_libraries

    entries = [{"module": "tensorflow_text", "version": "2.21.1"}]
    text = loaded_libraries({"options": {"op_libraries": entries}})
    pool = WorkerPool(1, tmp_path / "logs", worker_env())
    try:
        pool._start_spare(entries)
        assert pool._take_spare(loaded_libraries({"options": {}})) is None  # none loaded: not that one
        spare = pool._take_spare(text)
        assert spare is not None and spare.libraries == text and pool.spare is None
        spare.proc.stdin.close()  # it reads EOF once its imports are done, and exits
        assert spare.proc.wait(timeout=300) == 0
        assert "tensorflow, tensorflow_text imported in" in spare.log_path.read_text()
        pool._start_spare()  # for a stage of a recipe without op libraries: a clean spare, taken by any
        assert pool._take_spare(text) is not None
    finally:
        pool.close(kill=True)
