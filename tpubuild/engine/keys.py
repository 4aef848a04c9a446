"""Stage keys: a full-length hash of everything that can change a stage's output.

A key record holds the stage's name, the digest of its own code (engine/code.py), the
toolchain (Python, TensorFlow, numpy, protobuf versions), the allow-listed environment
variables that change TensorFlow's behaviour, the stage's option slice, and the digests
of exactly the inputs it reads (workspace files, consumed earlier outputs and summaries).
Workers get a scrubbed environment (`worker_env`), so nothing outside the record can
reach a stage through the environment.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from functools import lru_cache
from typing import Any, Mapping

from tpubuild.engine.hashing import SCHEME, hash_bytes

RECORD_SCHEMA = 2

# Variables that change what TensorFlow computes or how (kernels, XLA, devices,
# determinism, float formats). They are part of every key and passed to the workers.
ENV_ALLOWLIST = (
    "CUDA_VISIBLE_DEVICES",
    "TF_CUDNN_DETERMINISTIC",
    "TF_DETERMINISTIC_OPS",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_MLIR_ENABLE_MERGE_CONTROL_FLOW_PASS",
    "TF_USE_LEGACY_KERAS",
    "TF_XLA_FLAGS",
    "XLA_FLAGS",
)
# Thread-pool sizes, passed to the workers but not keyed, like the machine's CPU count and
# model that they stand in for. They size TensorFlow's inter- and intra-op pools
# (tensorflow/core/common_runtime/process_util.cc: NumInterOpThreadsFromEnvironment,
# NumIntraOpThreadsFromEnvironment; OMP_NUM_THREADS only in oneDNN-with-OpenMP builds,
# which the pip wheel is not), so they change which thread sums what: the last bits of
# measured figures (verification errors, latencies, a static-range calibration, all
# marked measured in lock files), not what tpubuild's stages write (an export script that
# trains is as machine-dependent as it is on another CPU). The XLA AOT compiler's child is
# not given them (targets/xla_aot/libraries.py compiler_env). Checked on
# the example workspace with the three set to 1 and to 8 against unset: its 62 unmeasured
# stage outputs (export, tpu, bfloat16, io_shape, batch, quantize, warmup, the targets'
# builds) byte-identical; with 8, the static-range calibration (measured) differed in its
# last bits, as it does between CPUs (README: "What is hashed").
ENV_THREADS = ("OMP_NUM_THREADS", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
# Variables a worker needs to run at all. PYTHONPATH is passed but not keyed: what an
# export imports from the workspace is discovered and hashed; modules from outside it are
# installed packages, like TensorFlow (README: "What is hashed").
ENV_PASSTHROUGH = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "PATH", "PYTHONPATH", "TMPDIR", "VIRTUAL_ENV",
                   "SYSTEMROOT", "TPUBUILD_DEBUG", "TPUBUILD_QUIET_TENSORFLOW", *ENV_THREADS)
TOOLCHAIN_PACKAGES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"), "numpy": ("numpy",),
                      "protobuf": ("protobuf",)}


@lru_cache(maxsize=None)
def _dist_info_dirs() -> dict[str, tuple[str, str]]:
    """Installed distributions -> (version, dist-info directory), from the
    `<name>-<version>.dist-info` directory names on sys.path (what importlib.metadata reads,
    without its ~30 ms import: the no-op build path computes the toolchain on every run)."""
    found: dict[str, tuple[str, str]] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and "-" in name:
                dist, _, version = name[: -len(".dist-info")].partition("-")
                found.setdefault(normalized_dist(dist), (version, os.path.join(entry or ".", name)))
    return found


def forget_installed() -> None:
    """Read the installed distributions again (a long-lived process after an upgrade)."""
    _dist_info_dirs.cache_clear()
    toolchain.cache_clear()


def _dist_infos() -> dict[str, str]:
    return {name: version for name, (version, _) in _dist_info_dirs().items()}


def normalized_dist(name: str) -> str:
    """A distribution's name as dist-info directories and `dist:` inputs spell it."""
    return name.lower().replace("_", "-").replace(".", "-")


def current_input_hash(root: Any, stat: Any, rel: str) -> str | None:
    """The hash a discovered or declared input has now: an installed distribution's
    version (`dist:<name>`), else the content of the file at `rel` under `root` (through
    the stat cache `stat`); None when there is none. What the resolver, `explain` and
    `build --check` compare with the recorded hash."""
    if rel.startswith("dist:"):  # an installed distribution, by version
        installed = installed_dist(rel[len("dist:"):])
        return installed[0] if installed else None
    try:
        return stat.file_hash(os.path.join(root, rel))
    except OSError:
        return None


def installed_dist(name: str) -> tuple[str, str] | None:
    """(version, dist-info directory) of an installed distribution, or None: what a
    discovered `dist:<name>` input (engine/imports.py) is compared with."""
    return _dist_info_dirs().get(normalized_dist(name))


@lru_cache(maxsize=None)
def toolchain() -> dict[str, str]:
    """Versions that change stage outputs, read from package metadata (no TF import)."""
    versions = {"python": f"{platform.python_implementation()} {platform.python_version()}"}
    installed = _dist_infos()
    for label, dists in TOOLCHAIN_PACKAGES.items():
        versions[label] = next((installed[d] for d in dists if d in installed), None) or _metadata_version(dists)
    return versions


def _metadata_version(dists: tuple[str, ...]) -> str:
    """The slow, complete lookup (eggs, zip imports) when no dist-info directory says it."""
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def tensorflow_version() -> str:
    return toolchain()["tensorflow"]


def key_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The allow-listed variables that are set: part of every key."""
    return {name: environ[name] for name in ENV_ALLOWLIST if name in environ}


def worker_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The scrubbed environment of a worker: allow-list, passthrough, fixed settings."""
    env = {name: environ[name] for name in ENV_PASSTHROUGH if name in environ}
    env.update(key_env(environ))
    # Python's hash seed decides set and dict-of-set orders inside TensorFlow's tracing.
    env["PYTHONHASHSEED"] = "0"
    return env


def canonical_dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def key_record(
    stage: str, code: str, options: dict[str, Any], inputs: dict[str, str],
    environ: Mapping[str, str] | None = os.environ,
) -> dict[str, Any]:
    """What a stage key hashes; kept in the store so `explain` can say what changed.
    `environ=None` for the engine's own copy step, which no toolchain or variable changes."""
    return {
        "schema": RECORD_SCHEMA,
        "scheme": SCHEME,
        "stage": stage,
        "code": code,
        "toolchain": toolchain() if environ is not None else {},
        "env": key_env(environ) if environ is not None else {},
        "options": options,
        "inputs": dict(sorted(inputs.items())),
    }


def stage_key(record: dict[str, Any]) -> str:
    return hash_bytes(canonical_dumps(record).encode())


def summary_digest(summary: dict[str, Any], warnings: list[str]) -> str:
    """What a later stage that reads a summary hashes of it."""
    return hash_bytes(canonical_dumps({"summary": summary, "warnings": warnings}).encode())


def diff_records(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two key records, e.g. `option verify.rtol: 0.1 -> 0.2`."""
    changes: list[str] = []
    for field in ("schema", "scheme", "stage"):
        if old.get(field) != new.get(field):
            changes.append(f"{field}: {old.get(field)} -> {new.get(field)}")
    if old.get("code") != new.get("code"):
        changes.append("the stage's code changed (tpubuild was edited or upgraded)")
    _diff_values("toolchain ", old.get("toolchain"), new.get("toolchain"), "", changes)
    _diff_values("environment variable ", old.get("env", {}), new.get("env", {}), "", changes)
    _diff_values("option ", old.get("options"), new.get("options"), "", changes)
    old_in, new_in = old.get("inputs", {}), new.get("inputs", {})
    for name in sorted(set(old_in) | set(new_in)):
        if name not in old_in:
            changes.append(f"input {name}: new")
        elif name not in new_in:
            changes.append(f"input {name}: removed")
        elif old_in[name] != new_in[name]:
            changes.append(f"input {name}: content changed ({old_in[name][:12]} -> {new_in[name][:12]})")
    return changes


def _of_containers(value: Any) -> bool:
    """A non-empty list of mappings or lists; a list of scalars reads better whole ([2, 4, 8])."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, (dict, list)) for v in value)


def _diff_values(prefix: str, old: Any, new: Any, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            sub = f"{path}.{k}" if path else k
            if k not in old:
                out.append(f"{prefix}{sub}: added ({canonical_dumps(new[k])})")
            elif k not in new:
                out.append(f"{prefix}{sub}: removed (was {canonical_dumps(old[k])})")
            else:
                _diff_values(prefix, old[k], new[k], sub, out)
    elif _of_containers(old) and _of_containers(new):
        # Lists of mappings (batch_options, tpu_functions) item by item, as `tpubuild diff`
        # prints them: `batch_options[0].batch_timeout_micros: 2000 -> 3000`, not both lists.
        for i in range(max(len(old), len(new))):
            sub = f"{path}[{i}]"
            if i >= len(old):
                out.append(f"{prefix}{sub}: added ({canonical_dumps(new[i])})")
            elif i >= len(new):
                out.append(f"{prefix}{sub}: removed (was {canonical_dumps(old[i])})")
            else:
                _diff_values(prefix, old[i], new[i], sub, out)
    elif old != new:
        out.append(f"{prefix}{path or '(all)'}: {canonical_dumps(old)} -> {canonical_dumps(new)}")
