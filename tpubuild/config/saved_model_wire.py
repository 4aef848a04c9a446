"""The tag sets and function aliases of a SavedModel, read from saved_model.pb without
TensorFlow (whose proto modules import all of it): a few fields of the protobuf wire format.

Field numbers from tensorflow/core/protobuf/saved_model.proto (SavedModel.meta_graphs = 2)
and meta_graph.proto (MetaGraphDef.meta_info_def = 1; MetaInfoDef.tags = 4,
MetaInfoDef.function_aliases = 8, a map<string, string> from a concrete function's name to
its alias; MetaGraphDef.signature_def = 5, a map<string, SignatureDef> by signature key;
a map's entries are messages of key = 1, value = 2). Only meta_info_def and the signature
keys are read: the graph and the function library (most of the file) are skipped with seeks.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_META_GRAPHS, _META_INFO_DEF, _TAGS, _FUNCTION_ALIASES, _SIGNATURE_DEF = 2, 1, 4, 8, 5
_MAX_META_INFO = 64 << 20  # a MetaInfoDef holds a stripped op list: far below this
_MAX_KEY = 1 << 20  # a signature key is a short string
# The signature key TF2 gives a SavedModel's initializer (tensorflow/python/saved_model/
# constants.py INIT_OP_SIGNATURE_KEY; savedmodel/model.py's INIT_OP_KEY, which imports
# TensorFlow): in signature_def, but no signature a recipe names.
_INIT_OP_SIGNATURE_KEY = "__saved_model_init_op"


class WireError(ValueError):
    """Not a SavedModel proto this reader understands (the build reads it with TensorFlow)."""


@dataclass
class MetaGraphNames:
    """What a recipe can name in one MetaGraphDef."""

    tags: list[str]
    aliases: dict[str, str]  # concrete function name -> alias
    signatures: list[str]  # signature keys, in file order (not TF's initializer's)


def meta_graph_aliases(saved_model_pb: Path) -> list[tuple[list[str], dict[str, str]]]:
    """(tags, {concrete function name: alias}) of each MetaGraphDef, in file order."""
    return [(graph.tags, graph.aliases) for graph in meta_graphs(saved_model_pb)]


def meta_graphs(saved_model_pb: Path) -> list[MetaGraphNames]:
    """The tags, function aliases and signature keys of each MetaGraphDef, in file order."""
    found = []
    with open(saved_model_pb, "rb") as stream:
        end = stream.seek(0, io.SEEK_END)
        stream.seek(0)
        for field, start, size in _fields(stream, end):
            if field == _META_GRAPHS:
                found.append(_meta_graph(stream, start, size))
    return found


def _meta_graph(stream: BinaryIO, start: int, size: int) -> MetaGraphNames:
    names = MetaGraphNames([], {}, [])
    for field, field_start, field_size in _fields(stream, start + size, at=start):
        if field == _META_INFO_DEF:
            if field_size > _MAX_META_INFO:
                raise WireError("meta_info_def too large")
            stream.seek(field_start)
            names.tags, names.aliases = _meta_info(stream.read(field_size))
        elif field == _SIGNATURE_DEF:  # a map entry: the key (1) is all that is read
            for entry_field, key_start, key_size in _fields(stream, field_start + field_size, at=field_start):
                if entry_field == 1:
                    if key_size > _MAX_KEY:
                        raise WireError("signature key too large")
                    stream.seek(key_start)
                    key = stream.read(key_size).decode("utf-8")
                    if key != _INIT_OP_SIGNATURE_KEY:
                        names.signatures.append(key)
    return names


def _meta_info(data: bytes) -> tuple[list[str], dict[str, str]]:
    stream = io.BytesIO(data)
    tags, aliases = [], {}
    for field, start, size in _fields(stream, len(data)):
        if field == _TAGS:
            tags.append(data[start:start + size].decode("utf-8"))
        elif field == _FUNCTION_ALIASES:
            entry = {f: data[s:s + n].decode("utf-8") for f, s, n in _fields(io.BytesIO(data), start + size, at=start)}
            aliases[entry.get(1, "")] = entry.get(2, "")
    return tags, aliases


def _fields(stream: BinaryIO, end: int, at: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(field number, start, size) of each length-delimited field up to `end`; other wire
    types are skipped. The stream is positioned after each field before the next is read."""
    position = stream.tell() if at is None else at
    while position < end:
        stream.seek(position)
        key = _varint(stream)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            _varint(stream)
            position = stream.tell()
            continue
        if wire == _LEN:
            size = _varint(stream)
            start = stream.tell()
            position = start + size
            if position > end:
                raise WireError("a field runs past its message")
            yield field, start, size
            continue
        if wire not in (_I64, _I32):
            raise WireError(f"wire type {wire}")
        position = stream.tell() + (8 if wire == _I64 else 4)
    if position != end:
        raise WireError("a field runs past its message")


def _varint(stream: BinaryIO) -> int:
    result = shift = 0
    while shift < 70:
        byte = stream.read(1)
        if not byte:
            raise WireError("truncated")
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
    raise WireError("varint too long")
