"""A shared remote cache on an fsspec URL (`s3://bucket/prefix`, `gs://bucket/prefix`,
`file:///shared/dir`): the local store's stage records and objects, shared by every
builder that names the same URL.

Layout under `<url>/v1/` (the local store's version of its layout, store/store.py LAYOUT):
- `objects/ab/cdef...`: file contents by BLAKE3 hash. Self-verifying: every download is
  re-hashed before it enters the local store (an S3-compatible server may accept a wrong
  checksum, a disk may rot), so a wrong object is reported and never used, and an upload
  may replace an existing object whose content is wrong.
- `stages/ab/<key>.json`: the StageEntry JSON of the local store, written CREATE-ONLY
  (Nx CVE-2025-36852 "CREEP": two writers racing on a key leave exactly one record; the
  loser never overwrites it) and only after all its objects are uploaded, so no reader
  ever meets a record without its objects.
- `discovered/<declared key>/<final key>.json`: the discovered-input candidates of stages
  that run user code (the local dep file is a mutable list; a remote one would be a
  lost-update race, so here each candidate is its own create-only file).

RemoteCache speaks to the remote only: it never reads or writes the local store. What moves
records and objects between the two is remote/transfer.py (the layered cache, engine/cache.py,
and Ray's nodes call it), as Bazel's DiskAndRemoteCacheClient moves blobs between its disk
and remote caches.

Every upload is atomic under its final name (transport/backends.py): an S3 or GCS
object appears whole when its PUT (or multipart upload) completes, never in part; on a
file system the content is written to a dot-named temp file, fsynced, then renamed
(objects) or hard-linked (records, create-only: link fails if the name exists). A builder killed mid-upload leaves
at most unreferenced objects (collected by `gc --remote`), never a partial object or a
record without its objects.

Failures are said, never silent (Turborepo's lesson): each one is a line in `stats` and
reported as it happens. A server that cannot be reached, or refuses our credentials, is
reported once and the remote is disabled for the rest of the command: the build goes on
locally. So is one that answers too slowly: every call has connect, first-byte and total
deadlines (config/remote_url.py Timeouts, set in tpubuild.yaml), and no download reads
more than the size its record states (a record, more than records.RECORD_LIMIT). fsspec and the backends are imported only when a build first uses the remote,
never by planning commands.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tpubuild.config.remote_url import Timeouts
from tpubuild.digests import FileEntry, hash_file
from tpubuild.keys import (
    DIGEST,
    RECORD_LIMIT,
    StageEntry,
    canonical_dumps,
    discovered_final_key,
    parse_candidate,
    parse_entry,
    stage_key,
)
from tpubuild.store import LAYOUT
from tpubuild.transport import Backend, NotARegularFile, ObjectTooLarge, open_backend


@dataclass
class RemoteStats:
    hits: int = 0
    misses: int = 0
    uploads: int = 0  # stage records this builder created
    bytes_down: int = 0
    bytes_up: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self, url: str) -> str:
        return (f"remote cache {url}: {self.hits} hits, {self.misses} misses, {self.uploads} uploads, "
                f"{self.bytes_down / 2**20:.1f} MiB down, {self.bytes_up / 2**20:.1f} MiB up")

    def to_json(self, url: str) -> dict[str, Any]:
        return {"url": url, "hits": self.hits, "misses": self.misses, "uploads": self.uploads,
                "bytes_down": self.bytes_down, "bytes_up": self.bytes_up, "failures": list(self.failures)}


class _Off(Exception):
    """The remote (or uploading to it) was disabled earlier in this command."""


class RemoteCache:
    """One command's use of the remote cache at `url`. Thread-safe: doit's -j N threads
    and the engine's upload threads share it.

    remote/transfer.py uses `fetch_record`, `fetch_object`, `push_object`, `push_record`; the
    engine `fetch_discovered`, `note_miss`, `stats`, `enabled`, `can_push`, `url`.
    """

    def __init__(self, url: str, push: bool = True, report: Callable[[str], None] | None = None,
                 signing_key: Any = None, trusted: dict[str, Any] | None = None,
                 timeouts: Timeouts | None = None):
        self.url = url.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        self.push = push
        self.report = report or (lambda message: None)
        # digests/signing.py: this builder signs what it uploads; readers with
        # trusted keys use signed records only (keyid -> public key).
        self.signing_key = signing_key
        self.trusted = dict(trusted or {})
        self.stats = RemoteStats()
        self._lock = threading.Lock()
        self._io: Backend | None = None
        self._off: str | None = None  # why the remote is disabled for this command
        self._push_off: str | None = None  # why uploads are
        self._bad: set[str] = set()  # remote objects seen with wrong content: uploads replace them

    # --- state -------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self._off is None

    @property
    def can_push(self) -> bool:
        return self.push and self._off is None and self._push_off is None

    def connect(self) -> None:
        """Make the backend now (imports fsspec and the scheme's package): a missing
        package is a RemoteSetupError naming the extra to install."""
        with self._lock:
            if self._io is None:
                self._io = open_backend(self.url, self.timeouts, layout=LAYOUT)

    def backend(self) -> Backend:
        """The storage itself (paths relative to `<url>/v1/`), for `gc --remote`."""
        self.connect()
        assert self._io is not None
        return self._io

    def _backend(self) -> Backend:
        if self._off is not None:
            raise _Off
        if self._io is None:
            self.connect()
        assert self._io is not None
        return self._io

    def _fail(self, message: str) -> None:
        with self._lock:
            self.stats.failures.append(message)
        self.report(message)

    def _disable(self, exc: BaseException, writing: bool) -> None:
        """Report once, then stop using the remote (or, for a refused upload, stop uploading)."""
        reason = _reason(exc)
        with self._lock:
            if self._off is not None or (writing and self._push_off is not None):
                return
            if writing and isinstance(exc, (PermissionError, FileNotFoundError)):
                self._push_off = reason
                message = f"remote cache {self.url}: uploads refused: {reason}; not uploading"
            else:
                self._off = reason
                message = f"remote cache {self.url} unreachable: {reason}; building locally"
        self._fail(message)

    def _read(self, call: Callable[[Backend], Any]) -> Any:
        """A read: FileNotFoundError (absent) and ObjectTooLarge are answers; any other
        error disables."""
        io = self._backend()
        try:
            return call(io)
        except (FileNotFoundError, ObjectTooLarge):
            raise
        except Exception as exc:  # the SDKs raise their own types (botocore, aiohttp, google.auth)
            self._disable(exc, writing=False)
            raise _Off from exc

    def _write(self, call: Callable[[Backend], Any]) -> Any:
        """A write: FileExistsError is an answer (create-only lost); any other error stops uploads."""
        if not self.can_push:
            raise _Off
        io = self._backend()
        try:
            return call(io)
        except FileExistsError:
            raise
        except Exception as exc:
            self._disable(exc, writing=True)
            raise _Off from exc

    def note_miss(self) -> None:
        """Count a lookup that found nothing usable without reaching `fetch_entry` (no
        discovered candidate matched)."""
        with self._lock:
            self.stats.misses += 1

    def count(self, **deltas: int) -> None:
        """Add to the transfer counters (thread-safe); Ray builds add their nodes' transfers."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    # --- fetching ------------------------------------------------------------------------
    def fetch_record(self, key: str) -> StageEntry | None:
        """The stage record `key` as the remote holds it, parsed and checked (its objects
        not fetched: remote/transfer.py fetch_entry does that). None on a miss; a malformed
        record is reported and is a miss too, never used."""
        if not self.enabled or not DIGEST.match(key):
            return None
        try:
            raw = self._signed_record(key) if self.trusted else self._read(
                lambda io: io.read(_stage_rel(key), RECORD_LIMIT))
        except FileNotFoundError as exc:
            if isinstance(exc, NotARegularFile):  # a FIFO, a device... in a file:// remote
                self._fail(f"remote cache {self.url}: stage record {key} is {exc.kind}, not a regular file; not opened")
            self.note_miss()
            return None
        except ObjectTooLarge as exc:
            self._fail(f"remote cache {self.url}: stage record {key} is too large ({exc}); not read")
            self.note_miss()
            return None
        except _Off:
            return None
        self.count(bytes_down=len(raw))
        entry, problem = parse_entry(key, raw)
        if entry is None:
            self._fail(f"remote cache {self.url}: stage record {key} is malformed ({problem}); not used")
            self.note_miss()
            return None
        return entry

    def _signed_record(self, key: str) -> bytes:
        """The record `key` as a trusted key signed it (FileNotFoundError when none did).
        An unsigned record, or one signed otherwise, is reported once and not used: the
        stage is built here (Nx CVE-2025-36852: a writer without the key must not decide
        what trusted builds use)."""
        from tpubuild.digests import problem

        for keyid in sorted(self.trusted):
            try:
                document = json.loads(self._read(lambda io: io.read(_signed_rel(keyid, key), RECORD_LIMIT)))
                record, signature = document["record"].encode(), document["signature"].encode()
            except FileNotFoundError:
                continue
            except (ValueError, TypeError, KeyError, AttributeError, ObjectTooLarge):
                self._fail(f"remote cache {self.url}: signed record {key} (key {keyid[:12]}) is malformed; not used")
                continue
            why = problem(record, signature, {keyid: self.trusted[keyid]})
            if why is None:
                return record
            self._fail(f"remote cache {self.url}: stage record {key}: {why}; not used")
        try:
            self._read(lambda io: io.size(_stage_rel(key)))
        except FileNotFoundError:
            raise
        self._fail(f"remote cache {self.url}: stage record {key} is not signed by a trusted key; not used")
        raise FileNotFoundError(key)

    def _push_signed(self, key: str, data: bytes) -> None:
        """Upload the record signed with this builder's key; a record under our key that
        our key did not sign (planted by another writer) is replaced."""
        from tpubuild.digests import key_id, problem, sign

        keyid = key_id(self.signing_key.public_key())
        signature = sign(data, self.signing_key)
        document = json.dumps({"record": data.decode(), "signature": signature.decode()}, sort_keys=True).encode()
        rel = _signed_rel(keyid, key)
        try:
            if self._write(lambda io: io.create(rel, document)):
                self.count(bytes_up=len(document))
                return
            existing = json.loads(self._read(lambda io: io.read(rel, RECORD_LIMIT)))
            trusted = {keyid: self.signing_key.public_key()}
            if problem(existing["record"].encode(), existing["signature"].encode(), trusted) is None:
                return  # we (or a twin of this builder) signed it already
        except (ValueError, TypeError, KeyError, AttributeError, FileNotFoundError, ObjectTooLarge):
            pass
        except _Off:
            return
        self._fail(f"remote cache {self.url}: signed record {key} under this builder's key was not signed by it; "
                   "replaced")
        self._replace(rel, document)

    def _replace(self, rel: str, data: bytes) -> None:
        import tempfile

        with tempfile.NamedTemporaryFile(prefix=".tpubuild-signed-") as tmp:
            tmp.write(data)
            tmp.flush()
            try:
                self._write(lambda io: io.upload(tmp.name, rel))
            except (_Off, FileExistsError):
                return

    def fetch_object(self, f: FileEntry, into: str, owner: str = "") -> str | None:
        """Download the object `f` names into the directory `into` (never more bytes than
        `f.size`) and re-hash it: the path of the verified file, or None (said) when it is
        missing, padded, truncated or corrupted. Its name is checked before it becomes a
        path (a record from the remote is data)."""
        if not DIGEST.match(f.hash):
            self._fail(f"remote cache {self.url}: {owner or 'a record'} names a malformed object {f.hash!r}; not used")
            return None
        tmp = os.path.join(into, f.hash)
        of = f" of {owner}" if owner else ""
        try:
            size = self._read(lambda io: io.download(_object_rel(f.hash), tmp, f.size))
        except FileNotFoundError as exc:
            what = f"{exc.kind}, not a regular file (not opened)" if isinstance(exc, NotARegularFile) else "missing"
            self._fail(f"remote cache {self.url}: object {f.hash}{of} is {what}; not used")
            return None
        except ObjectTooLarge as exc:
            problem = f"is padded ({exc.size} bytes, expected {f.size}; not read)"
        except _Off:
            return None
        else:
            self.count(bytes_down=size)
            if size != f.size:
                problem = f"is truncated ({size} bytes, expected {f.size})"
            elif _uncounted_hash(tmp, size) != f.hash:
                problem = "is corrupted (its BLAKE3 hash does not match its name)"
            else:
                return tmp
        with self._lock:
            self._bad.add(f.hash)
        self._fail(f"remote cache {self.url}: object {f.hash}{of} {problem}; not used")
        return None

    def fetch_discovered(self, declared_key: str) -> list[dict[str, Any]]:
        """The discovered-input candidates stored for `declared_key`: a list of
        {"files": {path: hash}, "key": final key}, each checked to hash to its final key."""
        if not self.enabled or not DIGEST.match(declared_key):
            return []
        prefix = f"discovered/{declared_key}"
        try:
            listing = self._read(lambda io: io.list(prefix))
        except (FileNotFoundError, _Off):
            return []
        candidates = []
        for rel, _size, mtime in sorted(listing, key=lambda item: -item[2]):  # newest first
            try:
                raw = self._read(lambda io, rel=rel: io.read(rel, RECORD_LIMIT))  # type: ignore[misc]  # rel bound per row
            except (FileNotFoundError, ObjectTooLarge):
                continue  # collected meanwhile, or not a candidate
            except _Off:
                return []
            self.count(bytes_down=len(raw))
            candidate = _parse_candidate(declared_key, raw)
            if candidate is None or f"{prefix}/{candidate['key']}.json" != rel:
                self._fail(f"remote cache {self.url}: discovered-input record {rel} is malformed; not used")
                continue
            candidates.append(candidate)
        return candidates

    # --- pushing ---------------------------------------------------------------------------
    def push_object(self, f: FileEntry, local: Callable[[], str | None]) -> bool:
        """Make the remote hold the object `f` names: nothing to do when it holds one of
        that size not seen wrong; else upload the file `local()` gives (the caller's intact
        copy, None when it has none: said, and False). True when the remote holds it."""
        rel = _object_rel(f.hash)
        try:
            size = self._read(lambda io: io.size(rel))
        except FileNotFoundError:
            size = None
        except _Off:
            return False
        with self._lock:
            known_bad = f.hash in self._bad
        if size == f.size and not known_bad:
            return True
        path = local()
        if path is None:
            self._fail(f"remote cache {self.url}: object {f.hash} is not intact in the local store; not uploaded")
            return False
        try:
            self._write(lambda io: io.upload(path, rel))
        except (_Off, FileExistsError):
            return False
        self.count(bytes_up=f.size)
        with self._lock:
            self._bad.discard(f.hash)
        return True

    def push_record(self, entry: StageEntry, data: bytes) -> bool:
        """Upload the record `data` of `entry`, create-only: when another builder wrote the
        key first, its record stays; signed when this builder has a key. Then, for a stage
        that ran user code, its discovered-input candidate. The caller uploads the record's
        objects first (remote/transfer.py push_entry), so no reader meets a record without
        them. True when the remote holds the record."""
        if not self.can_push:
            return False
        try:
            created = self._write(lambda io: io.create(_stage_rel(entry.key), data))
        except _Off:
            return False
        if created:
            self.count(uploads=1, bytes_up=len(data))
        if self.signing_key is not None:
            self._push_signed(entry.key, data)
        discovered = entry.record.get("discovered")
        if isinstance(discovered, dict):
            declared = stage_key({k: v for k, v in entry.record.items() if k != "discovered"})
            self.push_discovered(declared, entry.key, discovered)
        return True

    def push_discovered(self, declared_key: str, final_key: str, files: dict[str, str]) -> bool:
        """Record the candidate `files` -> `final_key` for `declared_key` (create-only)."""
        if final_key != discovered_final_key(declared_key, files):
            raise ValueError(f"{final_key} is not the final key of {declared_key} with these discovered files")
        data = canonical_dumps({"files": files, "key": final_key}).encode()
        try:
            created = self._write(lambda io: io.create(f"discovered/{declared_key}/{final_key}.json", data))
        except _Off:
            return False
        if created:
            self.count(bytes_up=len(data))
        return True


# --- candidates and names ---------------------------------------------------------------
def _parse_candidate(declared_key: str, raw: bytes) -> dict[str, Any] | None:
    try:
        return parse_candidate(declared_key, json.loads(raw))
    except ValueError:
        return None


def _stage_rel(key: str) -> str:
    return f"stages/{key[:2]}/{key}.json"


def _signed_rel(keyid: str, key: str) -> str:
    """A record with its signature, one namespace per signing key: a record planted under
    `stages/` first (create-only) cannot keep a trusted builder's signed one out."""
    return f"signed/{keyid}/{key[:2]}/{key}.json"


def _object_rel(digest: str) -> str:
    return f"objects/{digest[:2]}/{digest[2:]}"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


__all__ = ["RemoteCache", "RemoteStats"]


def _uncounted_hash(path: str, size: int) -> str:
    """The check of a download, whose bytes a terminal's meter counted as they came (progress.py)."""
    from tpubuild.progress import uncounted

    with uncounted():
        return hash_file(path, size)
