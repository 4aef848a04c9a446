"""The build loop: recipes resolved into stage keys (`resolver`), the doit task graph that runs
the stages and publishes (`loop`, `tasks`), why a stage would run (`explain`), and
`build --check` beyond the lock files' quick answer (`lockcheck`). The main process never
imports TensorFlow; the workers do.
"""

from __future__ import annotations

from typing import Any

# The package's face: name -> the module of this package that defines it, imported on first
# use (PEP 562), so that importing one part of the package loads no other. keys/code.py
# reads this mapping to follow `from tpubuild.engine import name` to its module.
_FACE = {
    "DRY_RUN_ORDER": "explain",
    "Engine": "loop",
    "build": "loop",
    "check_lines": "lockcheck",
    "expand_inputs": "resolver",
    "explain_lines": "explain",
    "new_runs": "resolver",
    "resolve": "explain",
    "stage_words": "explain",
    "state_word": "explain",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, the import statement's own path (-X importtime sees it), not importlib's.
    return getattr(__import__(f"{__name__}.{_FACE[name]}", fromlist=[name]), name)


def __dir__() -> list[str]:
    return __all__
