"""What the next publish does with a killed job's leftovers when the job sealed after the
mender's listing: the race test (test_publish_races.py) saw it once on S3 in CI. The
mender's survey showed the staging unsealed; the job then sealed, was killed, and the
mender, taking it for gone, removed the staging under its seal: the seal was left with
nothing to complete, forever. Here the same steps run in a fixed order, on moto's S3
server and on a mount: a job in a child process claims and stages, the mender surveys,
the job seals and exits, the mender mends from its earlier survey."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli import REPO
from tests.remote.places import file_place, s3_place
from tests.remote.publish_job import fake_version

RECIPE = "toy"

# A publishing job cut in two: claim and stage, wait for a line on stdin, then seal and exit
# (before its promote: as a SIGKILL after the seal leaves it).
JOB = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tpubuild.publish import Destination
    from tpubuild.publish.to_destination import prepare_trees
    from tests.remote.publish_job import fake_version
    url, work = sys.argv[1], Path(sys.argv[2])
    dest = Destination(url)
    version = fake_version(work / "b", "toy", "b")
    import json
    manifest = json.loads((version / "tpubuild-manifest.json").read_text())
    number = dest.claim(dest.survey("toy"), 3600.0)
    trees = prepare_trees("toy", version, manifest, number, 1, work, None)
    dest.stage(trees, work, float("inf"))
    print(number, flush=True)
    sys.stdin.readline()
    dest.seal("toy", number, [t for t, _ in trees], float("inf"))
    print("sealed", flush=True)
""")


@pytest.fixture(params=["file", "s3"])
def place(request, tmp_path, monkeypatch):
    if request.param == "file":
        return file_place(tmp_path / "mount")
    s3 = request.getfixturevalue("s3")
    found = s3_place(s3, f"mend-{os.getpid()}-{request.node.name.split('[')[0][-20:]}")
    for name, value in found.env.items():
        monkeypatch.setenv(name, value)
    return found


def test_a_job_that_sealed_after_the_menders_listing_is_completed_not_stripped(place, tmp_path):
    from tpubuild.publish import Destination, publish_version

    dest = Destination(place.url)
    assert publish_version(dest, RECIPE, fake_version(tmp_path / "a", RECIPE, "a"), tmp_path).number == 1
    work = tmp_path / "job"
    work.mkdir()
    env = {**os.environ, **place.env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.Popen([sys.executable, "-c", JOB, place.url, str(work)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    number = int(job.stdout.readline() or 0)
    assert number == 2, job.stderr.read()
    mender = Destination(place.url)
    survey = mender.survey(RECIPE)
    assert number in survey.staged and number not in survey.sealed  # what the mender's listing shows
    out, err = job.communicate("seal\n", timeout=120)
    assert job.returncode == 0 and out == "sealed\n", err  # the job sealed after that listing, and is gone

    said: list[str] = []
    done = mender.mend(survey, said.append)

    assert done == [f"completed {place.url}/{RECIPE}/2 (a publish that stopped before it was)"], (done, said)
    assert place.versions() == [1, 2] and place.leftovers() == [] and place.partial() == []
    assert place.manifest(2)["model"] == "model-b"
    after = mender.survey(RECIPE)
    assert not after.staged and not after.sealed and said == []


def test_a_seal_whose_staging_is_gone_and_version_never_completed_is_removed(place, tmp_path):
    """What the race left before it was fixed: a seal with no staging and no version. It can
    never be completed; every later publish said so in a warning. Now it is removed, once,
    said, and its number stays unused. (A seal whose staging is there is left in place with a
    warning: test_destination_trust.py's test of an incomplete number on a mount.)"""
    from tpubuild.publish import Destination, publish_version

    dest = Destination(place.url)
    assert publish_version(dest, RECIPE, fake_version(tmp_path / "a", RECIPE, "a"), tmp_path).number == 1
    seal = {"recipe": RECIPE, "number": 2, "trees": [
        {"final": f"{RECIPE}/2", "staged": f"{RECIPE}/.tpubuild/staging/2/version",
         "files": {"saved_model.pb": [10, "0" * 64]}}]}
    assert dest.io.create(f"{RECIPE}/.tpubuild/claims/2", b"{}")  # its job's claim, never removed
    assert dest.io.create(f"{RECIPE}/.tpubuild/sealed/2", json.dumps(seal).encode())
    said: list[str] = []

    done = dest.mend(dest.survey(RECIPE), said.append)

    assert done == [(f"removed {place.url}/{RECIPE}/.tpubuild/sealed/2 (its staging is gone and version 2 was "
                     "never completed; number 2 stays unused)")], (done, said)
    assert place.leftovers() == [] and place.versions() == [1]
    assert publish_version(dest, RECIPE, fake_version(tmp_path / "b", RECIPE, "b"), tmp_path).number == 3
