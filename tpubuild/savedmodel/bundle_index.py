"""The size of each tensor of a checkpoint, read from its `variables.index` without
TensorFlow: what a memory estimate needs of a stage that streams the checkpoint tensor by
tensor (stages/base.py STREAMS_CHECKPOINT: its peak is about the largest tensor).

The index is a tensor bundle's table (tensorflow/core/util/tensor_bundle/tensor_bundle.cc,
BundleWriter::Finish writes it with tensorflow/core/lib/io/table_builder.cc, LevelDB's
format: tensorflow/core/lib/io/format.cc, block_builder.cc). Its last 48 bytes are the
footer: the metaindex and index BlockHandles (varint64 offset and size each), padding,
and the magic number 0xdb4775248b80fb57. The index block's values are the BlockHandles of
the data blocks; each block is a run of entries (varint32 shared key bytes, unshared key
bytes, value length; the key's unshared bytes; the value), then its restart offsets
(uint32 each) and their count (uint32), then on disk a compression byte and a CRC (5
bytes). A data block's key is a tensor's name ("" is the bundle's header) and its value a
BundleEntryProto (tensorflow/core/protobuf/tensor_bundle.proto), whose field 5 is `size`:
the tensor's bytes in the data file. Anything else (a compressed block, another layout)
is None: the caller falls back to a bound it knows.
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = 0xDB4775248B80FB57
FOOTER = 48
TRAILER = 5  # compression type byte + crc32c, after each block
SIZE_FIELD = 5  # BundleEntryProto.size (int64, varint)
# An index larger than this is not read for an estimate (a table of millions of tensors).
MAX_INDEX_BYTES = 64 * 2**20


class _Bad(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Bad
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _block(data: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of the uncompressed block at `offset`."""
    if offset < 0 or offset + size + TRAILER > len(data) or size < 4:
        raise _Bad
    if data[offset + size] != 0:  # kNoCompression; a Snappy block is not decoded here
        raise _Bad
    block = data[offset:offset + size]
    (restarts,) = struct.unpack_from("<I", block, size - 4)
    end = size - 4 - 4 * restarts
    if end < 0:
        raise _Bad
    entries, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise _Bad
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + length]))
        pos += length
    return entries


def _entry_size(value: bytes) -> int:
    """BundleEntryProto.size of a serialized entry (0 when absent)."""
    pos = 0
    while pos < len(value):
        tag, pos = _varint(value, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            number, pos = _varint(value, pos)
            if field == SIZE_FIELD:
                return number
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, pos = _varint(value, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise _Bad
    return 0


def tensor_sizes(index: Path) -> dict[str, int] | None:
    """Each tensor's bytes in the data files, by name, from the bundle index at `index`;
    None when it cannot be read as one (missing, too large, compressed, malformed)."""
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            return None
        data = index.read_bytes()
        if len(data) < FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != MAGIC:
            return None
        pos = len(data) - FOOTER
        _meta_offset, pos = _varint(data, pos)
        _meta_size, pos = _varint(data, pos)
        index_offset, pos = _varint(data, pos)
        index_size, _ = _varint(data, pos)
        sizes: dict[str, int] = {}
        for _, handle in _block(data, index_offset, index_size):
            offset, at = _varint(handle, 0)
            size, _ = _varint(handle, at)
            for key, value in _block(data, offset, size):
                if key:  # "" is the header (BundleHeaderProto)
                    sizes[key.decode("utf-8", "replace")] = _entry_size(value)
        return sizes
    except (OSError, _Bad, struct.error):
        return None


def largest_tensor_bytes(saved_model_dir: Path) -> int | None:
    """The largest tensor of a SavedModel's checkpoint in bytes, None when not known."""
    sizes = tensor_sizes(saved_model_dir / "variables" / "variables.index")
    return max(sizes.values(), default=0) if sizes is not None else None
