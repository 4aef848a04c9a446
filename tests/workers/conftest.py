"""The workers' tests build real workspaces as the engine's do: its fixtures, shared (made once
per run, tests/once.py, whichever directory asks first)."""

from __future__ import annotations

from tests.engine.conftest import make_workspace, tiny_saved_model  # noqa: F401 (fixtures)
