"""A CI job that publishes tiny versions of one recipe to an oci:// destination, one after
another, through tpubuild's publish module: what tests/publish/test_oci_races.py runs
several of at once, killing some.

    python -m tests.publish.oci_job URL RECIPE WORKDIR LOG FORMAT BIG_BYTES MODEL...

Prints `ready` once its imports are done and the registry answered, then waits for a line
on its standard input (so that racing jobs start together); after each publish appends a
JSON line {"model", "number", "new"} to LOG (fsynced). BIG_BYTES > 0 adds a file of that
many bytes (sparse) to each version: a push that takes long enough to be killed in."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    url, recipe, workdir, log, form, big, *models = argv
    from tests.remote.publish_job import fake_version
    from tpubuild.config.remote_url import Timeouts
    from tpubuild.digests import hash_file
    from tpubuild.publish import open_destination, publish_to_destination
    from tpubuild.publish.targets import MANIFEST, manifest_bytes

    dest = open_destination(url, Timeouts(), {"format": form})
    dest.survey(recipe)
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    print("ready", flush=True)
    sys.stdin.readline()
    for model in models:
        version = fake_version(work / f"{model}-{os.getpid()}", recipe, model)
        if int(big):
            with open(version / "variables" / "big.bin", "wb") as out:
                out.truncate(int(big))
                out.seek(0)
                out.write(model.encode())
            manifest = json.loads((version / MANIFEST).read_text())
            manifest["files"]["variables/big.bin"] = hash_file(version / "variables" / "big.bin")
            (version / MANIFEST).write_bytes(manifest_bytes(manifest))
        outcome = publish_to_destination(dest, recipe, version, work)
        with open(log, "a") as out:
            out.write(json.dumps({"model": model, "number": outcome.number, "new": outcome.new}) + "\n")
            out.flush()
            os.fsync(out.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
