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
