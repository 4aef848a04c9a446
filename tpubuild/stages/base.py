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

MiB = 2**20


@dataclass(frozen=True)
class ModelSizes:
    """What a stage's memory estimate reads of its input SavedModel (the largest one it
    consumes: verify loads the source and the artifact one after the other)."""

    model: int = 0  # every file: variables and graph
    graph: int = 0  # saved_model.pb
    # The largest tensor: for a stage that streams the checkpoint, read from variables.index
    # (savedmodel/bundle_index.py, by the engine); else the largest variables data file, its
    # upper bound.
    largest: int = 0

    @classmethod
    def of(cls, trees: list[list[Any]]) -> ModelSizes:
        """Of the consumed outputs' file lists (FileEntry: path, size), the largest model's."""
        sizes = [cls(sum(f.size for f in files),
                     sum(f.size for f in files if f.path.rsplit("/", 1)[-1] in ("saved_model.pb", "saved_model.pbtxt")),
                     max((f.size for f in files if f.path.startswith("variables/variables.data")), default=0))
                 for files in trees]
        return max(sizes, key=lambda s: s.model, default=cls())

    @classmethod
    def for_estimate(cls, estimate: MemoryEstimate, consumed: list[tuple[list[Any], Path]]) -> ModelSizes | None:
        """What `estimate` reads of the consumed SavedModels (each its file list and its
        directory): for a stage that streams the checkpoint, the largest tensor as each
        variables.index says it (savedmodel/bundle_index.py, no TensorFlow), not the
        largest data file, which is the whole model when it is one shard. The engine's gate
        (engine/loop.py) and the beside worker's (engine/beside.py) read sizes here alike."""
        if not consumed:
            return None
        sizes = cls.of([files for files, _ in consumed])
        if estimate.largest:
            from dataclasses import replace

            from tpubuild.savedmodel.bundle_index import largest_tensor_bytes

            known = [largest_tensor_bytes(directory) for _, directory in consumed]
            if None not in known:
                sizes = replace(sizes, largest=max(n for n in known if n is not None))
        return sizes


@dataclass(frozen=True)
class MemoryEstimate:
    """A stage's peak memory (its worker's resident set), from its input model's size:
    fixed + model x the model's bytes + graph x saved_model.pb's + largest x the largest
    variables file's. A stage that starts from nothing it can measure (export: user code)
    assumes `unknown_model` bytes of model. The local pool starts a stage only while the
    estimates of what runs fit the available memory (workers/pool.py MemoryGate); Ray
    reserves it (workers/ray.py). Each constant says where it was measured."""

    fixed: int
    model: float = 0.0
    graph: float = 0.0
    largest: float = 0.0
    unknown_model: int = 0

    def bytes(self, sizes: ModelSizes | None) -> int:
        if sizes is None or sizes.model == 0:
            sizes = ModelSizes(self.unknown_model, 0, 0)
        return int(self.fixed + self.model * sizes.model + self.graph * sizes.graph + self.largest * sizes.largest)


# The constants below were measured with benchmarks/memory_fit.py's models (dense stacks
# of 32 float32 matrices, tanh between; bfloat16 and verify on 8 samples), each stage's
# peak RSS from `tpubuild build --json` / the lock file (TF 2.21, 2 cores, a shared
# machine). `-j 1`, at 128 MiB of model: tpu 841 MiB, bfloat16 848, io_shape 840, verify
# 856, report 862; at 512 MiB: tpu 1,237, bfloat16 1,268, io_shape 1,244, verify 1,250,
# report 1,255. The line through them meets a model of 0 bytes at ~709 MiB: a worker that
# imported TensorFlow (without JAX, workers/lean_import.py) and holds what its earlier
# stages left. `-j 2` of two 1,013 MiB models (workers shared by both recipes, so a stage
# may start on the leftovers of the other recipe's): tpu 1,751 and 1,748 MiB, bfloat16
# 1,812 and 2,362, io_shape 1,768 and 2,312, verify 2,291 and 2,329, report 2,291 and
# 2,326: up to 1.62x the model above the baseline.
TF_BASELINE = 720 * MiB
# Graph-only edits (tpu, batch, io_shape): they parse, check and rewrite saved_model.pb and
# hard-link the variables (issue 54 item 1); no variable value is read (tpu's checks,
# tpu/runtime_check.py, run on the graph). Measured with benchmarks/large_models.py (the
# lock file's peak_memory, `-j 1`, 2 cores): tpu 662 MiB, io_shape and batch 663 at 2 GiB
# of model; 854, 829, 829 at 8 GiB; ResNet50 (98 MiB, a 1.7 MB graph) 649-656. The peaks
# grow by ~0.03x the model (the index and file lists); 0.1x keeps a margin of three, and
# the graph counts as STREAMS_CHECKPOINT counts it (parsed, edited, serialized). The 1.5x
# this replaced (measured when tpu's checks loaded the model) kept the beside worker
# (engine/beside.py) off at 8 GiB, where it fits.
GRAPH_ONLY = MemoryEstimate(TF_BASELINE, model=0.1, graph=4.0)
# A stage that streams the checkpoint tensor by tensor (read one, cast, write: bfloat16
# after issue 54 item 1): the graph a few times (parsed, edited, serialized) and the float32
# tensor with its cast (2x the float32 tensor: conservative, the cast is half its size).
# The largest tensor is read from the checkpoint's index without TensorFlow
# (savedmodel/bundle_index.py); where it cannot be, the largest variables data file stands
# in for it (a one-shard checkpoint then counts as one tensor the size of the model).
# Measured after the streaming rewrite (savedmodel/tensor_bundle.py, 8 MiB chunks): a 1 GiB
# float32 model's bfloat16 stage 709-861 MiB, near the worker's baseline; the estimate stays
# conservative (2x the largest tensor), since a tensor's cast may be made whole where a chunk
# cannot be taken (the whole-model SaveV2 fallback for variant or big-endian bundles).
STREAMS_CHECKPOINT = MemoryEstimate(TF_BASELINE, graph=4.0, largest=2.0)
# Stages that load the model with TensorFlow's runtime and run it (verify, report,
# quantize, warmup, the targets' builds and verifications): measured 1.03x at 512 MiB and
# 1.55-1.59x at 1 GiB (verify's source and artifact, report's); loading a model with TF
# allocates a tensor per variable beside the checkpoint read's buffers (ResNet50 verify in
# its own worker: 833 MiB for a 98 MiB model, workers/pool.py), so 1.75x.
LOADS_MODEL = MemoryEstimate(TF_BASELINE, model=1.75)
# User code (export, dataset generators): what it does is the user's; it is estimated as
# a model load of its input, or, for export (which starts from nothing), of the model it
# made in the build its lock file records (engine/loop.py _earlier_output), else of
# UNKNOWN_MODEL bytes.
UNKNOWN_MODEL = 1024 * MiB
RUNS_USER_CODE = MemoryEstimate(TF_BASELINE, model=1.75, unknown_model=UNKNOWN_MODEL)


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
    # Its peak memory from its input model's size (MemoryEstimate); None: LOADS_MODEL for
    # a stage that runs models or user code, else GRAPH_ONLY.
    memory: MemoryEstimate | None = None

    @property
    def memory_estimate(self) -> MemoryEstimate:
        if self.memory is not None:
            return self.memory
        if self.runs_user_code:
            return RUNS_USER_CODE
        return LOADS_MODEL if self.runs_models else GRAPH_ONLY

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
