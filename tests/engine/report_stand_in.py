"""A minimal report stage used only by the engine tests while `tpubuild.stages.report`
does not exist: it writes the earlier stages' summaries, as the real one must."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpubuild.stages.base import StageContext, StageResult


def run(input_dir: Path, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    report = {"recipe": context.recipe_name, "stages": context.results}
    (output_dir / "tpubuild-report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return StageResult(summary={"stages": sorted(context.results)})
