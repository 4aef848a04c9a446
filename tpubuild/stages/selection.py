"""Which model-changing stages a recipe runs (TensorFlow-free).

The one place that decides it: the pipeline orders the stages by it, and `verify`
picks its default tolerances by the transforms that were applied.
"""

from __future__ import annotations

from typing import Any

from tpubuild.stages.slices import converter, effective_state, generated_datasets

Canonical = dict[str, Any]

# Model-changing stages: each writes a SavedModel that the next one reads as `input_dir`.
TRANSFORM_ORDER = ("source", "export", "quantize", "tpu", "bfloat16", "io_shape", "batch", "reshard")
TRANSFORMS = frozenset(TRANSFORM_ORDER)


def main_chain(recipe: Canonical) -> set[str]:
    """The stages of the main chain (source or export ... report) this recipe runs."""
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
        "reshard": "variables" in recipe,  # variables.max_shard_size: the checkpoint's files, values unchanged
        "verify": True,
        "warmup": warmup_enabled(recipe),
        "report": True,
    }
    return {name for name, runs in wanted.items() if runs}


def warmup_enabled(recipe: Canonical) -> bool:
    """TF Serving warmup requests: as the recipe's `warmup.enabled` says, else when it batches
    (a batched model compiles one program per batch size)."""
    if "warmup" in recipe:
        return bool(recipe["warmup"]["enabled"])
    return bool(converter(recipe)["batch_options"])


def applied_transforms(recipe: Canonical) -> list[str]:
    """The transforms after the source that this recipe applies, in pipeline order."""
    runs = main_chain(recipe)
    return [name for name in TRANSFORM_ORDER[2:] if name in runs]
