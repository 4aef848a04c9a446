"""fingerprint.pb carries a uuid derived from content, so equal models hash equally."""

from __future__ import annotations

import shutil
from pathlib import Path

from tensorflow.core.protobuf import fingerprint_pb2

from tpubuild.savedmodel.model import (
    FINGERPRINT_PB,
    SavedModel,
    make_fingerprint_reproducible,
)


def _fingerprint(directory: Path) -> fingerprint_pb2.FingerprintDef:
    return fingerprint_pb2.FingerprintDef.FromString((directory / FINGERPRINT_PB).read_bytes())


def test_random_uuids_become_the_same_content_derived_uuid(zoo: Path, tmp_path: Path) -> None:
    copies = []
    for name, uuid in (("a", "1234"), ("b", "98765")):  # two saves: two random uuids
        copy = tmp_path / name
        shutil.copytree(zoo, copy)
        fingerprint = _fingerprint(copy)
        fingerprint.uuid = uuid
        (copy / FINGERPRINT_PB).write_bytes(fingerprint.SerializeToString())
        make_fingerprint_reproducible(copy)
        copies.append(copy)
    first, second = (_fingerprint(c) for c in copies)
    assert first == second
    assert first.uuid not in ("", "1234") and first.saved_model_checksum == _fingerprint(zoo).saved_model_checksum


def test_saved_models_get_the_reproducible_fingerprint(zoo: Path, tmp_path: Path) -> None:
    out = tmp_path / "saved"
    out.mkdir()
    SavedModel.load(zoo).save(out)
    before = (out / FINGERPRINT_PB).read_bytes()
    make_fingerprint_reproducible(out)  # already stable: unchanged
    assert (out / FINGERPRINT_PB).read_bytes() == before
