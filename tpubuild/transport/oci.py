"""An OCI registry as the distribution spec defines it (opencontainers/distribution-spec
spec.md; the reference implementation is distribution/distribution's registry/handlers):
tags listed, manifests read, written and deleted, blobs looked at, pushed in chunks and
pulled, each checked against its digest. A transport beside the bucket and mount ones
(transport/backends.py): it knows no versions, numbers or layouts; publish/ stands on it.

- Tags: `GET /v2/<name>/tags/list?n=`, following the `Link: <...>; rel="next"` header
  (registry/handlers/tags.go in distribution 3 pages with `n` and `last`; 2.8 answers
  every tag at once). An unknown repository (404 NAME_UNKNOWN) has no tags.
- Manifests: read with the Accept header of the OCI and docker media types, at most
  MANIFEST_LIMIT bytes (distribution's maxManifestBodySize, registry/handlers/manifests.go),
  their digest computed here (the registry's Docker-Content-Digest header is data: read,
  never believed); written with their media type, the digest the registry answers checked
  against the bytes sent; deleted by digest (DeleteManifest: which removes every tag that
  names it; 405 UNSUPPORTED where deletes are off, `DeletesRefused`).
- Blobs: `HEAD` first (a blob the repository has is not sent again); else an upload
  session (`POST /v2/<name>/blobs/uploads/`): a blob of at most `chunk` bytes (UPLOAD_CHUNK)
  in one `PUT <location>?digest=`, a larger one in PATCHes of `chunk` bytes, then the PUT;
  each body read from the file a piece at a time as the socket sends it (an 8 GiB file is
  never in memory). The registry computes the digest of what it received and refuses the
  blob when it is not the one named (distribution registry/storage/blobwriter.go
  validateBlob), so a blob under a digest is those bytes. A PATCH that fails is resumed
  where the registry's upload status says its copy stops; a session that fails is begun
  again, ATTEMPTS times at most (`push_blob` says why no step is resent). A blob of
  another repository of the registry
  is mounted (`POST ...?mount=&from=`), not sent again. Pulled blobs are hashed as they
  arrive and refused (`BlobMismatch`) unless they are exactly their descriptor's size and
  digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote, urlencode, urlsplit

from tpubuild.config.remote_url import OciAddress, Timeouts
from tpubuild.transport.oci_auth import Credentials
from tpubuild.transport.oci_http import ATTEMPTS, AnswerTooLarge, Body, Http, RegistryError, RegistryUnreachable

MANIFEST_LIMIT = 4 << 20
UPLOAD_CHUNK = 64 << 20
TAGS_PAGE = 1000
MAX_TAG_PAGES = 10_000  # a registry whose `next` never ends is cut off
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
BLOB_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class DeletesRefused(RegistryError):
    """The registry does not delete manifests (distribution's storage.delete.enabled off:
    405 UNSUPPORTED), or not for these credentials (DENIED)."""


class BlobMismatch(RegistryError):
    """A blob whose bytes are not its descriptor's size and digest."""


@dataclass(frozen=True)
class Manifest:
    """A manifest as the registry served it: its bytes, their digest (computed here), the
    media type it says it is."""

    data: bytes
    digest: str
    media_type: str

    def json(self) -> object:
        return json.loads(self.data)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """One registry (`address.host`), over HTTPS; plain HTTP when `insecure` is True, or is
    None and the host is this machine (127.0.0.1, ::1, localhost), as docker treats them."""

    def __init__(self, address: OciAddress, timeouts: Timeouts | None = None, insecure: bool | None = None,
                 credentials: Callable[[], Credentials | None] | None = None, chunk: int = UPLOAD_CHUNK):
        self.address = address
        self.chunk = chunk  # the most one request of an upload sends
        self.timeouts = timeouts or Timeouts()
        plain = insecure if insecure is not None else address.loopback
        self.http = Http(address, self.timeouts, plain=plain, credentials=credentials)

    @property
    def host(self) -> str:
        return self.address.host

    @staticmethod
    def scope(repository: str, actions: str = "pull,push") -> str:
        return f"repository:{repository}:{actions}"

    def _path(self, repository: str, *rest: str) -> str:
        return "/v2/" + quote(repository, safe="/") + "/" + "/".join(quote(r, safe=":") for r in rest)

    # --- tags --------------------------------------------------------------------------
    def tags(self, repository: str) -> list[str]:
        """Every tag of `repository` (none when the registry does not know it)."""
        what = f"cannot list the tags of {self.host}/{repository}"
        target = self._path(repository, "tags", "list") + f"?n={TAGS_PAGE}"
        found: list[str] = []
        for _ in range(MAX_TAG_PAGES):
            answer = self.http.request("GET", target, what=what, scope=self.scope(repository, "pull"),
                                       expect=(200, 404))
            if answer.status_code == 404:
                answer.close()
                return found  # NAME_UNKNOWN: no tag pushed yet
            link = answer.headers.get("Link", "")
            text = self.http.read(answer, 64 << 20, time.monotonic() + self.timeouts.total, what)
            try:
                tags = json.loads(text).get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(f"{what}: the answer is not a tag list") from None
            found += [t for t in tags if isinstance(t, str)]
            match = _NEXT.search(link)
            if not match or not tags:
                return found
            following = match.group(1)
            target = following if following.startswith("/") else self.http.url(following)
        raise RegistryError(f"{what}: more than {MAX_TAG_PAGES} pages")

    # --- manifests ---------------------------------------------------------------------
    def manifest(self, repository: str, reference: str, limit: int = MANIFEST_LIMIT) -> Manifest | None:
        """The manifest `reference` (a tag or a digest) names, None when there is none. By
        digest, bytes of another digest are a BlobMismatch."""
        what = f"cannot read {self.host}/{repository}{'@' if BLOB_DIGEST.fullmatch(reference) else ':'}{reference}"
        answer = self.http.request("GET", self._path(repository, "manifests", reference), what=what,
                                   scope=self.scope(repository, "pull"), expect=(200, 404),
                                   headers={"Accept": ACCEPT})
        if answer.status_code == 404:
            answer.close()
            return None
        media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
        data = self.http.read(answer, limit, time.monotonic() + self.timeouts.total, what)
        digest = sha256_digest(data)
        if BLOB_DIGEST.fullmatch(reference) and digest != reference:
            raise BlobMismatch(f"{what}: the registry served other bytes ({digest})")
        try:
            said = json.loads(data).get("mediaType")
        except (ValueError, AttributeError):
            said = None
        return Manifest(data, digest, said if isinstance(said, str) and said else media_type)

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        """Store `data` as the manifest `reference` names (a tag: the registry points it
        there, whatever it pointed at: tags are last-writer-wins). Returns its digest.

        A refusal that names a blob the manifest lists (DIGEST_INVALID, MANIFEST_BLOB_UNKNOWN)
        is tried again, ATTEMPTS times, a moment apart: distribution checks each blob through
        the repository's link file, which another job pushing the same blob at that moment
        rewrites in place (storage/driver/filesystem/driver.go Writer truncates, then writes;
        linkedblobstore.go linkBlob), so the check can read an empty link (seen with three
        jobs pushing the one empty blob of their claims: tests/publish/test_oci_races.py).
        A PUT of the same bytes to the same reference is the same request, so sending it
        again is harmless."""
        digest = sha256_digest(data)
        what = f"cannot push {self.host}/{repository}:{reference}"
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = self.http.request("PUT", self._path(repository, "manifests", reference), what=what,
                                           scope=self.scope(repository), expect=(201, 200, 202),
                                           headers={"Content-Type": media_type}, body=data)
                break
            except RegistryError as exc:
                if attempt == ATTEMPTS or exc.code not in ("DIGEST_INVALID", "MANIFEST_BLOB_UNKNOWN", "BLOB_UNKNOWN"):
                    raise
                time.sleep(0.2 * attempt)
        said = answer.headers.get("Docker-Content-Digest")
        answer.close()
        if said and said != digest:
            raise RegistryError(f"{what}: the registry stored it as {said[:80]}, not {digest}")
        return digest

    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete the manifest `digest` (and with it every tag that names it). False when it
        was gone; DeletesRefused when the registry does not delete."""
        what = f"cannot delete {self.host}/{repository}@{digest}"
        try:
            answer = self.http.request("DELETE", self._path(repository, "manifests", digest), what=what,
                                       scope=self.scope(repository, "delete"), expect=(202, 200, 204, 404))
        except RegistryError as exc:
            if exc.status == 405 or exc.code in ("UNSUPPORTED", "DENIED") or exc.status == 403:
                raise DeletesRefused(str(exc), exc.status, exc.code) from None
            raise
        gone = answer.status_code == 404
        answer.close()
        return not gone

    # --- blobs -------------------------------------------------------------------------
    def blob_size(self, repository: str, digest: str) -> int | None:
        """The size of the blob `digest` in `repository`, None when it has none."""
        answer = self.http.request("HEAD", self._path(repository, "blobs", digest),
                                   what=f"cannot look at {self.host}/{repository}@{digest}",
                                   scope=self.scope(repository, "pull"), expect=(200, 404), redirects=True)
        answer.close()
        if answer.status_code == 404:
            return None
        length = answer.headers.get("Content-Length", "")
        return int(length) if length.isdigit() else -1

    def push_blob(self, repository: str, digest: str, size: int, source: Callable[[int], BinaryIO] | bytes) -> bool:
        """Make `repository` hold the blob `digest` of `size` bytes, read from `source`
        (bytes, or `source(offset)`: a binary file object positioned at `offset`, opened
        again for each attempt). False when it held it already (nothing sent); True when sent.

        A blob of at most `chunk` bytes goes in one PUT of the upload session (the spec's
        "POST then PUT", which every registry takes); a larger one in PATCHes of `chunk`
        bytes, then an empty PUT. No step of an upload is resent as it is: the registry may
        have taken part of a body it then lost the connection of, and distribution appends
        what a PATCH or a PUT sends to what the session holds (registry/handlers/blobupload.go
        PatchBlobData, PutBlobUploadComplete: copyFullPayload into the upload's writer), so
        the same bytes again would be a blob of another digest. A chunked upload resumes
        where the registry's upload status says its copy ends; a failed session is
        abandoned and the upload begun again (ATTEMPTS sessions at most), after a HEAD in
        case the blob landed."""
        present = self.blob_size(repository, digest)
        if present is not None:
            if present not in (size, -1):
                raise BlobMismatch(f"{self.host}/{repository} holds {digest} with {present} bytes, not {size}")
            return False
        scope = self.scope(repository)
        what = f"cannot push {digest} to {self.host}/{repository}"
        failure: RegistryError | None = None
        for _ in range(ATTEMPTS):
            location = self._start_upload(repository, what, scope)
            try:
                if isinstance(source, bytes) or size <= self.chunk:
                    body = source if isinstance(source, bytes) else Body(source, 0, size)
                    self.http.request("PUT", _with_digest(location, digest), what=what, scope=scope,
                                      expect=(201, 204), headers={"Content-Type": "application/octet-stream"},
                                      body=body, budget=self.timeouts.upload_deadline(size), attempts=1).close()
                else:
                    self._chunked(digest, size, source, location, what, scope)
                return True
            except RegistryError as exc:
                if exc.code == "DIGEST_INVALID":
                    raise BlobMismatch(f"{what}: the registry received bytes of another digest (the file changed "
                                       "while it was sent?)", exc.status, exc.code) from None
                if not _restartable(exc):
                    raise
                failure = exc
            if self.blob_size(repository, digest) == size:
                return True  # the last answer was lost, not the blob
        assert failure is not None
        raise failure

    def mount_blob(self, repository: str, digest: str, source_repository: str) -> bool:
        """Make `repository` hold the blob `digest` that `source_repository` (of this
        registry) holds, without sending it (`POST ...?mount=&from=`). False when the
        registry would not mount it (it then opened an upload, which is cancelled)."""
        if self.blob_size(repository, digest) is not None:
            return True
        scope = f"{self.scope(repository)} {self.scope(source_repository, 'pull')}"
        what = f"cannot mount {digest} from {self.host}/{source_repository} into {repository}"
        query = "?" + urlencode({"mount": digest, "from": source_repository})
        answer = self.http.request("POST", self._path(repository, "blobs", "uploads", "") + query, what=what,
                                   scope=scope, expect=(201, 202))
        location = answer.headers.get("Location")
        answer.close()
        if answer.status_code == 201:
            return True
        if location:
            try:
                self.http.request("DELETE", location, what=what, scope=scope, expect=(204, 200, 404)).close()
            except RegistryError:
                pass  # an abandoned session: the registry purges it (uploadpurging)
        return False

    def _start_upload(self, repository: str, what: str, scope: str) -> str:
        """A new upload session's Location."""
        answer = self.http.request("POST", self._path(repository, "blobs", "uploads", ""), what=what, scope=scope,
                                   expect=(202,))
        location = answer.headers.get("Location")
        answer.close()
        if not location:
            raise RegistryError(f"{what}: the registry gave no upload location")
        return location

    def _chunked(self, digest: str, size: int, source: Callable[[int], BinaryIO], location: str, what: str,
                 scope: str) -> None:
        """PATCHes of `chunk` bytes, each streamed from `source`, then the PUT that names
        the digest. A PATCH that fails is resumed where the registry's copy ends, when its
        upload status can be read (distribution 2.8 refuses a location whose `_state` is
        behind what it holds, BLOB_UPLOAD_INVALID: app.go blobUploadDispatcher), ATTEMPTS
        times; anything else ends the session (the caller begins another)."""
        offset = 0
        resumed = 0
        while offset < size:
            length = min(self.chunk, size - offset)
            try:
                answer = self.http.request(
                    "PATCH", location, what=what, scope=scope, expect=(202, 204),
                    headers={"Content-Type": "application/octet-stream",
                             "Content-Range": f"{offset}-{offset + length - 1}"},
                    body=Body(source, offset, length), budget=self.timeouts.upload_deadline(length), attempts=1)
            except RegistryError as exc:
                resumed += 1
                if resumed >= ATTEMPTS or not _restartable(exc):
                    raise
                status = self._upload_status(location, what, scope)
                if status is None:
                    raise
                location, offset = status
                continue
            location = answer.headers.get("Location") or location
            answer.close()
            offset += length
        self.http.request("PUT", _with_digest(location, digest), what=what, scope=scope, expect=(201, 204),
                          headers={"Content-Length": "0"}, body=b"", attempts=1).close()

    def _upload_status(self, location: str, what: str, scope: str) -> tuple[str, int] | None:
        """(the session's location, how many bytes the registry holds of it), None when the
        session is gone. distribution answers `Range: 0-<last byte>` (blobupload.go
        GetUploadStatus; "0-0" for none: it says `0-<size-1>` clamped at 0), so "0-0" is
        taken for no byte: at worst one byte is sent again, which the registry refuses by
        range, and the session is begun again."""
        try:
            answer = self.http.request("GET", location, what=what, scope=scope, expect=(204, 200))
        except RegistryError:
            return None
        ends = re.fullmatch(r"0-([0-9]+)", answer.headers.get("Range", ""))
        location = answer.headers.get("Location") or location
        answer.close()
        if ends is None:
            return None
        return location, 0 if ends.group(1) == "0" else int(ends.group(1)) + 1

    def blob_pieces(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        """The bytes of blob `digest`, a piece at a time, hashed as they come: after the
        last piece, BlobMismatch unless they were exactly `size` bytes hashing to `digest`."""
        what = f"cannot pull {self.host}/{repository}@{digest}"
        budget = self.timeouts.upload_deadline(size)
        deadline = time.monotonic() + budget
        answer = self.http.request("GET", self._path(repository, "blobs", digest), what=what,
                                   scope=self.scope(repository, "pull"), expect=(200,), redirects=True,
                                   budget=budget)
        length = answer.headers.get("Content-Length", "")
        if length.isdigit() and int(length) != size:
            answer.close()
            raise BlobMismatch(f"{what}: {length} bytes, not the {size} its descriptor says")
        hasher = hashlib.sha256()
        got = 0
        for piece in self.http.pieces(answer, deadline, what):
            got += len(piece)
            if got > size:
                answer.close()
                raise BlobMismatch(f"{what}: more than the {size} bytes its descriptor says")
            hasher.update(piece)
            yield piece
        if got != size or "sha256:" + hasher.hexdigest() != digest:
            raise BlobMismatch(f"{what}: {got} bytes hashing to sha256:{hasher.hexdigest()[:16]}..., not its "
                               "descriptor's")

    def pull_blob(self, repository: str, digest: str, size: int, path: str) -> None:
        """Blob `digest` into the new file `path` (O_EXCL: never over a file or through a
        link), checked as it arrives; a blob that is not its descriptor's is removed."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "wb") as out:
                for piece in self.blob_pieces(repository, digest, size):
                    out.write(piece)
        except BaseException:
            os.unlink(path)
            raise

    def read_blob(self, repository: str, digest: str, limit: int) -> bytes:
        """A small blob (a config, a document) whole, checked; AnswerTooLarge over `limit`."""
        size = self.blob_size(repository, digest)
        if size is None:
            raise FileNotFoundError(f"{self.host}/{repository}@{digest}")
        if size > limit:
            raise AnswerTooLarge(f"{self.host}/{repository}@{digest}: {size} bytes, more than {limit}")
        return b"".join(self.blob_pieces(repository, digest, size))


def _restartable(exc: RegistryError) -> bool:
    """Whether an upload that failed with `exc` may be tried again in a new session: no
    complete answer, the registry's own trouble (5xx, 429), or a session it lost or
    whose offset it disputes (404 BLOB_UPLOAD_UNKNOWN, 416, 400 BLOB_UPLOAD_INVALID)."""
    return isinstance(exc, RegistryUnreachable) or exc.status in (404, 416, 429) or (exc.status or 0) >= 500 \
        or exc.code in ("BLOB_UPLOAD_UNKNOWN", "BLOB_UPLOAD_INVALID")


def _with_digest(location: str, digest: str) -> str:
    """An upload Location with `digest=` added to the query it has (distribution's `_state`)."""
    return location + ("&" if urlsplit(location).query else "?") + urlencode({"digest": digest})


__all__ = ["BLOB_DIGEST", "AnswerTooLarge", "BlobMismatch", "DeletesRefused", "Manifest", "Registry", "RegistryError",
           "RegistryUnreachable", "sha256_digest"]
