"""The toolchain facts every key holds: installed distributions and their versions, the
environment variables that are keyed (and those passed to workers unkeyed), and how a
missing input is recorded. Read from package metadata and the environment, never by
importing the packages (planning commands stay light).
"""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from typing import Any, Mapping

# What a missing file is recorded as: creating it later changes the stage's inputs.
ABSENT = "absent"


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
# last bits, as it does between CPUs (docs/builds.md: "What is hashed").
ENV_THREADS = ("OMP_NUM_THREADS", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS")
# Variables a worker needs to run at all. PYTHONPATH is passed but not keyed: what an
# export imports from the workspace is discovered and hashed; modules from outside it are
# installed packages, like TensorFlow (docs/builds.md: "What is hashed").
ENV_PASSTHROUGH = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "PATH", "PYTHONPATH", "TMPDIR", "VIRTUAL_ENV",
                   "SYSTEMROOT", "TPUBUILD_DEBUG", "TPUBUILD_QUIET_TENSORFLOW", *ENV_THREADS)
# ml_dtypes: the bfloat16 stage casts float32 with it (savedmodel/checkpoint.py).
TOOLCHAIN_PACKAGES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"), "numpy": ("numpy",),
                      "protobuf": ("protobuf",), "ml_dtypes": ("ml-dtypes",)}


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


def dist_input(name: str) -> tuple[str, str]:
    """A distribution as a discovered input: (`dist:<name>`, its installed version or
    ABSENT), the form a stage reports what it used and `current_input_hash` reads back."""
    rel = f"dist:{normalized_dist(name)}"
    return rel, current_input_hash(None, None, rel) or ABSENT


def installed_dist(name: str) -> tuple[str, str] | None:
    """(version, dist-info directory) of an installed distribution, or None: what a
    discovered `dist:<name>` input (workers/import_record.py) is compared with."""
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
