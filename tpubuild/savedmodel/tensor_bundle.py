"""TensorFlow's checkpoint format (tensor_bundle), read and written one tensor at a time.

A checkpoint `<prefix>` is `<prefix>.index`, a LevelDB-style sorted table of
key -> serialized proto (key "" holds the BundleHeaderProto, every other key a
BundleEntryProto: dtype, shape, shard_id, offset, size, masked crc32c), and the data files
`<prefix>.data-<shard>-of-<num_shards>` holding the tensors' bytes
(tensorflow/core/protobuf/tensor_bundle.proto). TensorFlow's own reader and writer
(`tf.train.load_checkpoint`, `SaveV2`) hold whole tensors, and `SaveV2` every tensor it
writes at once; here a tensor's bytes go from one file to the other in chunks, so a rewrite
of the checkpoint needs memory for a chunk, not for the model.

What is imitated, from TensorFlow's sources:
- the table: tensorflow/core/lib/io/table_builder.cc (data blocks flushed at
  `block_size`, the index block's separators FindShortestSeparator / FindShortSuccessor,
  an empty metaindex block, the footer), block_builder.cc (shared-prefix keys, a restart
  point every 16 keys, the restart array), format.cc (block handles as two varint64, the
  block trailer: type byte and masked crc32c of contents + type; the 48-byte footer ending
  in the magic number), table_options.h (block_size 262144, restart interval 16; the bundle
  writes without compression);
- the bundle: tensorflow/core/util/tensor_bundle/tensor_bundle.cc (BundleWriter::Add
  writes a tensor's bytes at the shard's running size, data_alignment 1 so no padding,
  WriteStringTensor's layout and checksum; BundleWriter::Finish / MergeBundles write the
  header, then every entry in key order; DataFilename's `%05d`);
- the checksum: tensorflow/core/lib/hash/crc32c.h (Mask / Unmask).

For the same tensors in the same order, `Writer` writes the bytes `SaveV2` writes
(tests/savedmodel/test_tensor_bundle.py compares them). Not supported, raising
`Unsupported` (callers fall back to TensorFlow's reader and SaveV2): variant tensors, a
big-endian bundle, a compressed index block.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

# google-crc32c: the C implementation of CRC-32C (a pyproject dependency for this module;
# TensorFlow exposes none to Python). Every tensor's bytes are checksummed as they pass.
import google_crc32c
from tensorflow.core.framework import versions_pb2
from tensorflow.core.protobuf import tensor_bundle_pb2

from tpubuild.errors import ConversionError

if TYPE_CHECKING:
    import threading

# tensorflow/core/framework/types.proto
DT_STRING = 7
DT_VARIANT = 21

# Bytes of a tensor read, cast and written at a time (BundleWriter's write buffer is 8 MiB
# too); a multiple of every element size. benchmarks/bfloat16_checkpoint.py: chunks of 4, 8,
# 16 and 32 MiB cost the bfloat16 stage +30, +55, +105 and +170 MiB of RSS, at one speed.
CHUNK = 8 << 20
BLOCK_SIZE = 262144  # table_options.h
RESTART_INTERVAL = 16  # table_options.h; the index block restarts at every key (table_builder.cc)
BLOCK_TRAILER = 5  # format.h kBlockTrailerSize: type byte + fixed32 crc
FOOTER = 48  # format.h Footer::kEncodedLength: 2 * BlockHandle::kMaxEncodedLength + 8
MAGIC = 0xDB4775248B80FB57  # format.h kTableMagicNumber
HEADER_KEY = b""
VERSION = 1  # tensor_bundle.cc kTensorBundleVersion (producer); min_consumer 0


class Unsupported(Exception):
    """A checkpoint this module does not read or write; use TensorFlow's reader and SaveV2."""


class DataLoss(ConversionError):
    """A checkpoint whose bytes do not match its checksums or its format: the model's fault,
    one line naming the file (a stage error, never a traceback)."""


# crc32c.h: a stored crc is masked, since a crc of bytes holding crcs is weak.
_MASK_DELTA = 0xA282EAD8


def mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def crc32c(data: Any, crc: int = 0) -> int:
    """Of bytes or a numpy array (google_crc32c refuses a memoryview)."""
    return int(google_crc32c.extend(crc, data))


def data_path(prefix: Path, shard: int, num_shards: int) -> Path:
    """tensor_bundle.cc DataFilename."""
    return prefix.with_name(f"{prefix.name}.data-{shard:05d}-of-{num_shards:05d}")


def index_path(prefix: Path) -> Path:
    return prefix.with_name(f"{prefix.name}.index")


# coding.cc: varints, little-endian fixed-width integers.
def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DataLoss("checkpoint index: a truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


# ---------------------------------------------------------------------------------------
# Reading


def _read_block(index: bytes, offset: int, size: int) -> bytes:
    """format.cc ReadBlock: contents, after checking the trailer's type and crc."""
    if offset + size + BLOCK_TRAILER > len(index):
        raise DataLoss("checkpoint index: a block past the end of the file")
    contents = index[offset:offset + size]
    kind = index[offset + size]
    (stored,) = struct.unpack_from("<I", index, offset + size + 1)
    if unmask(stored) != crc32c(index[offset:offset + size + 1]):
        raise DataLoss("checkpoint index: block checksum mismatch")
    if kind != 0:
        raise Unsupported("checkpoint index: a compressed block")
    return contents


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """block.cc Block::Iter, in order: (key, value)."""
    if len(block) < 4:
        raise DataLoss("checkpoint index: a block too short for its restart array")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise DataLoss("checkpoint index: a bad restart array")
    pos, key = 0, b""
    while pos < end:
        shared, pos = _get_varint(block, pos)
        non_shared, pos = _get_varint(block, pos)
        value_size, pos = _get_varint(block, pos)
        if shared > len(key) or pos + non_shared + value_size > end:
            raise DataLoss("checkpoint index: a bad block entry")
        key = key[:shared] + block[pos:pos + non_shared]
        pos += non_shared
        yield key, block[pos:pos + value_size]
        pos += value_size


def _table_entries(index: bytes) -> Iterator[tuple[bytes, bytes]]:
    """table.cc: the footer's index handle, the index block's data blocks, their entries."""
    if len(index) < FOOTER:
        raise DataLoss("checkpoint index: shorter than a table footer")
    footer = index[-FOOTER:]
    lo, hi = struct.unpack_from("<II", footer, FOOTER - 8)
    if (hi << 32) | lo != MAGIC:
        raise DataLoss("checkpoint index: not an sstable (bad magic number)")
    pos = 0
    for _ in range(2):  # the metaindex handle (an empty block, unused), then the index handle
        offset, pos = _get_varint(footer, pos)
        size, pos = _get_varint(footer, pos)
    for _, handle in _block_entries(_read_block(index, offset, size)):
        block_offset, at = _get_varint(handle, 0)
        block_size, _ = _get_varint(handle, at)
        yield from _block_entries(_read_block(index, block_offset, block_size))


@dataclass
class Reader:
    """A checkpoint's index, parsed: the header and every entry by key (bytes, in order)."""

    prefix: Path
    header: tensor_bundle_pb2.BundleHeaderProto
    entries: dict[bytes, tensor_bundle_pb2.BundleEntryProto]
    _files: dict[int, BinaryIO] = field(default_factory=dict)

    @classmethod
    def open(cls, prefix: Path) -> Reader:
        prefix = Path(prefix)
        header = None
        entries: dict[bytes, tensor_bundle_pb2.BundleEntryProto] = {}
        from google.protobuf.message import DecodeError

        try:
            for key, value in _table_entries(index_path(prefix).read_bytes()):
                if key == HEADER_KEY:
                    header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
                else:
                    entries[key] = tensor_bundle_pb2.BundleEntryProto.FromString(value)
        except DataLoss as exc:
            raise DataLoss(f"{index_path(prefix)}: {exc}") from None
        except DecodeError:
            raise DataLoss(f"{index_path(prefix)}: an entry is not a BundleEntryProto") from None
        if header is None:
            raise DataLoss(f"{index_path(prefix)}: no header entry")
        if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
            raise Unsupported(f"{index_path(prefix)}: a big-endian checkpoint")
        for key, entry in entries.items():
            if entry.dtype == DT_VARIANT:
                raise Unsupported(f"{index_path(prefix)}: {key!r} is a variant tensor")
            if not entry.slices and not 0 <= entry.shard_id < header.num_shards:
                raise DataLoss(f"{index_path(prefix)}: {key!r} names shard {entry.shard_id} of {header.num_shards}")
        return cls(prefix, header, entries)

    def data_file(self, shard: int) -> Path:
        return data_path(self.prefix, shard, self.header.num_shards)

    def in_file_order(self) -> list[bytes]:
        """Keys of the entries that hold bytes, by shard then offset (the order written)."""
        held = [k for k, e in self.entries.items() if not e.slices]
        return sorted(held, key=lambda k: (self.entries[k].shard_id, self.entries[k].offset))

    def _file(self, shard: int) -> BinaryIO:
        if shard not in self._files:
            self._files[shard] = open(self.data_file(shard), "rb")
        return self._files[shard]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def chunks(self, key: bytes, chunk: int | None = None) -> Iterator[bytes]:
        """A non-string tensor's bytes, `chunk` at a time; its crc is checked after the last
        (a consumer has the bytes before they are known good: it raises then, and the
        checkpoint being written is abandoned)."""
        entry = self.entries[key]
        if entry.dtype == DT_STRING:
            raise ValueError("chunks: a string tensor's crc is not that of its bytes; use strings()")
        f = self._file(entry.shard_id)
        f.seek(entry.offset)
        left, crc, chunk = entry.size, 0, chunk or CHUNK
        while left:
            piece = f.read(min(chunk, left))
            if not piece:
                raise DataLoss(f"{self.data_file(entry.shard_id)}: ends inside {key!r}")
            crc = crc32c(piece, crc)
            left -= len(piece)
            yield piece
        if mask(crc) != entry.crc32c:
            raise DataLoss(f"{self.data_file(entry.shard_id)}: {key!r} does not match its checksum")

    def views(self, key: bytes, buffer: Any) -> Iterator[Any]:
        """As `chunks`, each piece read into `buffer` (a uint8 numpy array, reused; its length
        a whole number of elements, as CHUNK is; numpy, since google_crc32c takes no
        memoryview of a bytearray) instead of a new bytes object: new memory is first-touched
        pages, and on the 2-core VM of issue 54 a page fault costs ~1 s per GiB (2 GiB of
        fresh 4 KiB pages: 1.6-2.2 s; bfloat16's rewrite of a 2 GiB model spent 5.5 of 10.9 s
        in read()). A view is valid until the next is read; the crc is checked after the last."""
        entry = self.entries[key]
        if entry.dtype == DT_STRING:
            raise ValueError("views: a string tensor's crc is not that of its bytes; use strings()")
        fd = self._file(entry.shard_id).fileno()  # read with pread: the file object's position is not used
        whole = buffer
        left, crc, offset = entry.size, 0, entry.offset
        while left:
            want, got = min(len(whole), left), 0
            while got < want:
                n = os.preadv(fd, [whole[got:want]], offset + got)
                if n == 0:
                    raise DataLoss(f"{self.data_file(entry.shard_id)}: ends inside {key!r}")
                got += n
            piece = whole[:want]
            crc = crc32c(piece, crc)
            offset, left = offset + want, left - want
            yield piece
        if mask(crc) != entry.crc32c:
            raise DataLoss(f"{self.data_file(entry.shard_id)}: {key!r} does not match its checksum")

    def strings(self, key: bytes) -> list[bytes]:
        """A string tensor's elements (tensor_bundle.cc ReadStringTensor), checked: read
        whole (string tensors are the object graph and vocabularies, not weights)."""
        entry = self.entries[key]
        f = self._file(entry.shard_id)
        f.seek(entry.offset)
        raw = f.read(entry.size)
        if len(raw) != entry.size:
            raise DataLoss(f"{self.data_file(entry.shard_id)}: ends inside {key!r}")
        if entry.size == 0:
            return []  # ReadStringTensor reads nothing for size 0
        pos, lengths = 0, []
        for _ in range(_num_elements(entry)):
            length, pos = _get_varint(raw, pos)
            lengths.append(length)
        elements, at = [], pos + 4
        for length in lengths:
            elements.append(raw[at:at + length])
            at += length
        again, crc = string_bytes(elements)
        if again != raw or mask(crc) != entry.crc32c:
            raise DataLoss(f"{self.data_file(entry.shard_id)}: {key!r} does not match its checksum")
        return elements


def _num_elements(entry: tensor_bundle_pb2.BundleEntryProto) -> int:
    n = 1
    for dim in entry.shape.dim:
        n *= dim.size
    return n


def string_bytes(elements: list[bytes]) -> tuple[bytes, int]:
    """A string tensor's bytes and (unmasked) crc: tensor_bundle.cc WriteStringTensor. The
    varint64 lengths, a fixed32 masked crc of the lengths (each as uint32, or uint64 past
    UINT32_MAX), the elements; the crc covers lengths (as above), length crc, elements."""
    out, crc = bytearray(), 0
    for element in elements:
        _put_varint(out, len(element))
        crc = crc32c(struct.pack("<I" if len(element) <= 0xFFFFFFFF else "<Q", len(element)), crc)
    length_crc = struct.pack("<I", mask(crc))
    out += length_crc
    crc = crc32c(length_crc, crc)
    for element in elements:
        out += element
        crc = crc32c(element, crc)
    return bytes(out), crc


# ---------------------------------------------------------------------------------------
# Writing


class _Block:
    """block_builder.cc BlockBuilder."""

    def __init__(self, restart_interval: int):
        self.interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    def empty(self) -> bool:
        return not self.buffer

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.interval:
            limit = min(len(key), len(self.last_key))
            while shared < limit and key[shared] == self.last_key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buffer))
            self.counter = 0
        for n in (shared, len(key) - shared, len(value)):
            _put_varint(self.buffer, n)
        self.buffer += key[shared:]
        self.buffer += value
        self.last_key = key
        self.counter += 1

    def finish(self) -> bytes:
        for restart in self.restarts:
            self.buffer += struct.pack("<I", restart)
        self.buffer += struct.pack("<I", len(self.restarts))
        return bytes(self.buffer)


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """table_builder.cc FindShortestSeparator."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes([start[i] + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    """table_builder.cc FindShortSuccessor."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def _handle(offset: int, size: int) -> bytes:
    out = bytearray()
    _put_varint(out, offset)
    _put_varint(out, size)
    return bytes(out)


def table_bytes(entries: Iterable[tuple[bytes, bytes]]) -> bytes:
    """table_builder.cc TableBuilder: the index file for keys in increasing order."""
    out = bytearray()
    data, index = _Block(RESTART_INTERVAL), _Block(1)
    pending: bytes | None = None  # the handle of the last flushed block, its index entry not yet written
    last_key = b""
    count = 0

    def write_block(block: _Block) -> bytes:
        contents = block.finish()
        handle = _handle(len(out), len(contents))
        out.extend(contents)
        trailer = b"\x00"  # kNoCompression
        out.extend(trailer + struct.pack("<I", mask(crc32c(trailer, crc32c(contents)))))
        block.reset()
        return handle

    for key, value in entries:
        if count and len(key) + len(value) >= 2 * BLOCK_SIZE and not data.empty():
            pending = write_block(data)  # kOverlyLargeBlockRatio
        if pending is not None:
            index.add(_shortest_separator(last_key, key), pending)
            pending = None
        last_key = key
        count += 1
        data.add(key, value)
        if data.size_estimate() >= BLOCK_SIZE:
            pending = write_block(data)
    if not data.empty():
        pending = write_block(data)
    metaindex = write_block(_Block(RESTART_INTERVAL))
    if pending is not None:
        index.add(_short_successor(last_key), pending)
    index_handle = write_block(index)
    footer = (metaindex + index_handle).ljust(FOOTER - 8, b"\x00")
    out.extend(footer + struct.pack("<II", MAGIC & 0xFFFFFFFF, MAGIC >> 32))
    return bytes(out)


# How many pieces Writer.add holds, not yet written, while its caller makes the next: a
# caller that reuses buffers needs WRITE_AHEAD + 2 of them (checkpoint.py's cast buffers).
WRITE_AHEAD = 1


class _Writes:
    """A thread writing one tensor's pieces to its shard file, and their crc32c, in order,
    while the caller reads and casts the next: write() into the page cache was most of
    bfloat16's rewrite (issue 54: 2 GiB of float32 in 4.8 s, 2.8 s of it in write()), and
    its system call runs beside the cast (it releases the GIL). The thread starts at a
    tensor's second piece: a tensor of one piece (most of a model's, CHUNK or smaller) is
    written inline at close, where a thread would only cost its start."""

    def __init__(self, file: BinaryIO):
        import queue

        self.file = file
        self.crc = 0
        self.size = 0
        self.failed: BaseException | None = None
        self.first: Any = None  # the first piece, held until a second one starts the thread
        self.thread: threading.Thread | None = None
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=WRITE_AHEAD)

    def _write(self, piece: Any) -> None:
        self.file.write(piece)
        self.crc = crc32c(piece, self.crc)
        self.size += len(piece)

    def _run(self) -> None:
        while (piece := self.queue.get()) is not None:
            if self.failed is not None:
                continue  # taken and dropped: the caller learns at its next put or at close
            try:
                self._write(piece)
            except BaseException as exc:
                self.failed = exc

    def put(self, piece: Any) -> None:
        if self.failed is not None:
            raise self.failed
        if self.thread is None:
            if self.first is None:
                self.first = piece
                return
            import threading

            # The caller's buffers: the first piece is still held unwritten while the second
            # is taken, as a queued piece is once the thread runs (WRITE_AHEAD + 1 pieces).
            self.thread = threading.Thread(target=self._run, name="tpubuild-bundle-writer", daemon=True)
            self.thread.start()
            self.queue.put(self.first)
            self.first = None
        self.queue.put(piece)

    def stop(self) -> None:
        self.first = None
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()

    def close(self) -> tuple[int, int]:
        """(crc32c, bytes) of what was written, once every piece is; the writing error if
        there was one."""
        if self.thread is None and self.first is not None:
            first, self.first = self.first, None
            self._write(first)  # one piece: written here, an error raised as it is
        self.stop()
        if self.failed is not None:
            raise self.failed
        return self.crc, self.size


@dataclass
class _Shard:
    path: Path
    tmp: Path
    file: BinaryIO
    size: int = 0


@dataclass
class Writer:
    """A new checkpoint at `prefix` with `num_shards` data files, written beside the files
    it replaces: each data file under a temporary name, fsynced; `finish` renames the data
    files into place, then writes the index (atomic.write_atomic), then removes data files
    of `prefix` the new index does not name (another shard count's). Renaming, never
    writing in place: a hard link at the old name (to the cache, to the source) is
    replaced, never written through. `abort` (or an exception inside `with`) removes the
    temporary files and leaves the old checkpoint as it was."""

    prefix: Path
    num_shards: int = 1
    version: versions_pb2.VersionDef | None = None  # the header's; kTensorBundleVersion's when None
    entries: dict[bytes, tensor_bundle_pb2.BundleEntryProto] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prefix = Path(self.prefix)
        self._shards: dict[int, _Shard] = {}

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.abort()
            return
        try:
            self.finish()
        except BaseException:
            self.abort()  # a full disk while fsyncing: no temporary file left behind
            raise

    def _shard(self, shard: int) -> _Shard:
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"shard {shard} of {self.num_shards}")
        if shard not in self._shards:
            path = data_path(self.prefix, shard, self.num_shards)
            tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            self._shards[shard] = _Shard(path, tmp, os.fdopen(fd, "wb"))
        return self._shards[shard]

    def _new_entry(self, key: bytes) -> tensor_bundle_pb2.BundleEntryProto:
        if key == HEADER_KEY or key in self.entries:
            raise ValueError(f"checkpoint key {key!r}: empty or added twice")
        entry = self.entries[key] = tensor_bundle_pb2.BundleEntryProto()
        return entry

    def _placed_entry(self, key: bytes, dtype: int, shape: Iterable[int],
                      shard: int) -> tuple[_Shard, tensor_bundle_pb2.BundleEntryProto]:
        """(the shard, a new entry of `key` starting at its end): what add and add_strings share."""
        out = self._shard(shard)
        entry = self._new_entry(key)
        entry.dtype = dtype  # type: ignore[assignment]
        entry.shape.SetInParent()  # a scalar's shape is present and empty, as TensorShape::AsProto writes it
        for size in shape:
            entry.shape.dim.add(size=size)
        entry.shard_id = shard
        entry.offset = out.size
        return out, entry

    def add(self, key: bytes, dtype: int, shape: Iterable[int], chunks: Iterable[bytes], shard: int = 0) -> None:
        """A non-string tensor whose bytes come in `chunks` (BundleWriter::Add). Each piece is
        written by a thread while `chunks` makes the next (_Writes): a piece's memory must
        stay as it is until WRITE_AHEAD + 1 later pieces have been taken."""
        if dtype in (DT_STRING, DT_VARIANT):
            raise ValueError("add: a string or variant tensor; use add_strings")
        out, entry = self._placed_entry(key, dtype, shape, shard)
        writes = _Writes(out.file)
        try:
            for piece in chunks:
                writes.put(piece)
        except BaseException:
            writes.stop()  # the thread ends before the caller's error goes on (the checkpoint is abandoned)
            raise
        crc, size = writes.close()  # every piece written, or the writing error raised
        out.size += size
        entry.size = out.size - entry.offset
        entry.crc32c = mask(crc)

    def add_strings(self, key: bytes, shape: Iterable[int], elements: list[bytes], shard: int = 0) -> None:
        """A string tensor (BundleWriter::Add, WriteStringTensor)."""
        out, entry = self._placed_entry(key, DT_STRING, shape, shard)
        data, crc = string_bytes(elements)  # no element: the length crc alone, 4 bytes, as TF writes it
        out.file.write(data)
        out.size += len(data)
        entry.size = len(data)
        entry.crc32c = mask(crc)

    def add_raw(self, key: bytes, entry: tensor_bundle_pb2.BundleEntryProto, data: Iterable[bytes],
                shard: int = 0) -> None:
        """A tensor copied as its bytes with its entry (dtype, shape, crc kept; the caller
        checked the crc as it read them, or reads strings whole and checked them)."""
        out = self._shard(shard)
        new = self._new_entry(key)
        new.CopyFrom(entry)
        new.shard_id = shard
        new.offset = out.size
        for piece in data:
            out.file.write(piece)
            out.size += len(piece)
        if out.size - new.offset != entry.size:
            raise DataLoss(f"checkpoint: {key!r} copied {out.size - new.offset} bytes of {entry.size}")

    def add_metadata(self, key: bytes, entry: tensor_bundle_pb2.BundleEntryProto) -> None:
        """An entry without bytes: a sliced tensor's full entry (dtype, shape, slices)."""
        self._new_entry(key).CopyFrom(entry)

    def index_bytes(self) -> bytes:
        header = tensor_bundle_pb2.BundleHeaderProto(num_shards=self.num_shards)
        if self.version is not None:
            header.version.CopyFrom(self.version)
        else:
            header.version.producer = VERSION
        rows = [(HEADER_KEY, header.SerializeToString(deterministic=True))]
        rows += [(k, self.entries[k].SerializeToString(deterministic=True)) for k in sorted(self.entries)]
        return table_bytes(rows)

    def finish(self) -> None:
        from tpubuild.atomic import fsync_path, write_atomic

        index = self.index_bytes()
        for shard in range(self.num_shards):
            self._shard(shard)  # a shard nothing was added to is an empty file, as SaveV2 leaves it
        for out in self._shards.values():
            out.file.flush()
            os.fsync(out.file.fileno())
            out.file.close()
        for out in self._shards.values():
            os.replace(out.tmp, out.path)
        write_atomic(index_path(self.prefix), index)  # fsyncs the directory after its rename
        kept = {out.path.name for out in self._shards.values()}
        stem = f"{self.prefix.name}.data-"
        for stale in self.prefix.parent.iterdir():
            if stale.name.startswith(stem) and stale.name not in kept:
                stale.unlink()
        fsync_path(self.prefix.parent)

    def abort(self) -> None:
        for out in self._shards.values():
            out.file.close()
            out.tmp.unlink(missing_ok=True)
        self._shards.clear()
