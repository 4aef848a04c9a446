"""Builds through a real local Ray cluster give what local builds give: the same lock
files, byte-identical published outputs, the same one-line stage errors and exit
codes; a stage whose worker process is killed mid-stage is retried by Ray; a node
with other tpubuild code or TensorFlow is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.cli import CLI, REPO, tpubuild
from tests.engine.conftest import export_recipe, source_recipe, write_workspace

# An export that copies a prebuilt SavedModel (byte-identical every run). While its flag
# file exists it is the "first attempt": it says its pid and waits to be killed.
KILLABLE_EXPORT = textwrap.dedent(
    '''\
    import os
    import shutil
    import time
    from pathlib import Path

    import notes


    def export(output_dir):
        here = Path(__file__).parent
        flag = here / "{flag}"
        if flag.exists():
            (here / "{flag}.pid").write_text(str(os.getpid()))
            deadline = time.time() + 120
            while flag.exists() and time.time() < deadline:
                time.sleep(0.05)
        shutil.copytree(here / "prebuilt", output_dir, dirs_exist_ok=True)
        (Path(output_dir) / "assets").mkdir(exist_ok=True)
        (Path(output_dir) / "assets" / "note.txt").write_text(notes.NOTE)
    '''
)

RECIPES = {
    "plain": source_recipe("plain"),
    "killed": export_recipe("killed", "models/killed_export.py", "models/notes.py"),
    "bad": export_recipe("bad", "models/bad_export.py", "models/helper.py"),
}
# The tiny model's batch stage asks Ray for the cluster's custom resource (a TPU host's `TPU`).
RESOURCES = 'ray_resources: {batch: {tpubuild_test_accelerator: 1}}\n'


def workspace(root: Path, model: Path) -> Path:
    ws = write_workspace(root, model, RECIPES)
    (ws / "recipes" / "models" / "killed_export.py").write_text(KILLABLE_EXPORT.format(flag="KILL_ME"))
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(RESOURCES)
    return ws


def published(ws: Path, recipe: str) -> dict[str, bytes]:
    """Every published file of the recipe's newest version; the manifest without its
    creation time (the one field that differs between any two builds) and the provenance
    without the remote cache URL (the Ray build uses one, the local build none)."""
    versions = sorted((ws / "out" / recipe).iterdir(), key=lambda p: int(p.name))
    root = versions[-1]
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "tpubuild-manifest.json":
                manifest = json.loads(data)
                manifest.pop("created")
                data = json.dumps(manifest, sort_keys=True).encode()
            if path.name == "tpubuild-provenance.json":
                statement = json.loads(data)
                statement["predicate"]["buildDefinition"]["internalParameters"].pop("remoteCache")
                # The manifest is a subject: its digest covers the creation time left out above.
                statement["subject"] = [s for s in statement["subject"] if s["name"] != "tpubuild-manifest.json"]
                data = json.dumps(statement, sort_keys=True).encode()
            files[path.relative_to(root).as_posix()] = data
    return files


def ray_worker_of(pid: int) -> str:
    """The command line of `pid`'s parent: the Ray worker process running the task."""
    status = Path(f"/proc/{pid}/status").read_text()
    parent = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
    return Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_saved_model, ray_address):
    """The same workspace built locally and through Ray (its `killed` export SIGKILLed
    mid-stage on its first attempt), both cold, side by side."""
    base = tmp_path_factory.mktemp("raybuild")
    local_ws = workspace(base / "local", tiny_saved_model)
    ray_ws = workspace(base / "ray", tiny_saved_model)
    remote = base / "remote"
    remote.mkdir()
    flag = ray_ws / "recipes" / "models" / "KILL_ME"
    flag.write_text("")
    trace = base / "ray-trace.json"  # build --profile: each stage on the track of the Ray node that ran it
    command = [*CLI, "build", "-j", "2", "--executor", "ray", "--ray-address", ray_address,
               "--remote-cache", remote.as_uri(), "--profile", str(trace)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ray_build = subprocess.Popen(command, cwd=ray_ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
    local_command = [*CLI, "build", "-j", "2"]
    local_build = subprocess.Popen(local_command, cwd=local_ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
    pid_file = flag.with_name("KILL_ME.pid")
    deadline = time.monotonic() + 240
    while not pid_file.exists() and ray_build.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), "the export never started on the Ray cluster"
    time.sleep(0.2)  # the pid is written before the file is closed: let it land
    pid = int(pid_file.read_text())
    parent = ray_worker_of(pid)
    flag.unlink()  # the retry must not wait again
    os.kill(pid, signal.SIGKILL)  # a real kill of the real process running the stage
    out, err = ray_build.communicate(timeout=300)
    local_out, local_err = local_build.communicate(timeout=300)
    local = subprocess.CompletedProcess(local_command, local_build.returncode, local_out, local_err)
    ray = subprocess.CompletedProcess(command, ray_build.returncode, out, err)
    return {"local": (local_ws, local), "ray": (ray_ws, ray), "killed_parent": parent, "trace": trace}


@pytest.mark.slow
def test_ray_build_gives_the_local_lock_files_and_outputs(builds):
    local_ws, local = builds["local"]
    ray_ws, ray = builds["ray"]
    assert local.returncode == 1 and ray.returncode == 1, ray.stderr  # `bad` fails in both
    for name in ("plain", "killed"):
        lock = f"recipes/{name}.lock.yaml"
        # But each stage's peak memory, measured on the machine that ran it (a Ray node's worker).
        assert unmeasured_peaks(ray_ws / lock) == unmeasured_peaks(local_ws / lock), name
        # The whole published tree byte for byte (the tiny model's verify errors are 0.0 on any CPU).
        assert published(ray_ws, name) == published(local_ws, name), name
    assert "Traceback" not in ray.stderr


def unmeasured_peaks(lock: Path) -> str:
    return "".join(line for line in lock.read_text().splitlines(keepends=True) if "peak_memory" not in line)


@pytest.mark.slow
def test_each_task_reserves_its_memory_estimate_with_ray(builds):
    """The Ray task of each stage asked for `memory=` its estimate (stages/base.py), capped at
    the largest node's memory; what Ray granted the task (its runtime context, in the trace)
    says the request reached it."""
    from tests.trace_rules import complete_events, read_trace
    from tpubuild.pipeline import ENGINE_STEPS
    from tpubuild.stages.base import RUNS_USER_CODE, TF_BASELINE

    ray_ws = builds["ray"][0]
    events = read_trace(builds["trace"])
    granted = {(e["args"]["recipe"], e["args"]["stage"]): (e["args"].get("ray_resources") or {})
               for e in complete_events(events, "stage") if e["args"]["stage"] not in ENGINE_STEPS}
    assert granted and all(r.get("memory", 0) >= TF_BASELINE for r in granted.values()), granted
    # The export starts from nothing it can measure: UNKNOWN_MODEL's estimate, whole.
    assert granted[("killed", "export")]["memory"] == RUNS_USER_CODE.bytes(None), granted
    assert "Traceback" not in builds["ray"][1].stderr


@pytest.mark.slow
def test_the_profile_puts_each_stage_on_its_ray_node(builds):
    from tests.trace_rules import complete_events, process_names, read_trace
    from tpubuild.pipeline import ENGINE_STEPS

    events = read_trace(builds["trace"])  # read_trace checks the format's rules
    nodes = {pid: name for pid, name in process_names(events).items() if name.startswith("ray node ")}
    assert nodes, process_names(events)
    stages = {(e["args"]["recipe"], e["args"]["stage"]): e for e in complete_events(events, "stage")}
    ray_ws = builds["ray"][0]
    for recipe in ("plain", "killed"):
        lock = (ray_ws / "recipes" / f"{recipe}.lock.yaml").read_text()
        for stage in [line.split(": ")[1] for line in lock.splitlines() if line.startswith("- stage: ")]:
            event = stages[(recipe, stage)]
            assert event["args"]["verdict"] == "built" and event["args"]["key"] in lock, event
            assert (event["pid"] in nodes) == (stage not in ENGINE_STEPS), event


@pytest.mark.slow
def test_a_stage_error_is_the_local_one_line(builds):
    local_ws, local = builds["local"]
    ray_ws, ray = builds["ray"]
    local_lines = [x for x in local.stderr.splitlines() if x.startswith("recipes/bad.yaml")]
    ray_lines = [x for x in ray.stderr.splitlines() if x.startswith("recipes/bad.yaml")]
    assert ray_lines == local_lines, (local.stderr, ray.stderr)
    assert len(ray_lines) == 1 and ray_lines[0].startswith("recipes/bad.yaml: stage export: "), ray_lines
    assert "ValueError: no model today" in ray_lines[0], ray_lines
    assert not (ray_ws / "recipes" / "bad.lock.yaml").exists()


@pytest.mark.slow
def test_a_killed_stage_worker_is_retried_by_ray(builds):
    ray_ws, ray = builds["ray"]
    # The process killed ran under a Ray worker (the task), and the stage still succeeded.
    assert "ray::" in builds["killed_parent"] or "default_worker" in builds["killed_parent"], builds["killed_parent"]
    assert "recipes/killed.yaml" not in ray.stderr, ray.stderr
    assert "killed: export: built" in ray.stdout, ray.stdout
    assert (ray_ws / "out" / "killed" / "1" / "assets" / "note.txt").read_text() == "first"


@pytest.mark.slow
def test_the_remote_holds_what_the_nodes_built(builds, tmp_path):
    """A second workspace sharing only the remote finds every stage there (remote hits)."""
    ray_ws, _ = builds["ray"]
    remote = ray_ws.parent / "remote"
    other = tmp_path / "other"
    shutil.copytree(ray_ws, other, ignore=shutil.ignore_patterns(".tpubuild", "out", "*.lock.yaml"))
    result = tpubuild(other, "build", "--json", "--remote-cache", remote.as_uri(), "plain", "killed")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert {r["status"] for r in rows if r["stage"] != "publish"} == {"cached"}, rows
    for name in ("plain", "killed"):
        assert (other / f"recipes/{name}.lock.yaml").read_text() == (ray_ws / f"recipes/{name}.lock.yaml").read_text()


def measured_free(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.endswith("# measured on the building machine")]


@pytest.mark.slow
def test_an_example_recipe_built_on_ray_matches_its_committed_lock_file(tmp_path, ray_address):
    ws = tmp_path / "example"
    ws.mkdir()
    shutil.copy(REPO / "tpubuild.yaml", ws)
    shutil.copytree(REPO / "recipes", ws / "recipes")
    remote = tmp_path / "remote"
    remote.mkdir()
    result = tpubuild(ws, "build", "--executor", "ray", "--ray-address", ray_address,
                      "--remote-cache", remote.as_uri(), "toy", timeout=600)
    assert result.returncode == 0, result.stderr
    assert measured_free((ws / "recipes" / "toy.lock.yaml").read_text()) == \
        measured_free((REPO / "recipes" / "toy.lock.yaml").read_text())


def test_the_ray_executor_needs_a_remote_cache(tmp_path, tiny_saved_model):
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"plain": source_recipe("plain")})
    result = tpubuild(ws, "build", "--executor", "ray")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the ray executor needs a remote cache every node reaches: set remote_cache: in tpubuild.yaml "
        "or pass --remote-cache URL (file:///shared/dir, s3://bucket/prefix, ...)"]


def test_without_ray_installed_the_error_names_the_extra(tmp_path, tiny_saved_model):
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"plain": source_recipe("plain")})
    # `import ray` fails in this process as in an environment without it.
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['tpubuild', 'build', '--executor', 'ray', "
            f"'--remote-cache', {(tmp_path / 'remote').as_uri()!r}]\nfrom tpubuild.cli import main\nmain()")
    result = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: the ray executor needs Ray, which is not installed: pip install 'tpubuild[ray]'"]


def test_planning_with_the_ray_executor_never_imports_ray(tmp_path, tiny_saved_model):
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"plain": source_recipe("plain")})
    code = ("import sys; sys.argv = ['tpubuild', 'build', '--dry-run', '--executor', 'ray']\n"
            "from tpubuild.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'tensorflow'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ws, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
