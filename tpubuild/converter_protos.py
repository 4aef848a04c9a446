"""The converter's option messages as protobuf classes, without TensorFlow.

schemas/converter_options.proto (the guide's ConverterOptions) and
schemas/converter_options_v2.proto (today's ConverterOptionsV2) compiled by protoc into
one FileDescriptorSet, schemas/converter_options.binpb, committed beside them
(tests/render/test_render_v2.py checks that it is what protoc makes of them
now). A descriptor set, not generated _pb2 modules: those refuse a protobuf runtime
older than the protoc that wrote them, a descriptor set loads in any.

The classes live in a pool of their own, not protobuf's default pool, so they never
meet the messages TensorFlow registers in the same process.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

DESCRIPTOR_SET = Path(__file__).resolve().parent / "schemas" / "converter_options.binpb"

# Dialect -> full name of its top-level message.
GUIDE = "ConverterOptions"
V2 = "ConverterOptionsV2"
MESSAGES = {GUIDE: "tpubuild.converter.ConverterOptions", V2: "tpubuild.converter.v2.ConverterOptionsV2"}
TOPOLOGY = "tpubuild.converter.TopologyProto"
# What our restatements add to Google's names, left out of messages shown to users.
PACKAGE_PREFIXES = ("tpubuild.converter.v2.", "tpubuild.converter.")


@cache
def _pool() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


@cache
def message_class(full_name: str) -> Any:
    """The message class of `full_name` (one of MESSAGES' values, or TOPOLOGY)."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def short_names(text: str) -> str:
    """`text` with our packages' prefixes removed: Google's message names."""
    for prefix in PACKAGE_PREFIXES:
        text = text.replace(prefix, "")
    return text
