"""Reading slices of the canonical recipe, shared by the stages' SPECs (TensorFlow-free)."""

from __future__ import annotations

from typing import Any

Canonical = dict[str, Any]

def tags(recipe: Canonical) -> list[str]:
    return recipe["model"]["tags"]


def converter(recipe: Canonical) -> dict[str, Any]:
    return recipe["converter"]


def effective_state(conv: dict[str, Any], field_name: str) -> bool:
    """Whether a default optimization runs: ENABLED wins, DISABLED loses, DEFAULT follows
    `disable_default_optimizations` (the converter turns bfloat16 and IO shape optimization on by default)."""
    state = conv.get(field_name, "DEFAULT")
    if state == "ENABLED":
        return True
    if state == "DISABLED":
        return False
    return not conv.get("disable_default_optimizations", False)


def dataset_sources(recipe: Canonical) -> dict[str, dict[str, Any]]:
    quant = converter(recipe).get("quantization_options") or {}
    return quant.get("representative_datasets", {})


def generated_datasets(recipe: Canonical) -> dict[str, dict[str, Any]]:
    """The sources the `dataset` stage turns into TFRecord files (npz, generator)."""
    return {k: v for k, v in dataset_sources(recipe).items() if "tfrecord_file_path" not in v}


def tfrecord_files(sources: dict[str, dict[str, Any]]) -> list[str]:
    """The given (not generated) TFRecord files of a signature -> source map."""
    return sorted(s["tfrecord_file_path"] for s in sources.values() if "tfrecord_file_path" in s)


def verify_datasets(recipe: Canonical) -> dict[str, dict[str, Any]]:
    """Verify's samples: its own datasets where given, else the quantization datasets."""
    return {**dataset_sources(recipe), **recipe["verify"].get("representative_datasets", {})}


# The TPU SavedModel: always built, by the main chain; the recipe's default `targets:`.
MAIN_TARGET = "tpu_savedmodel"


def targets(recipe: Canonical) -> dict[str, dict[str, Any]]:
    """The recipe's targets with their options (canonical: defaults filled)."""
    return recipe.get("targets", {MAIN_TARGET: {}})


def target_options(recipe: Canonical, target: str) -> dict[str, Any]:
    """A target stage's options: the target's own, the tags, and verify's sampling
    (`samples`, `seed`, representative datasets) so every target is checked on the
    same inputs as the TPU artifact."""
    return {
        **targets(recipe)[target],
        "tags": tags(recipe),
        "samples": recipe["verify"]["samples"],
        "seed": recipe["verify"]["seed"],
        "representative_datasets": verify_datasets(recipe),
    }
