"""Which stages a recipe runs, in which order, with which options (TensorFlow-free).

Each stage declares itself in `stages/<name>.py` (`SPEC`: options slice, files read,
outputs consumed); this module only orders them. `source` (hashing and snapshotting the
user's SavedModel directory) and `publish` (writing `out/<recipe>/<N>/`) are the
engine's own steps.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tpubuild.op_libraries import resolve as resolve_op_libraries
from tpubuild.stages.base import StageSpec
from tpubuild.stages.slices import TARGET_STAGES, TRANSFORMS, converter, effective_state, generated_datasets, targets

Canonical = dict[str, Any]

# The target chains this tpubuild has stage modules for (stages/slices.py TARGET_STAGES),
# in this order after `report`. Adding a target's stages is one line here.
TARGET_CHAINS = (
    *TARGET_STAGES["cpu_savedmodel"],
    *TARGET_STAGES["litert"],
    *TARGET_STAGES["xla_aot"],
)

# The order of the converter's pipeline (design.md). A recipe runs a subsequence.
STAGE_ORDER = (
    "source",  # an existing SavedModel directory, snapshotted into the store
    "export",  # or: the user's export script, run in a fresh process, makes the SavedModel
    "dataset",  # npz / generator representative datasets turned into TFRecord
    "quantize",
    "tpu",
    "bfloat16",
    "io_shape",
    "batch",
    "verify",
    "report",
    *TARGET_CHAINS,  # each target the recipe lists: its build stage, then its verify stage
    "publish",
)
ENGINE_STEPS = frozenset({"source", "publish"})

__all__ = ["STAGE_ORDER", "TARGET_CHAINS", "TRANSFORMS", "PlannedStage", "effective_state", "plan", "spec", "stage_names",
           "target_chains"]


@lru_cache(maxsize=None)
def spec(name: str) -> StageSpec:
    """The SPEC of `stages/<name>.py` (importing it never imports TensorFlow)."""
    return importlib.import_module(f"tpubuild.stages.{name}").SPEC


@dataclass(frozen=True)
class PlannedStage:
    name: str
    options: dict[str, Any]
    files: list[str] = field(default_factory=list)
    # Stage names whose outputs (files) this stage reads, by role, and whose summaries it reads.
    consumes: dict[str, str] = field(default_factory=dict)
    summaries: tuple[str, ...] = ()


def stage_names(recipe: Canonical) -> list[str]:
    """The stages this recipe runs, in pipeline order."""
    conv = converter(recipe)
    has_tpu = bool(conv["tpu_functions"])
    bf16_scope_all = conv["bfloat16_optimization_options"]["scope"] == "ALL"
    wanted = {
        "source": "saved_model" in recipe["model"],
        "export": "export" in recipe["model"],
        "dataset": bool(generated_datasets(recipe)),
        "quantize": bool(conv.get("quantization_options")),
        "tpu": has_tpu,
        # With scope TPU there is nothing to convert when nothing is on the TPU.
        "bfloat16": effective_state(conv, "bfloat16_optimization") and (has_tpu or bf16_scope_all),
        "io_shape": effective_state(conv, "io_shape_optimization") and has_tpu,
        "batch": bool(conv["batch_options"]),
        "verify": True,
        "report": True,
        "publish": True,
    }
    for target in targets(recipe):
        wanted.update(dict.fromkeys(TARGET_STAGES[target], True))
    return [name for name in STAGE_ORDER if wanted.get(name)]


def target_chains(names: list[str]) -> dict[str, tuple[str, str]]:
    """Target -> (build stage, verify stage), for the target chains among `names`."""
    return {target: chain for target, chain in TARGET_STAGES.items() if chain and chain[0] in names}


def plan(recipe: Canonical) -> list[PlannedStage]:
    """The recipe's stages with the options, files and earlier outputs each one reads."""
    planned: list[PlannedStage] = []
    roles: dict[str, str] = {}  # role -> the stage that provides it so far
    libraries = resolve_op_libraries(recipe["op_libraries"]) if recipe.get("op_libraries") else []
    for name in stage_names(recipe):
        if name == "source":
            planned.append(PlannedStage(name, {"saved_model": recipe["model"]["saved_model"]}))
        elif name == "publish":
            # The final model, the report's files and each target's build output (published
            # beside it, role = target name); each target's verdict is read as a summary.
            # The recipe name names the directory.
            chains = target_chains([p.name for p in planned])
            consumes = {"model": roles["model"], **({"report": "report"} if "report" in roles else {}),
                        **{target: build for target, (build, _) in chains.items()}}
            summaries = tuple(verify for _, verify in chains.values())
            planned.append(PlannedStage(name, {"name": recipe["name"]}, [], consumes, summaries))
        else:
            s = spec(name)
            consumes = {role: roles[role] for role in s.consumes if role in roles}
            ran = {p.name for p in planned}
            summaries = tuple(n for n in s.summaries if n in ran)
            options, files = s.options(recipe), sorted(s.files(recipe))
            if libraries:  # every stage loads them, so every key covers them (op_libraries.py)
                options = {**options, "op_libraries": libraries}
                files = sorted({*files, *(e["library"] for e in libraries if "library" in e)})
            planned.append(PlannedStage(name, options, files, consumes, summaries))
        if name in TRANSFORMS:
            roles["model"] = name
            roles.setdefault("source", name)
        roles.setdefault(name, name)
        if name == "dataset":
            roles["dataset"] = name
    return planned
