"""The contract between the build engine and a stage (TensorFlow-free).

Each stage module (registered in `tpubuild.pipeline`) exports `SPEC`, a `StageSpec` that says, next to the stage's
code, everything the engine needs to key it without importing TensorFlow: the slice of
the canonical recipe it reads, the workspace files it reads, and which earlier outputs
and summaries it consumes. The engine hashes exactly those into the stage's key and
hands the stage exactly those (nothing unhashed reaches a stage), so a change that a
stage does not read never reruns it (early cutoff across stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

Canonical = dict[str, Any]

# Roles of earlier outputs a stage may consume (besides earlier stages' summaries):
MODEL = "model"  # the SavedModel made by the nearest earlier model-changing stage: `input_dir`
SOURCE = "source"  # the SavedModel the chain starts from (`source` or `export` output)
DATASET = "dataset"  # the TFRecord files written by the `dataset` stage


@dataclass(frozen=True)
class StageSpec:
    name: str
    # The recipe slice this stage reads; hashed into its key, passed as `options`.
    options: Callable[[Canonical], dict[str, Any]]
    # Workspace-relative files (globs allowed) whose content the stage reads.
    files: Callable[[Canonical], list[str]] = lambda recipe: []
    # Earlier outputs whose files the stage reads (MODEL, SOURCE, DATASET).
    consumes: tuple[str, ...] = (MODEL,)
    # Earlier stages whose summaries (and warnings) the stage reads.
    summaries: tuple[str, ...] = ()
    # Runs user code: a fresh process per run, and every workspace module it imports
    # becomes a discovered input of the stage (like a compiler's dep file).
    runs_user_code: bool = False
    # Reports what it read beyond its key (StageResult.discovered), e.g. the bfloat16
    # stage the jax/jaxlib versions it rewrote a jax2tf module with: discovered inputs,
    # checked before its record is reused, like a user-code stage's imports. Unlike an
    # option, such an input keys only the outputs that depended on it (a model without
    # StableHLO does not change with the installed jaxlib).
    reports_inputs: bool = False
    # Loads and runs models with TensorFlow's runtime (tf.saved_model.load, a Session):
    # on a large model it runs in a worker of its own (workers/pool.py OWN_WORKER_MIN_BYTES).
    runs_models: bool = False
    # Its output may legitimately differ between CPUs (measured floats), for these options:
    # lock files mark it, and everything keyed on it, as measured on the building machine.
    machine_dependent: Callable[[dict[str, Any]], bool] = lambda options: False

    @property
    def discovers(self) -> bool:
        """Its record is stored under a final key made of its declared key and the inputs
        it discovered (engine/resolver.py add_discovered)."""
        return self.runs_user_code or self.reports_inputs


@dataclass(frozen=True)
class TargetSpec:
    """A serving target besides the TPU SavedModel, declared in its folder's `__init__`:
    the stage that builds it, the stage that verifies it, and its options' defaults (the
    schema's, filled into the canonical recipe)."""

    name: str
    build: str
    verify: str
    defaults: dict[str, Any] = field(default_factory=dict)
    # Its artifact is a SavedModel TF Serving loads: it gets the warmup requests too.
    savedmodel: bool = False

    @property
    def chain(self) -> tuple[str, str]:
        return (self.build, self.verify)


@dataclass
class StageContext:
    """What a stage may know beyond its input directory and its options.

    Nothing here names the recipe: a cached output is shared by every recipe whose key
    matches, so it must not embed a recipe name or path (the publish step adds those)."""

    workspace: Path  # absolute root of the workspace (canonical paths are relative to it)
    # The consumed outputs of earlier stages, by role (SOURCE, DATASET) or stage name.
    inputs: dict[str, Path] = field(default_factory=dict)
    # StageResult.summary of the consumed earlier stages, by stage name.
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    log: Callable[[str], None] = lambda message: None
    # verify only: where the source's outputs are being computed beside the earlier stages
    # (verify/reference.py), or None. Which process computes them changes no output.
    reference_dir: Path | None = None

    @property
    def source_dir(self) -> Path | None:
        return self.inputs.get(SOURCE)


@dataclass
class StageResult:
    """What a stage reports; `summary` must be JSON-serializable (it is cached)."""

    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # A `reports_inputs` stage's discovered inputs: `dist:<name>` -> installed version
    # (workers/import_record.py ABSENT when it is not installed).
    discovered: dict[str, str] = field(default_factory=dict)


class Stage(Protocol):
    def __call__(
        self, input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext
    ) -> StageResult: ...
