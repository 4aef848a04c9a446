"""Semantic checks a JSON Schema cannot express, each located at the offending line.

They run on a recipe that already passed the schema (types are right) after `extends`
and defaults, with paths rebased to the workspace root.
"""

from __future__ import annotations

import glob
import math
import os
from pathlib import Path
from typing import Any, Iterator

from tpubuild.config.paths import boundary_problem, iter_paths
from tpubuild.config.yamlload import Marks, format_path
from tpubuild.errors import Diagnostic

TPU_FUNCTION_KINDS = ("function_alias", "concrete_function_name", "signature_name", "jit_compile_functions")
EXPERIMENTAL_KINDS = ("function_alias", "concrete_function_name", "signature_name")
DATASET_KINDS = ("tfrecord_file_path", "npz", "generator")
DEFAULT_SIGNATURE_KEYS = ["serving_default"]

# Bounds of batch_options. TensorFlow's BatchFunction reads these attributes into int32
# and checks only their order and the final allowed size
# (tensorflow/core/kernels/batch_kernels.cc, BatchFunctionKernel and
# ValidateAllowedBatchSizes), so the schema's int32 maximum is all the op itself refuses.
# What it does with them is the bound: every batch is concatenated and padded up to its
# allowed size in host memory (batching_util/batch_resource_base.cc), the queue holds up
# to max_enqueued_batches of them, and tpubuild's warmup and verify stages build one
# request of each allowed size. A size of 2^31 rows is 8 GiB per float32 feature: no
# server forms such batches, and the warmup stage would tile its samples to that many
# rows. TF's own batch-size metrics stop at 2^14 (batch_resource_base.cc
# RecordInputBatchSizeV2, "Largest bucket ... 2^14"); MAX_BATCH_SIZE leaves 4x room.
MAX_BATCH_SIZE = 1 << 16
# A non-adaptive BatchFunction starts num_batch_threads threads of its own
# (batching_util/shared_batch_scheduler.h, `batch_threads_`); the adaptive scheduler
# caps in-flight batches at its pool of kBatchThreadPoolSize = 128 (batch_kernels.cc).
MAX_BATCH_THREADS = 1024
INT32_MAX = 2**31 - 1
# variables.max_shard_size's floor (the schema's minimum): smaller files only multiply them.
MIN_SHARD_SIZE = 1 << 20


class Checker:
    def __init__(self, data: dict[str, Any], marks: Marks, root: Path):
        self.data = data
        self.marks = marks
        self.root = root
        self.problems: list[Diagnostic] = []

    def error(self, path: tuple, message: str, at_key: bool = False) -> None:
        loc = self.marks.key(path) if at_key else self.marks.value(path)
        self.problems.append(Diagnostic(loc, format_path(path), message))

    def run(self) -> list[Diagnostic]:
        converter = self.data.get("converter", {})
        if not isinstance(converter, dict):
            converter = {}
        checks = (
            (self.check_model,),
            (self.check_paths,),
            (self.check_tolerances, self.data.get("verify", {})),
            (self.check_tpu_functions, converter.get("tpu_functions", [])),
            (self.check_batch_options, converter.get("batch_options", [])),
            (self.check_bfloat16_scope, converter.get("bfloat16_optimization_options")),
            (self.check_xla_sharding, converter.get("xla_sharding_options")),
            (self.check_quantization, converter.get("quantization_options")),
            (self.check_targets, self.data.get("targets")),
            (self.check_op_libraries, self.data.get("op_libraries") or []),
            (self.check_publish_to, self.data.get("publish_to")),
            (self.check_max_shard_size, (self.data.get("variables") or {}).get("max_shard_size")),
        )
        for check, *args in checks:
            # The schema's errors are reported too; a check that meets a value of the
            # wrong type leaves it to them instead of guessing.
            try:
                check(*args)
            except (TypeError, KeyError, IndexError, AttributeError, ValueError):
                pass
        return self.problems

    def check_max_shard_size(self, value: Any) -> None:
        """A size with a unit is checked here, an integer by the schema: at least 1 MiB."""
        from tpubuild.config.sizes import parse_size

        if isinstance(value, str) and parse_size(value) < MIN_SHARD_SIZE:
            self.error(("variables", "max_shard_size"), f"must be >= 1MiB (1048576 bytes), got {value}")

    def check_publish_to(self, url: Any) -> None:
        """A recipe's publish destination and `oci:`, as the workspace's (config/remote_url.py)."""
        from tpubuild.config.remote_url import oci_settings_problems, url_problem

        for path, problem in oci_settings_problems(self.data.get("oci")):
            self.error(path, problem)
        if isinstance(url, str):
            wrong = url_problem(url, oci=True)
            if wrong:
                self.error(("publish_to",), wrong)

    def check_model(self) -> None:
        model = self.data.get("model")
        if model is None:
            self.error((), "model is required (model.saved_model or model.export)")
            return
        kinds = [k for k in ("saved_model", "export") if k in model]
        if not kinds:
            self.error(("model",), "set one of saved_model or export")
        elif len(kinds) > 1:
            self.error(("model", kinds[1]), "set only one of saved_model or export, not both", at_key=True)

    def check_paths(self) -> None:
        for path, relative in iter_paths(self.data):
            if path == ("extends",):
                continue  # checked when the base was read
            is_glob = path[:3] == ("model", "export", "deps") or (len(path) > 1 and path[-2] == "deps")
            kind = "glob" if is_glob else "saved_model" if path[-1] == "saved_model" else "file"
            problem = self.path_problem(relative, kind)
            if problem:
                # Quoted as the user wrote it (relative to the recipe), not rebased.
                self.error(path, f"{self.marks.written.get(path, relative)!r} {problem}")
        quant = self.data.get("converter", {}).get("quantization_options") or {}
        for key, source in quant.get("representative_datasets", {}).items():
            if "generator" in source:
                module_file = generator_module_file(source["generator"])
                problem = self.path_problem(module_file, "file")
                if problem:
                    where = ("converter", "quantization_options", "representative_datasets", key, "generator")
                    if problem == "does not exist":
                        problem = "not found in the workspace"
                    self.error(where, f"module file {module_file!r} {problem}")

    def path_problem(self, relative: str, kind: str) -> str | None:
        """What is wrong with the root-relative path `relative` used as `kind` (glob,
        saved_model or file), phrased to follow the quoted path; None when it is usable."""
        problem = boundary_problem(relative, self.root)
        if problem:
            return problem
        absolute = self.root / relative
        try:
            if kind == "glob":
                matches = glob.glob(str(absolute), recursive=True)
                if not matches:
                    return "matches no file"
                for match in sorted(matches):
                    rel = os.path.relpath(match, self.root)
                    problem = boundary_problem(rel, self.root)
                    if problem:
                        return f"matches {rel}, which {problem}"
            elif kind == "saved_model":
                if not absolute.is_dir():
                    return "does not exist" if not absolute.exists() else "is not a directory"
                if not (absolute / "saved_model.pb").is_file():
                    return "is not a SavedModel (no saved_model.pb)"
                problem = boundary_problem(f"{relative}/saved_model.pb", self.root)
                return f"holds saved_model.pb, which {problem}" if problem else None
            elif not absolute.is_file():
                return "does not exist" if not absolute.exists() else "is not a file"
        except OSError as exc:  # e.g. File name too long
            return f"cannot be used: {exc.strerror or exc}"
        return None

    def check_tolerances(self, verify: dict[str, Any]) -> None:
        # The schema's `minimum` lets NaN through (NaN < 0 is false) and has no way to say
        # "finite"; a NaN or infinite tolerance makes every comparison pass.
        for key in ("rtol", "atol"):
            value = verify.get(key)
            if isinstance(value, float) and not math.isfinite(value) and not value < 0:
                self.error(("verify", key), f"must be a finite number >= 0, got {value}")

    def check_tpu_functions(self, entries: list[dict[str, Any]]) -> None:
        seen: dict[tuple, int] = {}
        for index, entry in enumerate(entries):
            path = ("converter", "tpu_functions", index)
            kinds = [k for k in TPU_FUNCTION_KINDS if k in entry]
            if not kinds:  # e.g. only enable_soft_device_placement
                self.error(path, f"set exactly one of {', '.join(TPU_FUNCTION_KINDS)}")
                continue
            if len(kinds) > 1:
                self.error(path, _oneof_message(TPU_FUNCTION_KINDS, kinds))
                continue
            named = (kinds[0], entry[kinds[0]])
            if named in seen:
                self.error(
                    path + (kinds[0],),
                    f"names the same function as converter.tpu_functions[{seen[named]}]",
                )
            else:
                seen[named] = index

    def check_bfloat16_scope(self, options: dict[str, Any] | None) -> None:
        """ConverterOptionsV2's rule: preserve_signature and convert_checkpoint only with
        scope ALL (the other scopes never change the signature or the checkpoint)."""
        if not options:
            return
        scope = str(options.get("scope", "DEFAULT")).upper()
        path = ("converter", "bfloat16_optimization_options")
        if "preserve_signature" in options and scope != "ALL":
            self.error(path + ("preserve_signature",), f"only with scope ALL (scope is {scope})")
        if "convert_checkpoint" in (options.get("experimental") or {}) and scope != "ALL":
            self.error(path + ("experimental", "convert_checkpoint"), f"only with scope ALL (scope is {scope})")

    def check_batch_options(self, entries: list[dict[str, Any]]) -> None:
        for index, entry in enumerate(entries):
            path = ("converter", "batch_options", index)
            if index >= 1:
                self.error(path, "only one batch_options entry is supported (the converter supports one today)")
                continue
            experimental = entry.get("experimental")
            if experimental:
                kinds = [k for k in EXPERIMENTAL_KINDS if k in experimental]
                if len(kinds) > 1:
                    self.error(path + ("experimental",), _oneof_message(EXPERIMENTAL_KINDS, kinds))
            self.check_batch_bounds(path, entry)
            sizes = entry.get("allowed_batch_sizes") or []
            decreasing = [i for i in range(1, len(sizes)) if sizes[i] <= sizes[i - 1]]
            if decreasing:
                i = decreasing[0]
                self.error(
                    path + ("allowed_batch_sizes", i),
                    f"allowed_batch_sizes must increase monotonically: {sizes[i]} follows {sizes[i - 1]}",
                )
            elif sizes:
                last, largest = sizes[-1], entry["max_batch_size"]
                last_path = path + ("allowed_batch_sizes", len(sizes) - 1)
                # TF's BatchFunction: with large batch splitting, max_batch_size may exceed the
                # largest allowed size (bigger batches are split); without it they must be equal.
                if entry.get("disable_large_batch_splitting", False) and last != largest:
                    self.error(
                        last_path,
                        f"allowed_batch_sizes must end at max_batch_size ({largest}) when "
                        f"disable_large_batch_splitting is true, got {last}",
                    )
                elif last > largest:
                    self.error(
                        last_path,
                        f"allowed_batch_sizes must end at max_batch_size ({largest}) or below, got {last}",
                    )

    def check_batch_bounds(self, path: tuple, entry: dict[str, Any]) -> None:
        """Sizes and threads the runtime can serve (MAX_BATCH_SIZE, MAX_BATCH_THREADS)."""
        rows = ("rows", "TensorFlow's BatchFunction pads every batch to its size in host memory")
        threads = ("threads", "TensorFlow's BatchFunction starts one thread each")
        bounds: list[tuple[tuple[Any, ...], Any, int, tuple[str, str]]] = [
                  (("max_batch_size",), entry.get("max_batch_size"), MAX_BATCH_SIZE, rows),
                  (("num_batch_threads",), entry.get("num_batch_threads"), MAX_BATCH_THREADS, threads)]
        bounds += [(("allowed_batch_sizes", i), size, MAX_BATCH_SIZE, rows)
                   for i, size in enumerate(entry.get("allowed_batch_sizes") or [])]
        for where, value, limit, (unit, why) in bounds:
            if isinstance(value, int) and limit < value <= INT32_MAX:  # beyond int32: the schema says so
                self.error(path + where, f"must be at most {limit} {unit}, got {value} ({why})")

    def check_xla_sharding(self, options: dict[str, Any] | None) -> None:
        if not options:
            return
        path = ("converter", "xla_sharding_options")
        cores = options.get("num_cores_per_replica", 1)
        topology = options.get("topology")
        if cores > 1 and topology is None:
            self.error(
                path + ("num_cores_per_replica",),
                f"num_cores_per_replica is {cores}, which needs a topology (xla_sharding_options.topology)",
            )
        if topology is not None and len(topology["device_coordinates"]) % 4:
            self.error(
                path + ("topology", "device_coordinates"),
                "device_coordinates must hold [x, y, z, core] per device (a multiple of 4 numbers)",
            )
        assignment = options.get("device_assignment")
        if assignment and len(assignment) != 4 * cores:
            self.error(
                path + ("device_assignment",),
                f"device_assignment must hold [x, y, z, core] for each of the {cores} core(s) "
                f"of the replica ({4 * cores} numbers), got {len(assignment)}",
            )

    def check_quantization(self, options: dict[str, Any] | None) -> None:
        if options is None:
            return
        path = ("converter", "quantization_options")
        keys = options.get("signature_keys", DEFAULT_SIGNATURE_KEYS)
        datasets = options.get("representative_datasets", {})
        for key, source in datasets.items():
            where = path + ("representative_datasets", key)
            if key not in keys:
                self.error(
                    where,
                    f"representative dataset for {key!r}, which is not in signature_keys ({', '.join(keys)})",
                    at_key=True,
                )
            kinds = [k for k in DATASET_KINDS if k in source]
            if len(kinds) > 1:
                self.error(where, _oneof_message(DATASET_KINDS, kinds))
            elif not kinds:
                self.error(where, "set one of tfrecord_file_path, npz, generator")
            elif "num_samples" in source and kinds != ["generator"]:
                self.error(where + ("num_samples",), "num_samples applies to a generator only", at_key=True)
            elif "deps" in source and kinds != ["generator"]:
                self.error(where + ("deps",), "deps applies to a generator only", at_key=True)
        if options.get("method", "STATIC_RANGE").upper() == "STATIC_RANGE":
            missing = [k for k in keys if k not in datasets]
            if missing:
                self.error(
                    path + ("representative_datasets",) if "representative_datasets" in options else path,
                    f"STATIC_RANGE quantization needs a representative dataset for {', '.join(map(repr, missing))}",
                )

    def check_op_libraries(self, entries: list[str]) -> None:
        from tpubuild.op_libraries import is_shared_library, missing_module

        for index, entry in enumerate(entries):
            if not isinstance(entry, str):
                continue  # the schema said so
            if is_shared_library(entry):
                problem = self.path_problem(entry, "file")  # relative to the workspace root
                if problem:
                    self.error(("op_libraries", index), f"{entry!r} {problem}")
            elif missing_module(entry):
                self.error(("op_libraries", index), f"module {entry!r} is not installed in this environment")

    def check_targets(self, targets: dict[str, Any] | None) -> None:
        for name, options in (targets or {}).items():
            path = ("targets", name)
            for key in ("rtol", "atol"):
                value = (options or {}).get(key)
                if isinstance(value, float) and not math.isfinite(value) and not value < 0:
                    self.error(path + (key,), f"must be a finite number >= 0, got {value}")


def _oneof_message(choices: tuple[str, ...], given: list[str]) -> str:
    return f"set exactly one of {', '.join(choices)} (got {' and '.join(given)})"


def generator_module_file(spec: str) -> str:
    """'pkg.mod:fn' -> 'pkg/mod.py' (importable from the workspace root)."""
    module = spec.split(":", 1)[0]
    return module.replace(".", "/") + ".py"


def expand_globs(patterns: list[str], root: Path) -> Iterator[str]:
    """Workspace-relative files matched by workspace-relative globs, sorted, no dirs."""
    found = set()
    for pattern in patterns:
        for match in glob.glob(str(root / pattern), recursive=True):
            if os.path.isfile(match):
                found.add(Path(os.path.relpath(match, root)).as_posix())
    return iter(sorted(found))
