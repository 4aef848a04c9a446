"""Running stages as Ray tasks on an existing cluster (`build --executor ray`).

The driver (the `tpubuild build` process) keys, records and publishes exactly as a
local build does; only the stage itself runs elsewhere. What a task receives names no
driver path: its inputs are trees (path, hash, size) that it fetches from the remote
cache into a node-local store (every object re-hashed), its outputs go back to the
remote, and the driver fetches them (verified again) into its own store before the
usual after-run checks and `Store.put`. So a lock file written after a Ray build is
the one a local build writes.

On the node the stage runs in a tpubuild worker process (workers/pool.py), as
locally: same scrubbed environment (with the driver's allow-listed variables, which
are in the key), same quiet logs, same one-line errors, same import recording for user
code. The workspace's own files (export scripts, datasets) are read at the driver's
workspace path, which must be shared by every node; the task re-hashes the declared
ones and refuses a node that sees other content. It refuses, too, a node whose
tpubuild stage code or toolchain differs from what the driver keyed.

A tpubuild worker that dies mid-stage (SIGKILL, out of memory) raises `WorkerDied`,
which Ray retries (`retry_exceptions=[WorkerDied]`), as it retries a task whose Ray
worker or node died (`max_retries`); a stage's own error is a reply, never retried.
Ray is imported only here, and only by a build that runs a stage through it.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tpubuild.digests import FileEntry, hash_file, tree_digest, walk_files
from tpubuild.errors import StageError, TpubuildError
from tpubuild.remote import fetch_objects, push_objects

# Ray retries a stage whose worker died this many times before the build fails it.
MAX_RETRIES = 2
# The node-local store that holds fetched inputs and outputs before upload.
NODE_CACHE_ENV = "TPUBUILD_RAY_NODE_CACHE"
INSTALL_HINT = "pip install 'tpubuild[ray]'"


class WorkerDied(StageError):
    """The stage's worker process on the node ended without replying: retried by Ray."""


class RayUnavailable(TpubuildError):
    """Ray is not installed, or the cluster cannot be reached (exit code 1)."""

    exit_code = 1


def ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def check_ray_executor(remote_url: str | None, push: bool = True) -> None:
    """The checks a build makes before it plans anything: Ray installed, and a remote
    cache every node reaches and may write to (one line each, no Ray import)."""
    from tpubuild.errors import UsageError

    if not remote_url:
        raise UsageError("the ray executor needs a remote cache every node reaches: set remote_cache: in "
                         "tpubuild.yaml or pass --remote-cache URL (file:///shared/dir, s3://bucket/prefix, ...)")
    if not push:
        raise UsageError("the ray executor uploads each stage's outputs to the remote cache: it cannot run "
                         "with a read-only remote cache (push: false / --remote-cache-read-only)")
    if not ray_installed():
        raise RayUnavailable(f"the ray executor needs Ray, which is not installed: {INSTALL_HINT}")


def _open_remote(url: str, push: bool = True) -> Any:
    from tpubuild.remote import RemoteCache

    return RemoteCache(url, push)


def _last_failure(remote: Any) -> str:
    failures = getattr(remote.stats, "failures", None)
    return failures[-1] if failures else f"remote cache {remote.url}"


def _files(rows: list[list[Any]]) -> list[FileEntry]:
    return [FileEntry(p, h, s) for p, h, s in rows]


def _rows(files: list[FileEntry]) -> list[list[Any]]:
    return [[f.path, f.hash, f.size] for f in files]


class RayExecutor:
    """The WorkerPool of a Ray build: `run(request, timeout, fresh_in)` runs one stage as
    a Ray task and leaves its output files in `request["output_dir"]`, as a local worker
    does; `close(kill)` cancels what is still running."""

    def __init__(self, store: Any, remote: Any, address: str | None = None,
                 resources: dict[str, dict[str, float]] | None = None, log_dir: Path | None = None):
        check_ray_executor(remote.url if remote is not None else None, remote is not None and remote.can_push)
        import logging

        import ray

        self.ray = ray
        self.store = store
        self.remote = remote  # the build's RemoteCache (remote/cache.py): its stats count the driver's transfers
        self.remote_url = remote.url
        self.resources = resources or {}
        self.log_dir = log_dir  # where a stage bug's traceback from a node is kept, as locally
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.lock = threading.Lock()
        self.pushed: set[str] = set()  # objects this build knows the remote holds
        self.running: set[Any] = set()
        try:
            # An existing cluster only; Ray's own logs and the workers' output stay out of
            # the user's terminal (the stage logs are on the nodes, as locally).
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False,
                     configure_logging=True)
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError: all one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RayUnavailable(f"cannot connect to the Ray cluster at {self.address}: {first}") from None
        self.task = ray.remote(run_on_node)
        self.largest_node = largest_node_memory(ray)

    def memory_request(self, estimate: int) -> int | None:
        """The `memory=` a stage's task reserves: its estimated peak (StageSpec.memory), capped at
        the largest node's memory, so a task can always be scheduled (Ray keeps a task whose
        request no node can hold pending forever). None: nothing to reserve."""
        if estimate <= 0:
            return None
        return min(estimate, self.largest_node) if self.largest_node else estimate

    def run(self, request: dict[str, Any], timeout: float | None, fresh_in: Path | None = None,
            spare: bool = False, memory: int = 0, waiting: Any = None) -> dict[str, Any]:
        """Run one stage on a node Ray chooses (`spare` is WorkerPool's: a node's task starts
        its own worker). `memory`: its estimated peak, reserved with Ray (`memory=`, which
        Ray's scheduler counts against each node's memory resource) unless `ray.resources`
        in tpubuild.yaml gives the stage's; Ray's queue is the waiting (`waiting` unused)."""
        stage = request["stage"]
        trees = request["trees"]
        self._push_inputs([f for rows in trees.values() for f in _files(rows)])
        node_request = {k: request[k] for k in ("entry", "stage", "workspace", "options", "results", "trees",
                                                "keyed", "declared")}
        node_request["fresh"] = fresh_in is not None
        resources = dict(self.resources.get(stage, {}))
        options: dict[str, Any] = {"max_retries": MAX_RETRIES, "retry_exceptions": [WorkerDied],
                                   "num_cpus": resources.pop("CPU", 1), "name": f"tpubuild:{stage}"}
        if "GPU" in resources:
            options["num_gpus"] = resources.pop("GPU")
        if "memory" in resources:  # bytes of heap the task reserves: Ray's own option
            options["memory"] = resources.pop("memory")
        elif self.memory_request(memory):
            options["memory"] = self.memory_request(memory)
        if resources:
            options["resources"] = resources
        ref = self.task.options(**options).remote(node_request, timeout, self.remote_url)
        with self.lock:
            self.running.add(ref)
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, WorkerDied):
                raise StageError(f"{cause} (tried {MAX_RETRIES + 1} times on the Ray cluster)") from None
            if isinstance(cause, TpubuildError):
                raise StageError(str(cause)) from None
            raise StageError(f"internal error: the Ray task of stage {stage} failed: "
                             f"{type(cause or exc).__name__}: {cause or exc}") from None
        except self.ray.exceptions.TaskCancelledError:
            raise StageError(f"the Ray task of stage {stage} was cancelled") from None
        except self.ray.exceptions.RayError as exc:  # the Ray worker or its node died, past the retries
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StageError(f"the Ray worker running stage {stage} died {MAX_RETRIES + 1} times: {first}") from None
        finally:
            with self.lock:
                self.running.discard(ref)
        received = time.monotonic()
        reply = result["reply"]
        # Where it ran and how long its transfers took there: build --profile's events
        # (engine/timeline.py), anchored at this reply's arrival.
        reply["node"] = {"host": result["host"], "pid": result.get("pid"), "received": received,
                         "fetch_seconds": result.get("fetch_seconds"), "upload_seconds": result.get("upload_seconds"),
                         "resources": result.get("resources")}
        # The nodes' transfers are this build's too: the summary line and --json count them.
        self.remote.count(bytes_down=result.get("bytes_down", 0), bytes_up=result.get("bytes_up", 0))
        if reply.get("ok"):
            self._take_outputs(stage, _files(result["files"]), Path(request["output_dir"]), result["host"])
        elif reply.get("bug") and reply.get("detail") and self.log_dir is not None:
            from tpubuild.atomic import write_text_atomic

            self.log_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.log_dir / f"ray-{stage}-{os.getpid()}-{ref.hex()[:12]}.log",
                              f"stage {stage} on ray node {result['host']}\n{reply['detail']}")
        return reply

    def _push_inputs(self, files: list[FileEntry]) -> None:
        """Upload the input objects the remote may not hold yet (outputs of engine steps,
        of stages built or cached locally); create-only, so a present object is skipped."""
        with self.lock:
            todo = [f for f in {f.hash: f for f in files}.values() if f.hash not in self.pushed]
        if todo:
            if not push_objects(self.remote, todo, self.store):
                raise StageError(f"the inputs of the stage could not be uploaded to the remote cache "
                                 f"({_last_failure(self.remote)}); the Ray node cannot read them")
            with self.lock:
                self.pushed.update(f.hash for f in todo)

    def _take_outputs(self, stage: str, files: list[FileEntry], out_dir: Path, host: str) -> None:
        """Fetch the task's outputs into the local store (each object re-hashed) and link
        them into the output directory, where `Store.put` takes them as from a local worker."""
        from tpubuild.digests import StatCache
        from tpubuild.keys import StageEntry

        if not (fetch_objects(self.remote, files, self.store)
                and self.store.verify(StageEntry("", stage, tree_digest(files), files), StatCache(None))):
            raise StageError(f"the outputs of stage {stage} built on Ray node {host} could not be fetched intact "
                             f"from the remote cache ({_last_failure(self.remote)})")
        with self.lock:
            self.pushed.update(f.hash for f in files)
        self.store.materialize(files, out_dir)

    def close(self, kill: bool = False) -> None:
        if kill:
            with self.lock:
                refs = list(self.running)
            for ref in refs:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already finished, or the cluster is gone
                    pass
        self.ray.shutdown()


def largest_node_memory(ray: Any) -> int:
    """The largest memory resource of the cluster's live nodes (bytes; 0: unknown)."""
    try:
        return int(max((node.get("Resources", {}).get("memory", 0) for node in ray.nodes() if node.get("Alive")),
                       default=0))
    except Exception:  # an older or newer Ray's shape: nothing is capped, as before
        return 0


# --- the node side: the Ray task ---------------------------------------------------------
def node_cache_dir() -> Path:
    """The node-local store of fetched objects, shared by the tasks on one node."""
    configured = os.environ.get(NODE_CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"tpubuild-ray-{os.getuid()}" / "cache"


def mismatch(request: dict[str, Any]) -> str | None:
    """Why this node would run other code than the driver keyed, or None."""
    from tpubuild.digests import toolchain
    from tpubuild.keys import code_digest
    from tpubuild.pipeline import stage_module

    keyed = request["keyed"]
    problems = []
    code = code_digest(stage_module(request["stage"]))
    if code != keyed["code"]:
        problems.append(f"stage {request['stage']} code {code[:12]}, the build's {keyed['code'][:12]}")
    mine = toolchain()
    for name in sorted(set(mine) | set(keyed["toolchain"])):
        if mine.get(name) != keyed["toolchain"].get(name):
            problems.append(f"{name} {mine.get(name)}, the build's {keyed['toolchain'].get(name)}")
    if not problems:
        return None
    return (f"ray node {socket.gethostname()} runs other tpubuild code/TensorFlow than this build "
            f"({'; '.join(problems)})")


def workspace_problem(request: dict[str, Any]) -> str | None:
    """Why the node does not see the driver's workspace files the stage reads, or None."""
    root = request["workspace"]
    host = socket.gethostname()
    if not os.path.isdir(root):
        return (f"ray node {host} has no workspace at {root}: the workspace must be on a path every node "
                "shares, at the same place")
    for rel, digest in sorted(request["declared"].items()):
        try:
            actual = hash_file(os.path.join(root, rel))
        except OSError:
            actual = None
        if actual != digest:
            return (f"ray node {host} sees other content of {rel} than this build (the workspace at {root} "
                    "must be the same shared directory on every node)")
    return None


def node_env(keyed_env: dict[str, str]) -> dict[str, str]:
    """The worker environment: what a process needs from this node, and the driver's
    allow-listed variables (they are in the key) instead of the node's."""
    from tpubuild.digests import ENV_ALLOWLIST, worker_env

    environ = {k: v for k, v in os.environ.items() if k not in ENV_ALLOWLIST}
    environ.update(keyed_env)
    return worker_env(environ)


_pools: dict[tuple, Any] = {}  # per Ray worker process: its tpubuild worker, reused as locally
_installed: list[str] = []  # the fingerprint of the tpubuild sources the pools were started with


def refresh_installed() -> None:
    """A Ray worker process outlives builds: when tpubuild's sources or the installed
    packages changed since its last task, forget the memoized code digests and
    toolchain, and stop the tpubuild workers that imported the old code."""
    from tpubuild.digests import forget_installed
    from tpubuild.keys import forget_code, package_fingerprint

    fingerprint = package_fingerprint()
    forget_installed()
    if _installed and _installed[0] != fingerprint:
        forget_code()
        for pool in _pools.values():
            pool.close()
        _pools.clear()
    _installed[:] = [fingerprint]


def node_pool(env: dict[str, str], logs: Path) -> Any:
    """The tpubuild worker pool of this Ray worker process for `env` and toolchain: one
    worker that imports TensorFlow once and runs the stages Ray gives this process, one
    at a time (stages that run user code still get a fresh one each)."""
    from tpubuild.digests import toolchain
    from tpubuild.workers.pool import WorkerPool

    key = (tuple(sorted(env.items())), tuple(sorted(toolchain().items())))
    if key not in _pools:
        _pools[key] = WorkerPool(1, Path(tempfile.mkdtemp(prefix=f"worker-{os.getpid()}-", dir=logs)), env)
    return _pools[key]


def _assigned_resources() -> dict[str, float] | None:
    """What Ray granted this task (CPU, memory in bytes, custom resources), for the profile."""
    try:
        import ray

        return {k: float(v) for k, v in ray.get_runtime_context().get_assigned_resources().items()}
    except Exception:  # not in a Ray task, or another Ray's API
        return None


def run_on_node(request: dict[str, Any], timeout: float | None, remote_url: str) -> dict[str, Any]:
    """The Ray task: check the node, fetch the input trees, run the stage in a tpubuild
    worker process, upload the outputs. Returns {"reply", "files", "host"}; raises
    WorkerDied (retried by Ray) when the worker process dies."""
    from tpubuild.digests import StatCache
    from tpubuild.keys import StageEntry
    from tpubuild.store import Store
    from tpubuild.workers.pool import StageTimeout, stage_request

    host = socket.gethostname()

    began = time.monotonic()
    phases: dict[str, float] = {}  # the node's own clock: fetch and upload seconds (engine/timeline.py)

    def failed(message: str) -> dict[str, Any]:
        return {"reply": {"ok": False, "error": message}, "files": [], "host": host, "pid": os.getpid()}

    def result(reply: dict[str, Any], files: list[FileEntry]) -> dict[str, Any]:
        return {"reply": reply, "files": _rows(files), "host": host, "pid": os.getpid(), **phases,
                "bytes_down": remote.stats.bytes_down, "bytes_up": remote.stats.bytes_up,
                "resources": _assigned_resources()}

    refresh_installed()
    problem = mismatch(request) or workspace_problem(request)
    if problem:
        return failed(problem)
    cache = node_cache_dir()
    store = Store(cache)
    remote = _open_remote(remote_url)
    logs = cache.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        stat = StatCache(None)
        dirs: dict[str, str] = {}
        for role, rows in sorted(request["trees"].items()):
            files = _files(rows)
            entry = StageEntry("", role, tree_digest(files), files)
            if not (fetch_objects(remote, files, store, stat) and store.verify(entry, stat)):
                return failed(f"ray node {host} could not fetch input {role} intact from the remote cache "
                              f"({_last_failure(remote)})")
            dirs[role] = str(store.checkout(entry))
        work = store.new_workdir(request["stage"])
        out_dir = work / "out"
        out_dir.mkdir()
        local_request = stage_request(request["entry"], request["stage"], request["workspace"], str(out_dir),
                                      request["options"], dirs, request["results"])
        pool = node_pool(node_env(request["keyed"]["env"]), logs)
        fresh = Path(request["workspace"]) if request["fresh"] else None
        phases["fetch_seconds"] = time.monotonic() - began
        try:
            reply = pool.run(local_request, timeout, fresh)
        except StageTimeout as exc:
            return failed(str(exc))
        except StageError as exc:  # Worker.call's only other error: the process died
            raise WorkerDied(f"{exc} on ray node {host}") from None
        if not reply.get("ok"):
            return result(reply, [])
        uploading = time.monotonic()
        files = [FileEntry(rel, hash_file(out_dir / rel, st.st_size), st.st_size)
                 for rel, st in walk_files(out_dir, symlinks="reject")]
        store.ingest_copies(files, out_dir, stat)
        if not push_objects(remote, files, store, stat):
            return failed(f"ray node {host} could not upload the outputs to the remote cache "
                          f"({_last_failure(remote)})")
        phases["upload_seconds"] = time.monotonic() - uploading
        return result(reply, files)
    except StageError as exc:
        if isinstance(exc, WorkerDied):
            raise
        return failed(str(exc))
    finally:
        store.close()  # the session's work dirs go with it
