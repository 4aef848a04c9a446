"""The one registry: which stages exist, in which order, which module runs each, which
serving targets there are, and which stages a recipe runs with which options
(TensorFlow-free).

Each stage declares itself beside its code (`SPEC`: options slice, files read, outputs
consumed); this module only names and orders them. `source` (hashing and snapshotting
the user's SavedModel directory) and `publish` (writing `out/<recipe>/<N>/`) are the
engine's own steps. No stage imports this module, so editing the registry reruns no
stage by itself (a stage's key covers its import closure, keys/code.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tpubuild.op_libraries import resolve as resolve_op_libraries
from tpubuild.stages.base import StageSpec, TargetSpec
from tpubuild.stages.selection import TRANSFORMS, main_chain
from tpubuild.stages.slices import MAIN_TARGET, targets

Canonical = dict[str, Any]

# The main chain, in the order of the converter's pipeline: stage -> module.
# A recipe runs a subsequence (stages/selection.py).
MAIN_STAGES = {
    "source": None,  # an existing SavedModel directory, snapshotted into the store (engine)
    "export": "tpubuild.stages.export",  # or: the user's export script makes the SavedModel
    "dataset": "tpubuild.stages.dataset",  # npz / generator datasets turned into TFRecord
    "quantize": "tpubuild.stages.quantize",
    "tpu": "tpubuild.stages.tpu",
    "bfloat16": "tpubuild.stages.bfloat16",
    "io_shape": "tpubuild.stages.io_shape",
    "batch": "tpubuild.stages.batch",
    "reshard": "tpubuild.stages.reshard",  # variables.max_shard_size: the checkpoint in files of a size
    # TF Serving warmup requests for the published SavedModels. Before verify: it reads the
    # final model's proto and runs none, so it runs in the transforms' worker, which it hands
    # on to verify, instead of on top of the CPU twin verify keeps loaded for report.
    "warmup": "tpubuild.stages.warmup",
    "verify": "tpubuild.stages.verify",
    "report": "tpubuild.stages.report",
}

# Serving targets besides the TPU SavedModel: target -> its folder, which holds `TARGET`
# (a TargetSpec: chain and defaults) in its `__init__`, `stage.py` and `verify_stage.py`.
# Adding a target is its folder, its schema entry and one line here.
TARGET_PACKAGES = {
    "cpu_savedmodel": "tpubuild.targets.cpu_savedmodel",
    "litert": "tpubuild.targets.litert",
    "xla_aot": "tpubuild.targets.xla_aot",
}

ENGINE_STEPS = frozenset({"source", "publish"})


@lru_cache(maxsize=None)
def target(name: str) -> TargetSpec:
    """The TargetSpec a target's folder declares (importing it never imports TensorFlow)."""
    return importlib.import_module(TARGET_PACKAGES[name]).TARGET


# Target -> (build stage, verify stage); the TPU SavedModel is the main chain's.
TARGET_STAGES: dict[str, tuple[str, ...]] = {
    MAIN_TARGET: (),
    **{name: target(name).chain for name in TARGET_PACKAGES},
}
# Every stage in pipeline order: the main chain, each target's chain, then publish.
STAGE_ORDER = (*MAIN_STAGES, *(s for chain in TARGET_STAGES.values() for s in chain), "publish")

__all__ = ["ENGINE_STEPS", "MAIN_STAGES", "STAGE_ORDER", "TARGET_PACKAGES", "TARGET_STAGES", "TRANSFORMS",
           "PlannedStage", "plan", "spec", "stage_module", "stage_names", "target", "target_chains"]


def stage_module(name: str) -> str:
    """The module whose `run` and `SPEC` are stage `name`."""
    module = MAIN_STAGES.get(name)
    if module:
        return module
    for target_name, chain in TARGET_STAGES.items():
        if name in chain:
            role = "stage" if name == chain[0] else "verify_stage"
            return f"{TARGET_PACKAGES[target_name]}.{role}"
    raise KeyError(f"no stage named {name!r}")


@lru_cache(maxsize=None)
def spec(name: str) -> StageSpec:
    """The SPEC of the stage's module (importing it never imports TensorFlow)."""
    return importlib.import_module(stage_module(name)).SPEC


def entry(name: str) -> str:
    """`module:function` that a worker runs for the stage."""
    return f"{stage_module(name)}:run"


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
    wanted = main_chain(recipe) | {"publish"}
    for name in targets(recipe):
        wanted.update(TARGET_STAGES[name])
    return [name for name in STAGE_ORDER if name in wanted]


def target_chains(names: list[str]) -> dict[str, tuple[str, ...]]:
    """Target -> (build stage, verify stage), for the target chains among `names`."""
    return {name: chain for name, chain in TARGET_STAGES.items() if chain and chain[0] in names}


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
                        **({"warmup": "warmup"} if "warmup" in roles else {}),
                        **{name: build for name, (build, _) in chains.items()}}
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
