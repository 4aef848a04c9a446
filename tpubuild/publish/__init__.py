"""Published versions, `<output_dir>/<recipe>/<N>/` in TF Serving's layout: numbers reserved
durably, versions written and checked in a temp directory and renamed into place, pruning,
repair, clean (`versions`); the target versions beside them (`targets`); the newest
version updated in place when a build re-measured the same model (`refresh`); the same
versions published to object storage or a shared mount for servers, numbered by the
destination (`destination`, joining its parts `dest_state`, `dest_survey`, `dest_write`,
`dest_mend`, `dest_claims`; and `to_destination`), or to an OCI registry, numbered by its
tags (`oci_destination`, the artifacts and images `oci_format`, one recipe's push
`oci_publish`, verify's pull `oci_fetch`), the kind of a URL `destinations`; and TF
Serving's and KServe's configs of them (`serving_config`, `kserve_config`).
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "Destination": "destination",
    "DestinationError": "dest_state",
    "Holding": "versions",
    "OciDestination": "oci_destination",
    "MANIFEST": "targets",
    "OWN_FILES": "versions",
    "check_manifest": "versions",
    "VerifyError": "verify_remote",
    "check_version": "version_check",
    "fetch_oci_version": "oci_fetch",
    "fetch_version": "verify_remote",
    "identity_problems": "version_check",
    "inference_services": "kserve_config",
    "is_registry": "destinations",
    "foreign_in_newest": "versions",
    "model_server_config": "serving_config",
    "newest_holding": "versions",
    "newest_matching": "versions",
    "newest_in_registry": "kserve_config",
    "newest_same_model": "versions",
    "oci_version_components": "oci_fetch",
    "note_place": "destinations",
    "open_destination": "destinations",
    "prune": "versions",
    "publish": "versions",
    "publish_to_destination": "destinations",
    "publish_version": "to_destination",
    "read_description": "version_check",
    "published_versions": "versions",
    "read_manifest": "versions",
    "record_path": "to_destination",
    "recorded": "to_destination",
    "remember": "to_destination",
    "remove_published": "versions",
    "repair_newest": "versions",
    "repair_version": "versions",
    "reservation_file": "versions",
    "split_by_target": "targets",
    "update_version": "refresh",
    "version_numbers": "versions",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
