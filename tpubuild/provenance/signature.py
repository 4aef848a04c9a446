"""Signatures over a published version's files in the OpenSSF model-signing format
(the `model-signing` library: a DSSE envelope over an in-toto statement listing each
file's SHA-256, signed with an elliptic-curve key), and checking a version against its
signature and its manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpubuild.errors import UsageError
from tpubuild.provenance.statement import SIGNATURE

EXTRA = "pip install 'tpubuild[signing]'"


def _library() -> Any:
    try:
        from model_signing import hashing, signing, verifying
    except ImportError as exc:
        raise UsageError(f"signing needs the model-signing package ({EXTRA}): {exc}") from None
    return hashing, signing, verifying


def sign(version_dir: Path, private_key: Path, certificate: Path | None = None,
         chain: list[Path] | None = None) -> Path:
    """Sign every file of `version_dir` but the signature itself, with the key alone or
    with its certificate (and the chain that issued it); returns the signature."""
    hashing, signing, _ = _library()
    path = Path(version_dir) / SIGNATURE
    if certificate is None:
        config = signing.Config().use_elliptic_key_signer(private_key=str(private_key))
    else:
        config = signing.Config().use_certificate_signer(
            private_key=str(private_key), signing_certificate=str(certificate),
            certificate_chain=[str(c) for c in chain or []])
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=[SIGNATURE]))
    config.sign(str(version_dir), str(path))
    return path


def check_signature(version_dir: Path, public_key: Path | None = None,
                    certificate_chain: list[Path] | None = None) -> list[str]:
    """Problems of the version against its signature (empty: it verifies), one line each:
    signed with the private key of `public_key`, or with a certificate `certificate_chain`
    issued."""
    hashing, _, verifying = _library()
    path = Path(version_dir) / SIGNATURE
    if not path.is_file():
        return [f"{SIGNATURE}: missing (the version is not signed)"]
    if public_key is not None:
        config = verifying.Config().use_elliptic_key_verifier(public_key=str(public_key))
    else:
        config = verifying.Config().use_certificate_verifier(certificate_chain=[str(c) for c in certificate_chain or []])
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=[SIGNATURE]))
    try:
        config.verify(str(version_dir), str(path))
    except Exception as exc:  # noqa: BLE001 - the library's errors (ValueError, x509 verification errors)
        text = str(exc)
        if "Key mismatch" in text:
            return [f"{SIGNATURE}: signed with another key than {public_key}"]
        if public_key is None and "Hash mismatch" not in text and "files" not in text:
            first = (text.strip().splitlines() or [type(exc).__name__])[0]
            return [f"{SIGNATURE}: its certificate is not issued by the given chain ({first[:200]})"]
        return [f"{SIGNATURE}: {line}" for line in _mismatches(text)]
    return []


def _mismatches(text: str) -> list[str]:
    """model-signing's mismatch message as one line per file."""
    import re

    files = re.findall(r"Hash mismatch for \\*'([^'\\]+)\\*'", text)  # quotes may come escaped
    extra = re.findall(r"[Ee]xtra files?[^:]*: \[?([^\]]+)\]?", text)
    missing = re.findall(r"[Mm]issing files?[^:]*: \[?([^\]]+)\]?", text)
    lines = [f"{name} differs from what was signed" for name in files]
    clean = lambda item: item.strip().strip("'\"\\")  # noqa: E731 - names come quoted in a list's repr
    lines += [f"not signed: {clean(item)}" for group in extra for item in group.split(",")]
    lines += [f"signed but missing: {clean(item)}" for group in missing for item in group.split(",")]
    return lines or [" ".join(text.split())[:300]]
