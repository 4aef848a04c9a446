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


# Characters no URL tpubuild accepts holds: whitespace and control characters (a newline
# would also cut a one-line message in two).
_UNPRINTABLE = re.compile(r"[\s\x00-\x1f\x7f]")
# A bucket name: the characters S3 (legacy us-east-1 names included) and GCS allow in one.
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,222}")
# Kernel file systems: no share is mounted there, and nothing can be created in them.
_KERNEL_DIRS = ("/proc", "/sys", "/dev")


def url_problem(url: str) -> str | None:
    """Why `url` cannot name a remote cache or a publish destination, or None: the one
    check `validate` (config/workspace.py, config/checks.py), `build` (transport/backends.py
    open_backend) and `verify` make, so validate refuses what build refuses. Credentials
    in it are refused (and never echoed): they would be committed with the workspace file."""
    if not isinstance(url, str):
        return "not a URL"
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
    if _UNPRINTABLE.search(url):
        return f"{url!r} holds a space or a control character"
    if not parts.scheme or "://" not in url:
        return f"{url!r} is not a URL like s3://bucket/prefix, gs://bucket/prefix or file:///shared/dir"
    written = url.split("://", 1)[0]
    if parts.scheme not in BACKENDS:
        return f"{url!r}: the {parts.scheme}:// scheme is not supported (s3://, gs://, file://)"
    if written != parts.scheme:
        return f"{url!r}: write the scheme in lower case ({parts.scheme}://)"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return f"{url!r}: a query or a fragment (?...#...) names nothing here"
    path = parts.path.rstrip("/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            return f"{url!r}: a file:// URL needs an absolute path (file:///shared/dir)"
        if "%" in path or _unclean(path[1:]):
            return f"{url!r}: the path must be plain and normalized (no '.', '..', '//' or %-escapes)"
        if any(path == d or path.startswith(f"{d}/") for d in _KERNEL_DIRS):
            return f"{url!r}: {path} is in a kernel file system, not a shared directory"
        return None
    if not parts.netloc:
        return f"{url!r} names no bucket"
    if not _BUCKET.fullmatch(parts.netloc):
        return f"{url!r}: {parts.netloc!r} is not a bucket name (letters, digits, '.', '-', '_')"
    if path and _unclean(path[1:]):
        return f"{url!r}: the prefix must be plain and normalized (no '.', '..' or '//')"
    return None


def _unclean(rel: str) -> bool:
    """Whether the relative path `rel` (empty: the root) is not a clean one (fs/names.py)."""
    from tpubuild.fs import clean_relative

    return bool(rel) and clean_relative(rel) is None
