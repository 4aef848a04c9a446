"""Signed remote records against a real S3-protocol server: a writer without the trusted
key cannot decide what a trusted build uses (CVE-2025-36852), records CI signed are hits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.cli import tpubuild
from tests.engine.conftest import source_recipe
from tests.remote.conftest import BUCKET, build_remote, stage_keys
from tpubuild.digests import key_id, sign


def key_pair(directory: Path, name: str) -> tuple[Path, Path, object]:
    """A fresh ECDSA P-256 key pair written as PEM files (never from the network)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / f"{name}.pem"
    public = directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public, key


def trusting(ws: Path, url: str, public: Path, push: bool = True) -> None:
    """The workspace reads `url` and trusts records signed by `public` only."""
    document = yaml.safe_load((ws / "tpubuild.yaml").read_text())
    document["remote_cache"] = {"url": url, "push": push, "trusted_keys": [str(public)]}
    (ws / "tpubuild.yaml").write_text(yaml.safe_dump(document))


def rows(doc: dict) -> dict[str, tuple[str, bool]]:
    return {r["stage"]: (r["status"], r["remote"]) for r in doc["rows"]}


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_planted_records_are_never_used_and_ci_signed_ones_are_hits(pushed, s3, fresh, tmp_path):
    # Every record under `trust` was written by a builder without the CI key ("planted").
    url = s3.copy_prefix("shared", "trust")
    ci_private, ci_public, ci_key = key_pair(tmp_path, "ci")
    ci = fresh("ci", {"toy": source_recipe("toy")})
    trusting(ci, url, ci_public)
    doc, stderr = build_remote(ci, s3, env={"TPUBUILD_REMOTE_SIGNING_KEY": str(ci_private)})
    assert all(status == "built" for stage, (status, _) in rows(doc).items()), rows(doc)
    keys = stage_keys(doc, "toy")
    source = keys[("toy", "source")]
    assert f"remote cache {url}: stage record {source} is not signed by a trusted key; not used" in stderr.splitlines()
    keyid = key_id(ci_key.public_key())
    signed = s3.keys(f"trust/v1/signed/{keyid}")
    assert len(signed) == len(keys)  # CI signed every record it uploaded
    # A reader trusting CI: every stage is a hit.
    reader = fresh("reader", {"toy": source_recipe("toy")})
    trusting(reader, url, ci_public, push=False)
    doc, stderr = build_remote(reader, s3)
    assert {status for status, _ in rows(doc).values() if status != "built"} == {"cached"}, rows(doc)
    assert all(remote for stage, (status, remote) in rows(doc).items() if stage != "publish"), rows(doc)


@pytest.mark.slow  # minutes on 2 cores: the slow tier (pytest -m slow, run by .ci/run)
def test_a_record_forged_under_the_ci_key_or_signed_by_another_key_is_a_miss(pushed, s3, fresh, tmp_path):
    url = s3.copy_prefix("shared", "forged")
    ci_private, ci_public, ci_key = key_pair(tmp_path, "ci")
    _, _, other = key_pair(tmp_path, "other")
    ci = fresh("ci", {"toy": source_recipe("toy")})
    trusting(ci, url, ci_public)
    doc, _ = build_remote(ci, s3, env={"TPUBUILD_REMOTE_SIGNING_KEY": str(ci_private)})
    source = stage_keys(doc, "toy")[("toy", "source")]
    rel = f"forged/v1/signed/{key_id(ci_key.public_key())}/{source[:2]}/{source}.json"
    genuine = json.loads(s3.client.get_object(Bucket=BUCKET, Key=rel)["Body"].read())
    # Another key signs a record placed in CI's namespace: its signature does not verify.
    record = genuine["record"].encode()
    forged = {"record": genuine["record"], "signature": sign(record, other).decode()}
    s3.client.put_object(Bucket=BUCKET, Key=rel, Body=json.dumps(forged).encode())
    doc, stderr = build_remote(_reader(fresh, url, ci_public, "reader"), s3)
    assert rows(doc)["source"] == ("built", False)
    assert any(f"stage record {source}: it is signed by an untrusted key (" in line for line in stderr.splitlines())
    # The record's bytes changed under CI's own signature: does not match.
    changed = {"record": genuine["record"].replace('"files"', '"files" ', 1), "signature": genuine["signature"]}
    s3.client.put_object(Bucket=BUCKET, Key=rel, Body=json.dumps(changed).encode())
    doc, stderr = build_remote(_reader(fresh, url, ci_public, "reader2"), s3)
    assert rows(doc)["source"] == ("built", False)
    assert any(f"stage record {source}: its signature by key " in line and "does not match the record" in line
               for line in stderr.splitlines())


def _reader(fresh, url: str, public: Path, name: str) -> Path:
    ws = fresh(name, {"toy": source_recipe("toy")})
    trusting(ws, url, public, push=False)
    return ws


def test_a_trusted_key_that_is_not_a_public_key_is_an_error_at_its_line(fresh, tmp_path):
    ws = fresh("badkey", {"toy": source_recipe("toy")})
    (tmp_path / "not-a-key.pem").write_text("hello\n")
    trusting(ws, "s3://cache/x", tmp_path / "not-a-key.pem")
    done = tpubuild(ws, "validate")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("tpubuild.yaml:") and "remote_cache.trusted_keys[0]: " in line, line
    assert "is not a PEM public key" in line, line
