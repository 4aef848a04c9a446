"""Which kind of publish destination a `publish_to:` URL is, and one recipe's publish to
it: an object store or a mount (publish/destination.py, publish/to_destination.py), or an
OCI registry's repository (publish/oci_destination.py, publish/oci_publish.py). What the
engine, `clean --remote` and `serving-config` open."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpubuild.publish.dest_state import Outcome


def is_registry(url: str | None) -> bool:
    return isinstance(url, str) and url.startswith("oci://")


def note_place(url: str, oci: dict[str, Any] | None = None) -> str:
    """What a workspace's note of a publish names (publish/to_destination.py record_path):
    the URL, and for a registry the format and base image pushed there, so that a change
    of either publishes again rather than finding the old note."""
    if not is_registry(url):
        return url
    settings = oci or {}
    place = f"{url.rstrip('/')}#{settings.get('format', 'modelpack')}"
    base = settings.get("base_image") if settings.get("format") == "modelcar" else None
    return f"{place}+{base}" if base else place


def open_destination(url: str, timeouts: Any = None, oci: dict[str, Any] | None = None,
                     say: Callable[[str], None] | None = None) -> Any:
    """The destination of `url`: an OciDestination (with the recipe's `oci:` settings) for
    oci://, else a Destination. Nothing is contacted before its first use."""
    if is_registry(url):
        from tpubuild.publish.oci_destination import OciDestination

        return OciDestination(url, timeouts, oci, say=say)
    from tpubuild.publish.destination import Destination

    return Destination(url, timeouts, say=say)


def publish_to_destination(dest: Any, recipe: str, version_dir: Path, scratch: Path, **options: Any) -> Outcome:
    """`publish_version` (bucket, mount) or `publish_oci_version` (registry), as `dest` is."""
    from tpubuild.publish.oci_destination import OciDestination

    if isinstance(dest, OciDestination):
        from tpubuild.publish.oci_publish import publish_oci_version

        return publish_oci_version(dest, recipe, version_dir, scratch, **options)
    from tpubuild.publish.to_destination import publish_version

    return publish_version(dest, recipe, version_dir, scratch, **options)
