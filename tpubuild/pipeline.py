"""Which stages a recipe runs, in which order, and with which options (TensorFlow-free).

The engine hashes each stage's `options` slice into its cache key, so a slice must hold
everything that stage reads from the recipe and nothing else: editing `verify.rtol`
must not rerun `tpu`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Canonical = dict[str, Any]

# The order of the converter's pipeline (design.md). A recipe runs a subsequence.
STAGE_ORDER = (
    "source",  # an existing SavedModel directory, hashed as the chain's first input
    "export",  # or: the user's export script, run in a worker, makes the SavedModel
    "dataset",  # npz / generator representative datasets turned into TFRecord
    "quantize",
    "tpu",
    "bfloat16",
    "io_shape",
    "batch",
    "verify",
    "report",
    "publish",
)

# Stages that turn a SavedModel into a SavedModel; the others read the chain's model
# (verify, report) or produce side inputs (dataset) and leave the model as it was.
TRANSFORMS = frozenset({"source", "export", "quantize", "tpu", "bfloat16", "io_shape", "batch"})


@dataclass(frozen=True)
class StageSpec:
    name: str
    # "module:function" imported lazily, in a worker, only when the stage really runs.
    entry: str | None
    # Bumped whenever the stage's output for the same inputs may change.
    version: int
    options: Callable[[Canonical], dict[str, Any]]
    # Workspace-relative files (globs allowed) whose content is an input of the stage.
    files: Callable[[Canonical], list[str]] = lambda recipe: []


@dataclass(frozen=True)
class PlannedStage:
    name: str
    options: dict[str, Any]
    files: list[str] = field(default_factory=list)


def effective_state(converter: dict[str, Any], field_name: str) -> bool:
    """Whether a default optimization runs: ENABLED wins, DISABLED loses, DEFAULT follows
    `disable_default_optimizations` (converter-reference.md, "The four default steps")."""
    state = converter.get(field_name, "DEFAULT")
    if state == "ENABLED":
        return True
    if state == "DISABLED":
        return False
    return not converter.get("disable_default_optimizations", False)


def _tags(recipe: Canonical) -> list[str]:
    return recipe["model"]["tags"]


def _converter(recipe: Canonical) -> dict[str, Any]:
    return recipe["converter"]


def _dataset_sources(recipe: Canonical) -> dict[str, dict[str, Any]]:
    quant = _converter(recipe).get("quantization_options") or {}
    return quant.get("representative_datasets", {})


def _generated_datasets(recipe: Canonical) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in _dataset_sources(recipe).items() if "tfrecord_file_path" not in v}


def _dataset_files(recipe: Canonical) -> list[str]:
    files = []
    for source in _generated_datasets(recipe).values():
        if "npz" in source:
            files.append(source["npz"])
        else:
            files.append(source["module_file"])
    return sorted(files)


def _tfrecord_files(sources: dict[str, dict[str, Any]]) -> list[str]:
    """The given (not generated) TFRecord files of a signature -> source map."""
    return sorted(s["tfrecord_file_path"] for s in sources.values() if "tfrecord_file_path" in s)


def _quantize_files(recipe: Canonical) -> list[str]:
    return _tfrecord_files(_dataset_sources(recipe))


def _verify_datasets(recipe: Canonical) -> dict[str, dict[str, Any]]:
    """Verify's samples: its own datasets where given, else the quantization datasets."""
    return {**_dataset_sources(recipe), **recipe["verify"].get("representative_datasets", {})}


def _verify_options(recipe: Canonical) -> dict[str, Any]:
    return {
        "tags": _tags(recipe),
        "applied": _applied(recipe),
        **recipe["verify"],
        "representative_datasets": _verify_datasets(recipe),
    }


def _verify_files(recipe: Canonical) -> list[str]:
    return _tfrecord_files(_verify_datasets(recipe))


def _applied(recipe: Canonical) -> list[str]:
    """Names of the model-changing stages, so verify can pick default tolerances."""
    return [name for name in stage_names(recipe) if name in TRANSFORMS - {"source", "export"}]


STAGES: dict[str, StageSpec] = {
    spec.name: spec
    for spec in (
        StageSpec("source", None, 1, lambda r: {"saved_model": r["model"]["saved_model"]}),
        StageSpec(
            "export",
            "tpubuild.stages.export:run",
            1,
            lambda r: dict(r["model"]["export"]),
            lambda r: [r["model"]["export"]["script"], *r["model"]["export"]["deps"]],
        ),
        StageSpec(
            "dataset",
            "tpubuild.stages.dataset:run",
            1,
            lambda r: {"tags": _tags(r), "datasets": _generated_datasets(r)},
            _dataset_files,
        ),
        StageSpec(
            "quantize",
            "tpubuild.stages.quantize:run",
            1,
            # tpu_functions: functions placed by alias or concrete name are kept by name.
            lambda r: {
                "tags": _tags(r), **_converter(r)["quantization_options"],
                "tpu_functions": _converter(r)["tpu_functions"],
            },
            _quantize_files,
        ),
        StageSpec(
            "tpu",
            "tpubuild.stages.tpu:run",
            1,
            lambda r: {
                "tags": _tags(r),
                "tpu_functions": _converter(r)["tpu_functions"],
                "xla_sharding_options": _converter(r).get("xla_sharding_options"),
            },
        ),
        StageSpec(
            "bfloat16",
            "tpubuild.stages.bfloat16:run",
            1,
            lambda r: {
                "tags": _tags(r),
                "tpu_functions": _converter(r)["tpu_functions"],
                "bfloat16_optimization_options": _converter(r)["bfloat16_optimization_options"],
            },
        ),
        StageSpec(
            "io_shape",
            "tpubuild.stages.io_shape:run",
            1,
            lambda r: {"tags": _tags(r), "tpu_functions": _converter(r)["tpu_functions"]},
        ),
        StageSpec(
            "batch",
            "tpubuild.stages.batch:run",
            1,
            lambda r: {
                "tags": _tags(r),
                "tpu_functions": _converter(r)["tpu_functions"],
                "batch_options": _converter(r)["batch_options"],
            },
        ),
        StageSpec(
            "verify",
            "tpubuild.stages.verify:run",
            1,
            # The representative datasets, when there are any, are verify's samples.
            _verify_options,
            _verify_files,
        ),
        StageSpec("report", "tpubuild.stages.report:run", 1, lambda r: {"tags": _tags(r)}),
        StageSpec("publish", None, 1, lambda r: {"name": r["name"]}),
    )
}


def stage_names(recipe: Canonical) -> list[str]:
    """The stages this recipe runs, in pipeline order."""
    converter = _converter(recipe)
    has_tpu = bool(converter["tpu_functions"])
    bf16_scope_all = converter["bfloat16_optimization_options"]["scope"] == "ALL"
    wanted = {
        "source": "saved_model" in recipe["model"],
        "export": "export" in recipe["model"],
        "dataset": bool(_generated_datasets(recipe)),
        "quantize": bool(converter.get("quantization_options")),
        "tpu": has_tpu,
        # With scope TPU there is nothing to convert when nothing is on the TPU.
        "bfloat16": effective_state(converter, "bfloat16_optimization")
        and (has_tpu or bf16_scope_all),
        "io_shape": effective_state(converter, "io_shape_optimization") and has_tpu,
        "batch": bool(converter["batch_options"]),
        "verify": True,
        "report": True,
        "publish": True,
    }
    return [name for name in STAGE_ORDER if wanted[name]]


def plan(recipe: Canonical) -> list[PlannedStage]:
    """The recipe's stages with the options slice and input files each one hashes."""
    planned = []
    for name in stage_names(recipe):
        spec = STAGES[name]
        planned.append(PlannedStage(name, spec.options(recipe), sorted(spec.files(recipe))))
    return planned
