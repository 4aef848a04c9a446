"""The store's tests build real workspaces as the engine's do: its fixtures, shared (each is
made once per run, tests/once.py, whichever directory asks first)."""

from __future__ import annotations

from tests.engine.conftest import (  # noqa: F401 (fixtures)
    built_once,
    built_workspace,
    make_workspace,
    tiny_saved_model,
)
