"""Which URLs may name a remote cache (remote/cache.py) or a publish destination
(publish/), and what an `oci://` one names (`OciAddress`). Import-light: the workspace
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
OCI_CREDENTIALS_FROM = ("a registry's credentials come only from docker's config ($DOCKER_CONFIG/config.json, else "
                        "~/.docker/config.json: `docker login`) and the credential helpers it names")


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


def url_problem(url: str, oci: bool = False) -> str | None:
    """Why `url` cannot name a remote cache (or, with `oci`, a publish destination, which
    may also be an OCI registry's repository), or None: the one check `validate`
    (config/workspace.py, config/checks.py), `build` (transport/backends.py open_backend)
    and `verify` make, so validate refuses what build refuses. Credentials in it are
    refused (and never echoed): they would be committed with the workspace file."""
    if not isinstance(url, str):
        return "not a URL"
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:
        return f"not a URL ({exc})"
    if "@" in parts.netloc:
        source = OCI_CREDENTIALS_FROM if oci and url.startswith("oci://") else CREDENTIALS_FROM
        return f"the URL holds credentials (user:password@); remove them: {source}"
    for name, _ in query:
        if _SECRET_PARAMS.search(name):
            return f"the URL holds key material (query parameter {name!r}); remove it: {CREDENTIALS_FROM}"
    if _UNPRINTABLE.search(url):
        return f"{url!r} holds a space or a control character"
    if not parts.scheme or "://" not in url:
        return f"{url!r} is not a URL like s3://bucket/prefix, gs://bucket/prefix or file:///shared/dir"
    written = url.split("://", 1)[0]
    registry = oci and parts.scheme == "oci"
    if parts.scheme not in BACKENDS and not registry:
        also = ", oci://" if oci else ""
        return f"{url!r}: the {parts.scheme}:// scheme is not supported (s3://, gs://, file://{also})"
    if written != parts.scheme:
        return f"{url!r}: write the scheme in lower case ({parts.scheme}://)"
    if registry:
        return oci_problem(url)
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


# --- OCI registries (`publish_to: oci://HOST[:PORT]/REPO`) ---------------------------------
# A repository name as the distribution spec defines it (opencontainers/distribution-spec
# spec.md "<name>"; distribution's reference/regexp.go): path components of lower-case
# letters and digits, joined by one '.', one or two '_', or any number of '-', separated by '/'.
OCI_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
# A tag (the same spec's "<reference>" as a tag): what a version number and a claim are.
OCI_TAG = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}")
# distribution's NameTotalLengthMax (reference/reference.go): `<host>/<repository>` at most this long.
OCI_NAME_MAX = 255
# A registry host: a DNS name or an IPv4 address (an IPv6 one in brackets), and a port.
_OCI_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
# The hosts a registry may be spoken to in plain HTTP without `oci: {insecure: true}`: this machine.
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class OciAddress:
    """Where an `oci://HOST[:PORT]/REPO` destination is: the registry (`host`, with its
    port when the URL gives one) and the repository below which each recipe is one
    (`REPO/<recipe>`, and `REPO/<recipe>/<target>` for a target's versions)."""

    host: str
    repository: str

    @property
    def hostname(self) -> str:
        """The host without its port (`[::1]` keeps its brackets)."""
        return self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 or "]:" in self.host else self.host

    @property
    def loopback(self) -> bool:
        return self.hostname.lower() in LOOPBACK

    def url(self, repository: str | None = None) -> str:
        return f"oci://{self.host}/{repository or self.repository}"


def oci_problem(url: str) -> str | None:
    """Why `url` is not `oci://HOST[:PORT]/REPO` (a registry and a repository below which
    tpubuild makes one per recipe: no tag, no digest), or None."""
    rest = url[len("oci://"):].rstrip("/")
    host, _, repository = rest.partition("/")
    if not _OCI_HOST.fullmatch(host) or (":" in host.rsplit("]", 1)[-1]
                                         and not 0 < int(host.rsplit(":", 1)[1]) < 65536):
        return f"{url!r}: {host!r} is not a registry host (a name or an address, and a port: oci://HOST[:PORT]/REPO)"
    if not repository:
        return f"{url!r} names no repository (oci://HOST[:PORT]/REPO)"
    if "@" in repository or ":" in repository:
        return (f"{url!r}: a publish destination is a repository, without a tag or a digest (each version is "
                "REPO/<recipe>:<N>)")
    bad = next((part for part in repository.split("/") if not OCI_COMPONENT.fullmatch(part)), None)
    if bad is not None:
        return (f"{url!r}: {bad!r} is not a repository name component (lower-case letters and digits, joined by "
                "'.', '_', '__' or '-')")
    if len(f"{host}/{repository}") > OCI_NAME_MAX:
        return f"{url!r}: longer than the {OCI_NAME_MAX} characters a registry takes"
    return None


def oci_address(url: str) -> OciAddress:
    """The address of an `oci://` URL that oci_problem passed."""
    host, _, repository = url[len("oci://"):].rstrip("/").partition("/")
    return OciAddress(host, repository)


def oci_recipe_problem(url: str, name: str) -> str | None:
    """Why recipe `name` cannot be a repository below the destination `url`, or None: a
    recipe name may hold capitals, '.' runs or a trailing '-', which no repository name takes."""
    if not OCI_COMPONENT.fullmatch(name):
        return (f"the recipe name {name!r} cannot name a repository below publish_to {url} (lower-case letters "
                "and digits, joined by '.', '_', '__' or '-'): set `name:`")
    if len(f"{url[len('oci://'):].rstrip('/')}/{name}") > OCI_NAME_MAX - 40:
        return f"publish_to {url}/{name} is too long for a registry (with room for a target's name)"
    return None


def oci_version_reference(url: str) -> tuple[OciAddress, str, str] | None:
    """`oci://HOST[:PORT]/REPO/<recipe>[/<target>]:<tag>` as (the registry's address of the
    repository that holds the tag, the repository, the tag); None when it is not that."""
    head, sep, tag = url.rpartition(":")
    if not sep or "/" in tag or not head.startswith("oci://") or head.count("/") < 4:
        return None
    if oci_problem(head) is not None or not OCI_TAG.fullmatch(tag):
        return None
    address = oci_address(head)
    return address, address.repository, tag


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def oci_base_reference(value: str) -> tuple[str, str] | None:
    """`base_image:` as (repository, tag or digest): `REPO:TAG` or `REPO@sha256:HEX` of the
    destination's own registry; None when it is not that."""
    if "@" in value:
        repository, _, reference = value.partition("@")
        if not _DIGEST.fullmatch(reference):
            return None
    else:
        repository, _, reference = value.rpartition(":")
        if not repository or "/" in reference or not OCI_TAG.fullmatch(reference):
            return None
    if not all(OCI_COMPONENT.fullmatch(part) for part in repository.split("/")):
        return None
    return repository, reference


def oci_settings_problems(settings: object) -> list[tuple[tuple[str, ...], str]]:
    """What is wrong in an `oci:` mapping the schema passed: (the key's path, the problem)."""
    if not isinstance(settings, dict):
        return []
    problems: list[tuple[tuple[str, ...], str]] = []
    base = settings.get("base_image")
    if isinstance(base, str):
        if oci_base_reference(base) is None:
            problems.append((("oci", "base_image"), f"{base!r} is not REPO:TAG or REPO@sha256:DIGEST of the "
                                                    "destination's registry (e.g. tools/busybox:1.36)"))
        elif settings.get("format", "modelpack") != "modelcar":
            problems.append((("oci", "base_image"), "a base image is for format: modelcar (an image KServe runs); "
                                                    "a ModelPack artifact has no file system to put it under"))
    return problems
