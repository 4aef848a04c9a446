"""Stage `export`: run the recipe's export script, `function(output_dir)`, in the worker."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from tpubuild.errors import StageError
from tpubuild.stages.base import RUNS_USER_CODE, StageContext, StageResult, StageSpec
from tpubuild.user_code import missing_file_hint

SPEC = StageSpec(
    "export",
    options=lambda r: {"script": r["model"]["export"]["script"], "function": r["model"]["export"]["function"]},
    # The script and its declared data files; the modules it imports are discovered.
    files=lambda r: [r["model"]["export"]["script"], *r["model"]["export"]["deps"]],
    consumes=(),
    runs_user_code=True,
    memory=RUNS_USER_CODE,  # its peak memory (stages/base.py, measured there)
)


def run(input_dir: Path | None, output_dir: Path, options: dict[str, Any], context: StageContext) -> StageResult:
    """Import the script as `__main__`-less module and call `function(output_dir)`.

    The engine runs this in a fresh worker process for every export (SPEC.runs_user_code):
    no state of an earlier export (TensorFlow's function counters, imported neighbours)
    can leak into this one, and every workspace module it imports is recorded."""
    script = context.workspace / options["script"]
    function_name = options["function"]
    where = f"{options['script']}: {function_name}"
    spec = importlib.util.spec_from_file_location("_tpubuild_export", script)
    if spec is None or spec.loader is None:
        raise StageError(f"{options['script']}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # The script imports its neighbours and opens its files as when run from its own
    # directory: both resolve beside the script, as every path in a recipe resolves beside
    # the recipe (this is a fresh worker process of its own: the change ends with it).
    sys.path.insert(0, str(script.parent))
    os.chdir(script.parent)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise StageError(f"{_rel(exc.filename, context)}:{exc.lineno}:{exc.offset or 0}: SyntaxError: {exc.msg}") from None
    except Exception as exc:
        raise user_error(f"{options['script']}: importing it raised", exc, context) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise StageError(f"{options['script']}: has no function {function_name!r}")
    try:
        function(str(output_dir))
    except StageError:
        raise
    except Exception as exc:  # the user's code failed: their error, not a tpubuild bug
        raise user_error(f"{where}: raised", exc, context) from None
    if not (output_dir / "saved_model.pb").is_file():
        raise StageError(f"{where}: wrote no SavedModel (no saved_model.pb in its output directory)")
    from tpubuild.savedmodel.alias_variables import drop_alias_lists_in_place
    from tpubuild.savedmodel.reproducible import make_reproducible
    from tpubuild.savedmodel.variable_handles import Duplicate, normalize_in_place

    # One graph handle per weight, restored by the checkpoint: Keras 3 models are saved
    # with a duplicate (savedmodel/variable_handles.py says why and what is rewritten).
    changed = normalize_in_place(output_dir)
    # One object per weight: Keras's export also saves a list of aliases, in an order that
    # changes from process to process (savedmodel/alias_variables.py).
    aliases = drop_alias_lists_in_place(output_dir)
    # The same script gives the same bytes in any process on any machine: function names
    # from content, not TensorFlow's per-process counters (savedmodel/reproducible.py).
    make_reproducible(output_dir)
    merged = sum(isinstance(c, Duplicate) for c in changed)
    summary = {"merged_variable_handles": merged} if merged else {}
    if len(changed) > merged:
        summary["removed_unused_variable_handles"] = len(changed) - merged
    if aliases:
        summary["removed_alias_objects"] = aliases
    return StageResult(summary=summary)


def user_error(prefix: str, exc: BaseException, context: StageContext) -> StageError:
    """A StageError naming the user's own frames (file:line), innermost last; the full
    traceback goes with it for `--debug` and the worker log."""
    frames = [
        f"{_rel(frame.filename, context)}:{frame.lineno} in {frame.name}"
        for frame in traceback.extract_tb(exc.__traceback__)
        if _in_workspace(frame.filename, context)
    ]
    where = f" (at {' <- '.join(reversed(frames))})" if frames else ""
    return StageError(f"{prefix} {type(exc).__name__}: {exc}{where}{missing_file_hint(exc, 'script', context.workspace)}",
                      detail="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _in_workspace(filename: str, context: StageContext) -> bool:
    import tpubuild

    if not os.path.isabs(filename):
        return False  # `<frozen importlib._bootstrap>`, `<string>`: no file of the user's
    path = os.path.realpath(filename)
    package = os.path.dirname(os.path.realpath(tpubuild.__file__))
    return path.startswith(os.path.join(os.path.realpath(context.workspace), "")) and not path.startswith(package)


def _rel(filename: str | None, context: StageContext) -> str:
    if not filename:
        return "<unknown>"
    if _in_workspace(filename, context):
        return Path(os.path.relpath(os.path.realpath(filename), os.path.realpath(context.workspace))).as_posix()
    return filename
