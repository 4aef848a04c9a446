"""The lock files' tests read the engine's built workspace: its fixtures, shared (made once per
run, tests/once.py, whichever directory asks first)."""

from __future__ import annotations

from tests.engine.conftest import built_once, built_workspace, tiny_saved_model  # noqa: F401 (fixtures)
