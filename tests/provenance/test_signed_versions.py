"""Provenance and signatures of published versions: an in-toto statement in every version,
a model-signing signature when the workspace names a key, and `tpubuild verify` that
says which file differs (key pairs made in the test, never the network)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.cli import tpubuild
from tests.engine.conftest import (
    source_recipe,
    tiny_saved_model,  # noqa: F401 (a session fixture)
    write_workspace,
)


def key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def copy_with_one_byte_changed(version: Path, copy: Path) -> Path:
    """A copy of a published version whose saved_model.pb differs in one bit."""
    shutil.copytree(version, copy)
    changed = copy / "saved_model.pb"
    os.chmod(changed, 0o644)
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0x01
    changed.write_bytes(bytes(data))
    return copy


def pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def ca_and_leaf(directory: Path, name: str) -> dict[str, Path]:
    """A CA and a code-signing certificate it issued, with the certificate's key (PEM files)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} signer")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {k: directory / f"{name}-{k}.pem" for k in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(pem_key(key))
    return paths


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
               if p.is_file() and p.name not in ("tpubuild-provenance.json", "model.sig")}
    assert subjects == on_disk and {"saved_model.pb", "tpubuild-manifest.json"} <= set(subjects)
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
    copy = copy_with_one_byte_changed(version, tmp_path / "copy")
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


def test_a_version_signed_with_a_certificate_verifies_against_its_chain_only(tmp_path, tiny_saved_model) -> None:  # noqa: F811
    ours, theirs = ca_and_leaf(tmp_path, "ours"), ca_and_leaf(tmp_path, "theirs")
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"toy": source_recipe("toy")})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"signing: {{key: {ours['key']}, certificate: {ours['cert']}, certificate_chain: [{ours['ca']}]}}\n")
    done = tpubuild(ws, "build")
    assert done.returncode == 0, done.stderr
    version = ws / "out" / "toy" / "1"
    done = tpubuild(ws, "verify", str(version), "--certificate-chain", str(ours["ca"]))
    assert done.returncode == 0, done.stderr
    done = tpubuild(ws, "verify", str(version), "--certificate-chain", str(theirs["ca"]))
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"{version}: model.sig: its certificate is not issued by the given chain"), line


@pytest.mark.slow
def test_target_versions_carry_their_own_statement_and_signature(tmp_path, tiny_saved_model) -> None:  # noqa: F811
    """`out/<recipe>/<target>/<N>/` is a published version too (TF Serving serves it from
    its own base path): it gets its own statement over its files, naming the target, and
    its own signature; `tpubuild verify` checks it alone. A rebuild with nothing changed
    publishes nothing new: the two files are tpubuild's own, never taken as foreign."""
    private, public = key_pair(tmp_path, "ci")
    recipe = source_recipe("toy") + "targets:\n  cpu_savedmodel: {}\n"
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"toy": recipe})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"signing: {{key: {private}}}\n")
    done = tpubuild(ws, "build")
    assert done.returncode == 0, done.stderr
    target = ws / "out" / "toy" / "cpu_savedmodel" / "1"
    statement = json.loads((target / "tpubuild-provenance.json").read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    on_disk = {p.relative_to(target).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in target.rglob("*")
               if p.is_file() and p.name not in ("tpubuild-provenance.json", "model.sig")}
    assert subjects == on_disk and {"saved_model.pb", "tpubuild-manifest.json"} <= set(subjects)
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["target"] == "cpu_savedmodel"
    assert statement["predicate"]["runDetails"]["metadata"]["invocationId"] == "toy/cpu_savedmodel/1"
    main = json.loads((ws / "out" / "toy" / "1" / "tpubuild-provenance.json").read_text())
    assert "target" not in main["predicate"]["buildDefinition"]["externalParameters"]

    checked = tpubuild(ws, "verify", str(target), "--key", str(public))
    assert checked.returncode == 0, checked.stderr
    again = tpubuild(ws, "build")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in (ws / "out" / "toy").iterdir() if p.name.isdigit()) == ["1"]

    copy = copy_with_one_byte_changed(target, tmp_path / "copy")
    failed = tpubuild(ws, "verify", str(copy), "--key", str(public))
    assert failed.returncode == 1
    assert f"{copy}: model.sig: saved_model.pb differs from what was signed" in failed.stderr.splitlines()


@pytest.mark.slow
def test_a_version_updated_in_place_is_signed_again(tmp_path, tiny_saved_model) -> None:  # noqa: F811
    # Issue 38 item 3: the same model re-measured updates its version's report in place;
    # the statement and the signature cover the new files.
    private, public = key_pair(tmp_path, "ci")
    ws = write_workspace(tmp_path / "ws", tiny_saved_model, {"toy": source_recipe("toy")})
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write(f"signing: {{key: {private}}}\n")
    assert tpubuild(ws, "build").returncode == 0
    version = ws / "out" / "toy" / "1"
    signature = (version / "model.sig").read_bytes()
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy").replace("samples: 4}", "samples: 4, rtol: 0.5}"))
    done = tpubuild(ws, "build")
    assert done.returncode == 0, done.stderr
    assert "toy: out/toy/1 unchanged (report updated)" in done.stdout
    assert (version / "model.sig").read_bytes() != signature
    done = tpubuild(ws, "verify", str(version), "--key", str(public))
    assert done.returncode == 0, done.stderr
    assert "every file matches its manifest and its signature" in done.stdout
