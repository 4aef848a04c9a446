"""The provenance statement of a published version: `tpubuild-provenance.json`.

An in-toto Statement v1 (https://in-toto.io/Statement/v1) whose subjects are the
version's files with their SHA-256, and whose predicate is SLSA Provenance v1
(https://slsa.dev/provenance/v1): the build type is tpubuild's, the external
parameters are the recipe (path and canonical digest), the resolved dependencies are
the source and every workspace input the stages hashed, the internal parameters are
each stage's key, the toolchain and the remote cache, and the builder is this tpubuild
version. Everything in it comes from the version's manifest (a subject too): the same
manifest gives the same bytes. Each dependency carries `sha256` (a file) or `dirHash` (a
directory) beside tpubuild's own BLAKE3, the digests in-toto consumers read
(provenance/digests.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpubuild.provenance.digests import Known, published_sha256

PROVENANCE = "tpubuild-provenance.json"
SIGNATURE = "model.sig"  # model-signing's conventional name
BUILD_TYPE = "https://github.com/tpubuild/tpubuild/recipe-build/v1"
BUILDER = "https://github.com/tpubuild/tpubuild"


def list_files(directory: Path, skip: set[str]) -> list[str]:
    """Relative POSIX paths of every file below `directory`, but `skip`, sorted."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(directory):
        for name in filenames:
            rel = Path(os.path.relpath(os.path.join(dirpath, name), directory)).as_posix()
            if rel not in skip:
                found.append(rel)
    return sorted(found)


def sha256_files(directory: Path, skip: set[str], blake3_by_path: dict[str, str] | None = None,
                 known: Known | None = None) -> dict[str, str]:
    """Relative POSIX path -> SHA-256 of every file below `directory`, but `skip`; a file
    that is a hard link of an object this process hashed (`known`, its BLAKE3 the one
    `blake3_by_path` gives) takes the SHA-256 computed ahead for that object
    (provenance/digests.py published_sha256)."""
    found = {}
    for rel in list_files(directory, skip):
        found[rel] = published_sha256(Path(directory) / rel, (blake3_by_path or {}).get(rel), known)
    return found


def statement(subjects: dict[str, str], manifest: dict[str, Any], remote_url: str | None,
              target: str | None = None) -> dict[str, Any]:
    """The in-toto statement for files `subjects` (path -> sha256) built as `manifest` (the
    main version's) says; `target` names the serving target when they are a target version's."""
    inputs = manifest.get("inputs", {})
    standard = manifest.get("input_digests", {})  # sha256 / dirHash beside BLAKE3 (provenance/digests.py)
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(subjects.items())],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "recipe": {"path": manifest["recipe_file"], "name": manifest["recipe"],
                               "canonicalDigest": manifest["recipe_digest"]},
                    **({"target": target} if target else {}),
                },
                "internalParameters": {
                    "stages": [{"stage": s["stage"], "key": s["key"], "output": s["output"]}
                               for s in manifest.get("stages", [])],
                    "toolchain": manifest.get("toolchain", {}),
                    "remoteCache": remote_url,
                    "content": manifest["content"],
                },
                "resolvedDependencies": [
                    {"name": name, "digest": {"blake3": digest, **standard.get(name, {})}}
                    for name, digest in sorted(inputs.items())
                ],
            },
            "runDetails": {
                "builder": {"id": BUILDER, "version": {"tpubuild": manifest.get("tpubuild", "")}},
                "metadata": {"invocationId": "/".join([manifest["recipe"], *([target] if target else []),
                                                        str(manifest.get("version", ""))])},
            },
        },
    }


def write(directory: Path, manifest: dict[str, Any], remote_url: str | None, target: str | None = None,
          known: Known | None = None) -> None:
    """Write the statement over the files of `directory`: those the manifest lists, and
    `tpubuild-manifest.json` itself (a consumer that trusts the statement can then trust
    what the manifest says: verdicts, targets, build facts). `directory` is target
    `target`'s version when it is given. `known`: see sha256_files."""
    listed = manifest.get("files", {}) if target is None else \
        manifest.get("targets", {}).get(target, {}).get("files", {})
    subjects = sha256_files(directory, {PROVENANCE, SIGNATURE}, listed, known)
    data = json.dumps(statement(subjects, manifest, remote_url, target), indent=2, sort_keys=True) + "\n"
    with open(directory / PROVENANCE, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
