"""Signed stage records for the shared remote cache: who wrote a record, not only what.

A bucket-backed cache trusts whoever can write to the bucket (CVE-2025-36852, "CREEP":
a pull-request build that writes a key first poisons it for everyone). With signing,
trusted builders (CI) sign each stage record they upload with a private key from their
environment (`TPUBUILD_REMOTE_SIGNING_KEY`: PEM text or a path); readers configured with
`remote_cache.trusted_keys` accept a record only with a valid signature by one of those
keys, and anything else is a miss (rebuilt locally), said in one line.

Signatures are detached: `{"keyid": <sha256 of the public key's DER, hex>, "sig": <base64>}`
over the record's exact bytes. ECDSA P-256/P-384 (SHA-256) and Ed25519 keys are accepted
(the `cryptography` package, which the remote backends already install).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tpubuild.errors import UsageError

SIGNING_KEY_ENV = "TPUBUILD_REMOTE_SIGNING_KEY"


class SigningKeyError(UsageError):
    """A key that cannot be read: one line naming where it came from."""


def _pem(value: str, where: str) -> bytes:
    """PEM text, or the contents of the file a path names."""
    if "-----BEGIN" in value:
        return value.encode()
    try:
        return Path(value).expanduser().read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"{where}: cannot read {value}: {exc.strerror or exc}") from None


def _serialization(where: str) -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise SigningKeyError(f"{where}: signed records need the cryptography package "
                              "(pip install 'tpubuild[remote]')") from None
    return serialization


def load_private_key(value: str, where: str = SIGNING_KEY_ENV) -> Any:
    """A signing key from PEM text or a file (unencrypted PKCS#8 or traditional)."""
    serialization = _serialization(where)

    try:
        key = serialization.load_pem_private_key(_pem(value, where), password=None)
    except (ValueError, TypeError):
        raise SigningKeyError(f"{where}: not an unencrypted PEM private key") from None
    _check_kind(key, where)
    return key


def load_public_key(path: Path, where: str) -> Any:
    """A trusted public key from a PEM file."""
    serialization = _serialization(where)

    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise SigningKeyError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError):
        raise SigningKeyError(f"{where}: {path} is not a PEM public key") from None
    _check_kind(key, where)
    return key


def _check_kind(key: Any, where: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey,
                            ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        raise SigningKeyError(f"{where}: an ECDSA or Ed25519 key is needed, not {type(key).__name__}")


def key_id(public_key: Any) -> str:
    """sha256 of the public key's DER SubjectPublicKeyInfo: names the signer."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def sign(data: bytes, private_key: Any) -> bytes:
    """The detached signature document of `data`."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        signature = private_key.sign(data, ec.ECDSA(hashes.SHA256()))
    else:
        signature = private_key.sign(data)
    document = {"keyid": key_id(private_key.public_key()), "sig": base64.b64encode(signature).decode()}
    return json.dumps(document, sort_keys=True).encode()


def problem(data: bytes, signature: bytes | None, trusted: dict[str, Any]) -> str | None:
    """None when a trusted key signed `data`; else why not, in a few words."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    if signature is None:
        return "it is unsigned"
    try:
        document = json.loads(signature)
        keyid, raw = document["keyid"], base64.b64decode(document["sig"], validate=True)
    except (ValueError, TypeError, KeyError):
        return "its signature is malformed"
    key = trusted.get(keyid)
    if key is None:
        return f"it is signed by an untrusted key ({str(keyid)[:12]})"
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(raw, data, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(raw, data)
    except InvalidSignature:
        return f"its signature by key {keyid[:12]} does not match the record"
    return None


def signing_key_from_environment(environ: dict[str, str] | None = None) -> Any | None:
    """The builder's signing key, when its environment names one."""
    value = (environ if environ is not None else os.environ).get(SIGNING_KEY_ENV)
    return load_private_key(value) if value else None
