"""A CI job that publishes tiny versions to a destination, one after another, through
tpubuild's publish module (publish/to_destination.py): what tests/publish/test_publish_races.py
runs two of at once, killing one at random points.

    python -m tests.remote.publish_job URL RECIPE WORKDIR LOG MODEL...

Prints `ready` once its imports are done; after each publish appends a JSON line
{"model", "number", "new"} to LOG (fsynced), so a test that kills the job knows what it
finished."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path


def fake_version(root: Path, recipe: str, model: str, number: int = 1) -> Path:
    """`root/<recipe>/<number>/`: a version as `out/` holds one (a SavedModel's file names,
    its manifest listing each file's BLAKE3), the bytes and sizes derived from `model`."""
    from tpubuild.digests import hash_file
    from tpubuild.publish.targets import MANIFEST

    version = root / recipe / str(number)
    (version / "variables").mkdir(parents=True)
    (version / "assets").mkdir()
    seed = hashlib.sha256(model.encode()).digest()
    size = 200_000 + seed[0] * 512  # a variables file of a few hundred KiB: several chunks in flight
    data = (seed * (size // len(seed) + 1))[:size]
    (version / "variables" / "variables.data-00000-of-00001").write_bytes(data)
    (version / "variables" / "variables.index").write_bytes(b"index " + seed)
    (version / "assets" / "vocab.txt").write_text(f"{model}\n" * (1 + seed[1]))
    (version / "fingerprint.pb").write_bytes(seed[:16])
    (version / "saved_model.pb").write_bytes(b"graph of " + model.encode() + seed * 40)
    files = {p.relative_to(version).as_posix(): hash_file(p) for p in sorted(version.rglob("*")) if p.is_file()}
    manifest = {"recipe": recipe, "model": f"model-{model}", "content": f"content-{model}", "files": files,
                "version": number}
    (version / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return version


def main(argv: list[str]) -> int:
    url, recipe, workdir, log, *models = argv
    from tpubuild.publish import Destination, publish_version

    dest = Destination(url)
    dest.io.list(f"{recipe}/.tpubuild/claims/")  # the backend imported and connected: kills land in publishes
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    print("ready", flush=True)
    for model in models:
        local = work / f"{model}-{os.getpid()}"
        start = time.monotonic()
        outcome = publish_version(dest, recipe, fake_version(local, recipe, model), work)
        with open(log, "a") as out:
            out.write(json.dumps({"model": model, "number": outcome.number, "new": outcome.new,
                                  "seconds": round(time.monotonic() - start, 3), "mended": outcome.mended}) + "\n")
            out.flush()
            os.fsync(out.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
