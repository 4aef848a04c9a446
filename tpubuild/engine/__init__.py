"""The build loop: recipes resolved into stage keys (`resolver`), the doit task graph that runs
the stages and publishes (`loop`, `tasks`; what a build is asked, `options`, and tells,
`events`; a run's version, `version`, and its lock document, `lockdoc`), why a stage would run (`explain`),
`build --check` beyond the lock files' quick answer (`lockcheck`), and each recipe's builds
as `report --html` draws them (`history`). The main process never
imports TensorFlow; the workers do.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "BuildEvents": "events",
    "BuildOptions": "options",
    "DRY_RUN_ORDER": "explain",
    "Engine": "loop",
    "build": "loop",
    "check_lines": "lockcheck",
    "expand_inputs": "resolver",
    "explain_lines": "explain",
    "new_runs": "resolver",
    "read_history": "history",
    "resolve": "explain",
    "stage_words": "explain",
    "state_word": "explain",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
