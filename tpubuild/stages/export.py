"""Stage `export`: run the recipe's export script, `function(output_dir)`, in the worker."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages.base import StageContext, StageResult


def run(input_dir: Path | None, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    script = context.workspace / options["script"]
    function_name = options["function"]
    where = f"{options['script']}: {function_name}"
    module_name = f"_tpubuild_export_{abs(hash((str(script), script.stat().st_mtime_ns)))}"
    spec = importlib.util.spec_from_file_location(module_name, script)
    if spec is None or spec.loader is None:
        raise StageError(f"{options['script']}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # The script may import its neighbours (its `deps`), as it would when run directly.
    sys.path.insert(0, str(script.parent))
    before = set(sys.modules)
    try:
        spec.loader.exec_module(module)
        function = getattr(module, function_name, None)
        if not callable(function):
            raise StageError(f"{options['script']}: has no function {function_name!r}")
        try:
            function(str(output_dir))
        except StageError:
            raise
        except Exception as exc:  # the user's code failed: their error, not a tpubuild bug
            raise StageError(f"{where}: raised {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(script.parent))
        # The worker runs more stages: its next export must re-read edited neighbours.
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(script.parent)):
                del sys.modules[name]
    if not (output_dir / "saved_model.pb").is_file():
        raise StageError(f"{where}: wrote no SavedModel (no saved_model.pb in its output directory)")
    from tpubuild.savedmodel.model import make_fingerprint_reproducible

    make_fingerprint_reproducible(output_dir)
    return StageResult(summary={"script": options["script"], "function": function_name})
