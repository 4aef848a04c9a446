"""`schemas/converter_options.proto` compiled at test time with protoc (grpcio-tools)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.cli import REPO

PROTO = REPO / "schemas" / "converter_options.proto"


PROTO_V2 = REPO / "schemas" / "converter_options_v2.proto"


def compiled(proto: Path, out: Path) -> ModuleType:
    """`proto` compiled by protoc into `out` and imported (once per session: the module
    registers the file in protobuf's default descriptor pool)."""
    # In a subprocess: grpc_tools' compiler segfaults in a process that has loaded
    # TensorFlow (two copies of the C++ protobuf library).
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}", f"--python_out={out}", str(proto)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    name = f"{proto.stem}_pb2"
    spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pb2(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The generated `converter_options_pb2` module."""
    return compiled(PROTO, tmp_path_factory.mktemp("protoc"))


@pytest.fixture(scope="session")
def pb2_v2(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The generated `converter_options_v2_pb2` module (ConverterOptionsV2, restated)."""
    return compiled(PROTO_V2, tmp_path_factory.mktemp("protoc_v2"))


STATES = ("DEFAULT", "ENABLED", "DISABLED")
METHODS = {1: "NO_QUANTIZE", 2: "STATIC_RANGE", 3: "DYNAMIC_RANGE", 4: "WEIGHT_ONLY"}


def converter_from_message(msg, pb2) -> dict:
    """The canonical converter section a parsed ConverterOptions stands for."""
    bf16 = msg.bfloat16_optimization_options
    scope = pb2.BFloat16OptimizationOptions.Scope.Name(bf16.scope)
    out = {
        "tpu_functions": [{f.WhichOneof("name"): getattr(f, f.WhichOneof("name"))} for f in msg.tpu_functions],
        "batch_options": [_batch(b) for b in msg.batch_options],
        "io_shape_optimization": STATES[msg.io_shape_optimization],
        "bfloat16_optimization": STATES[msg.bfloat16_optimization],
        "disable_default_optimizations": msg.disable_default_optimizations,
        "bfloat16_optimization_options": {
            "scope": "TPU" if scope == "DEFAULT" else scope,
            "skip_safety_checks": bf16.skip_safety_checks,
            "filterlist": list(bf16.filterlist),
        },
    }
    if msg.HasField("xla_sharding_options"):
        xla = msg.xla_sharding_options
        out["xla_sharding_options"] = {
            "num_cores_per_replica": xla.num_cores_per_replica,
            "device_assignment": list(xla.device_assignment),
        }
        if xla.topology:
            topology = pb2.TopologyProto.FromString(xla.topology)
            out["xla_sharding_options"]["topology"] = {
                "mesh_shape": list(topology.mesh_shape),
                "device_coordinates": list(topology.device_coordinates),
            }
    if msg.external_feature_configs.HasField("quantization_options"):
        quant = msg.external_feature_configs.quantization_options
        out["quantization_options"] = {
            "method": METHODS[quant.quantization_method.preset_method],
            "op_set": pb2.OpSet.Name(quant.op_set),
            "tags": list(quant.tags),
            "signature_keys": list(quant.signature_keys),
            "representative_datasets": {
                key: {"tfrecord_file_path": value.tfrecord_file_path}
                for key, value in quant.representative_datasets.items()
            },
        }
        if quant.unit_wise_quantization_specs:
            out["quantization_options"]["unit_wise_quantization_specs"] = [
                {"unit": [{field.name: value for field, value in unit.ListFields()} for unit in spec.unit],
                 "method": METHODS[spec.quantization_method.preset_method]}
                for spec in quant.unit_wise_quantization_specs
            ]
    return out


def _batch(b) -> dict:
    out = {
        "num_batch_threads": b.num_batch_threads,
        "max_batch_size": b.max_batch_size,
        "batch_timeout_micros": b.batch_timeout_micros,
        "allowed_batch_sizes": list(b.allowed_batch_sizes),
        "max_enqueued_batches": b.max_enqueued_batches,
        "disable_large_batch_splitting": b.disable_large_batch_splitting,
    }
    if b.HasField("experimental"):
        kind = b.experimental.WhichOneof("batch_component")
        out["experimental"] = {kind: getattr(b.experimental, kind)}
    return out


@pytest.fixture(scope="session")
def from_message(pb2):
    """`from_message(msg)`: the canonical converter section a parsed ConverterOptions stands for."""
    return lambda msg: converter_from_message(msg, pb2)
