"""Publishing to a destination, tested against the remote cache's real S3-protocol server
(moto's, on 127.0.0.1) and the engine's tiny model: their fixtures, shared."""

from __future__ import annotations

from tests.engine.conftest import tiny_saved_model  # noqa: F401 (a session fixture, made once per run)
from tests.remote.conftest import s3  # noqa: F401 (a session fixture: one server per process and directory)
