"""The contract between the build engine and a stage (TensorFlow-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol


@dataclass
class StageContext:
    """What a stage may know beyond its input directory and its options."""

    workspace: Path  # absolute root of the workspace (where tpubuild.yaml is)
    recipe_name: str
    recipe_file: Path  # absolute path of the recipe YAML
    # Outputs of the stages that already ran for this recipe, by stage name.
    # "source" is always there for stages after it: the SavedModel the chain starts from.
    inputs: dict[str, Path] = field(default_factory=dict)
    # StageResult.summary of the stages that already ran, by stage name.
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    log: Callable[[str], None] = lambda message: None

    @property
    def source_dir(self) -> Path | None:
        return self.inputs.get("source")


@dataclass
class StageResult:
    """What a stage reports; `summary` must be JSON-serializable (it is cached)."""

    summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class Stage(Protocol):
    def __call__(
        self, input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext
    ) -> StageResult: ...
