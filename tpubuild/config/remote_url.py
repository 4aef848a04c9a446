"""Which URLs may name a remote cache (remote/cache.py). Import-light: the workspace
file's check uses it, and planning commands load the workspace."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

# URL scheme -> the package fsspec needs for it (None: fsspec alone).
BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "file": None}
EXTRA = "tpubuild[remote]"
# Query parameters that carry secrets (presigned URLs, SAS tokens).
_SECRET_PARAMS = re.compile(r"key|secret|token|signature|credential|password|sig", re.IGNORECASE)
CREDENTIALS_FROM = ("credentials come only from the backend's environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS) "
                    "or its config files (~/.aws)")


@dataclass(frozen=True)
class Timeouts:
    """Deadlines of every call to a network remote (s3://, gs://), in seconds: an endpoint
    that accepts connections and never answers, or trickles its answer a byte at a time,
    must cost a build seconds, then the build goes on locally (remote/cache.py).

    - connect: to open a connection (botocore `connect_timeout`, aiohttp `sock_connect`);
    - first_byte: to wait for the first byte of an answer, and between two reads of it
      (botocore `read_timeout`, aiohttp `sock_read`);
    - total: for one whole call, retries included (fsspec's `timeout=`, which cancels
      the call); an upload gets one more second per MiB it sends, a download is read
      in CHUNK-sized requests, each with this deadline.
    A file:// remote is a mount: its I/O is the kernel's, these do not apply.
    """

    connect: float = 5.0
    first_byte: float = 10.0
    total: float = 30.0

    def upload_deadline(self, size: int) -> float:
        return self.total + size / UPLOAD_FLOOR_BYTES_PER_SECOND


# The slowest upload rate a remote must sustain: below it an upload is cut off.
UPLOAD_FLOOR_BYTES_PER_SECOND = 1 << 20
# The remote_cache: keys that set Timeouts' fields.
TIMEOUT_KEYS = {"connect_timeout": "connect", "first_byte_timeout": "first_byte", "total_timeout": "total"}


def url_problem(url: str) -> str | None:
    """Why `url` cannot name a remote cache, or None. Credentials in it are refused
    (and never echoed): they would be committed with the workspace file."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:
        return f"not a URL ({exc})"
    if "@" in parts.netloc:
        return f"the URL holds credentials (user:password@); remove them: {CREDENTIALS_FROM}"
    for name, _ in query:
        if _SECRET_PARAMS.search(name):
            return f"the URL holds key material (query parameter {name!r}); remove it: {CREDENTIALS_FROM}"
    if not parts.scheme or "://" not in url:
        return f"{url!r} is not a URL like s3://bucket/prefix, gs://bucket/prefix or file:///shared/dir"
    if parts.scheme not in BACKENDS:
        return f"{url!r}: the {parts.scheme}:// scheme is not supported (s3://, gs://, file://)"
    if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
        return f"{url!r}: a file:// URL needs an absolute path (file:///shared/dir)"
    if parts.scheme != "file" and not parts.netloc:
        return f"{url!r} names no bucket"
    return None
