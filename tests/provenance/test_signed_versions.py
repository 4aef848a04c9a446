"""Provenance and signatures of published versions: an in-toto statement in every version,
a model-signing signature when the workspace names a key, and `tpubuild verify` that
says which file differs (key pairs made in the test, never the network)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.engine.conftest import source_recipe, tpubuild, write_workspace
from tests.engine.conftest import tiny_saved_model  # noqa: F401 (a session fixture)


def key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def signed(tmp_path_factory, tiny_saved_model) -> tuple[Path, Path, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("signed")
    private, public = key_pair(root, "ci")
    _, other = key_pair(root, "other")
    ws = write_workspace(root / "ws", tiny_saved_model, {"toy": source_recipe("toy")})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"signing: {{key: {private}}}\n")
    done = tpubuild(ws, "build")
    assert done.returncode == 0, done.stderr
    return ws / "out" / "toy" / "1", public, other


def test_every_version_carries_a_provenance_statement_over_its_files(signed) -> None:
    version, _, _ = signed
    statement = json.loads((version / "tpubuild-provenance.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    on_disk = {p.relative_to(version).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in version.rglob("*")
               if p.is_file() and p.name not in ("tpubuild-provenance.json", "model.sig", "tpubuild-manifest.json")}
    assert subjects == on_disk and "saved_model.pb" in subjects
    manifest = json.loads((version / "tpubuild-manifest.json").read_text())
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["recipe"]["canonicalDigest"] == manifest["recipe_digest"]
    assert [s["key"] for s in build["internalParameters"]["stages"]] == [s["key"] for s in manifest["stages"]]
    assert build["internalParameters"]["toolchain"] == manifest["toolchain"]
    assert statement["predicate"]["runDetails"]["builder"]["version"]["tpubuild"] == manifest["tpubuild"]


def test_verify_passes_on_a_fresh_version_and_names_a_changed_byte(signed, tmp_path) -> None:
    version, public, other = signed
    done = tpubuild(version.parents[2], "verify", str(version), "--key", str(public))
    assert done.returncode == 0, done.stderr
    assert "every file matches its manifest and its signature" in done.stdout
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(version, copy)
    target = copy / "saved_model.pb"
    os.chmod(target, 0o644)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    done = tpubuild(version.parents[2], "verify", str(copy), "--key", str(public))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert f"{copy}: saved_model.pb: content differs from the manifest" in lines, lines
    assert f"{copy}: model.sig: saved_model.pb differs from what was signed" in lines, lines


def test_a_version_signed_with_another_key_fails(signed) -> None:
    version, _, other = signed
    done = tpubuild(version.parents[2], "verify", str(version), "--key", str(other))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"{version}: model.sig: signed with another key than {other}"]
