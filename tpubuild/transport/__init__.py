"""Bytes under names on a remote: the fsspec backends (s3://, gs://) and a shared directory
(file://, opened below its root by descriptor, never through a link: `mount`), each call
under deadlines (`backends`); and an OCI registry (oci://: the distribution API `oci`, its
requests with deadlines and retries `oci_http`, its credentials and challenges `oci_auth`).
It knows no stage keys, records or store layout: the remote cache (remote/) and the
publish destinations (publish/) stand on it, each rooting it where its own layout starts.
"""

from __future__ import annotations

from tpubuild.face import lazy

# Name -> the module of this package that defines it, loaded on first use (tpubuild/face.py).
_FACE = {
    "AnswerTooLarge": "oci_http",
    "BLOB_DIGEST": "oci",
    "Backend": "backends",
    "BlobMismatch": "oci",
    "DeletesRefused": "oci",
    "NotARegularFile": "backends",
    "ObjectTooLarge": "backends",
    "Registry": "oci",
    "RegistryAuthError": "oci_auth",
    "RegistryError": "oci_http",
    "RegistryUnreachable": "oci_http",
    "RemoteSetupError": "backends",
    "find_credentials": "oci_auth",
    "open_backend": "backends",
    "sha256_digest": "oci",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy(__name__, _FACE)
