"""`schemas/converter_options.proto` compiled at test time with protoc (grpcio-tools)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "schemas" / "converter_options.proto"


@pytest.fixture(scope="session")
def pb2(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The generated `converter_options_pb2` module (imported once: it registers the
    file in protobuf's default descriptor pool)."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("protoc")
    code = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", str(PROTO)])
    assert code == 0, f"protoc failed on {PROTO}"
    spec = importlib.util.spec_from_file_location("converter_options_pb2", out / "converter_options_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
