"""Issue 41's acceptance, against a real S3-protocol server (moto's, on 127.0.0.1) and a
file:// mount in tmp_path: while two CI jobs publish 20 versions of one recipe at once
(tests/remote/publish_job.py, through the publish module), one of them killed (SIGKILL) at
random points and started again, a poller lists the destination as fast as it can and
never sees `<N>/saved_model.pb` while another file of `<N>` is missing or short; version
numbers are unique and increase in each job; what the killed job left is completed or
removed by the next publish; an unchanged model publishes nothing."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import blake3
import pytest

from tests.cli import REPO
from tests.remote.places import Place, file_place, s3_place

RECIPE = "toy"
KILLS = 8
# How long after a job is ready it may be killed: about one publish of its tiny version.
SPAN = {"s3": 1.5, "file": 0.3}


class Poller(threading.Thread):
    """Lists the destination in a loop; for each `<N>/saved_model.pb` a listing shows,
    every file `<N>`'s manifest lists must be in that same listing, and read back whole
    (the size listed, the BLAKE3 the manifest says)."""

    def __init__(self, listing: Callable[[], dict[str, int]], read: Callable[[str], bytes]):
        super().__init__(daemon=True)
        self.listing, self.read = listing, read
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.polls = 0
        self.failed_polls = 0
        self.staging_seen = 0  # listings taken while some version was being uploaded
        self.partial_seen = 0  # listings with a numbered directory lacking its saved_model.pb
        self.checked: set[int] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                listed = self.listing()
            except Exception:  # noqa: BLE001 - a listing racing a write may fail; the next one counts
                self.failed_polls += 1
                continue
            self.polls += 1
            if any(f"{RECIPE}/.tpubuild/staging/" in rel for rel in listed):
                self.staging_seen += 1
            numbers = {int(m.group(1)) for rel in listed if (m := re.match(rf"{RECIPE}/(\d+)/", rel))}
            if any(f"{RECIPE}/{n}/saved_model.pb" not in listed for n in numbers):
                self.partial_seen += 1
            for number in sorted(numbers):
                if f"{RECIPE}/{number}/saved_model.pb" in listed and number not in self.checked:
                    self.check(number, listed)

    def check(self, number: int, listed: dict[str, int]) -> None:
        prefix = f"{RECIPE}/{number}/"
        if prefix + "tpubuild-manifest.json" not in listed:
            self.violations.append(f"{prefix}saved_model.pb listed without its tpubuild-manifest.json")
            return
        manifest = json.loads(self.read(prefix + "tpubuild-manifest.json"))
        for rel, digest in sorted(manifest["files"].items()):
            if prefix + rel not in listed:
                self.violations.append(f"{prefix}saved_model.pb listed while {prefix}{rel} is missing")
                continue
            data = self.read(prefix + rel)
            if len(data) != listed[prefix + rel] or blake3.blake3(data).hexdigest() != digest:
                self.violations.append(f"{prefix}{rel} is short or other bytes while saved_model.pb is listed")
        self.checked.add(number)


def _side(place: Place) -> tuple[str, Callable[[], dict[str, int]], Callable[[str], bytes], dict]:
    return place.url, place.listing, place.read, place.env


def _job(url: str, work: Path, log: Path, models: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.remote.publish_job", url, RECIPE, str(work), str(log), *models],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _logged(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("where", ["s3", "file"])
def test_a_poller_never_sees_a_partial_version_while_two_jobs_publish_and_one_is_killed(where, s3, tmp_path,
                                                                                       monkeypatch):
    from tpubuild.publish import Destination, publish_version
    from tpubuild.publish.dest_state import SEALED, STAGING

    url, listing, read, env = _side(s3_place(s3, f"races-{os.getpid()}") if where == "s3"
                                    else file_place(tmp_path / "mount"))
    for name, value in env.items():  # this process publishes too, at the end
        monkeypatch.setenv(name, value)
    rng = random.Random(41)
    steady = [f"a{i}" for i in range(10)]
    killed = [f"b{i}" for i in range(10)]
    poller = Poller(listing, read)
    poller.start()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    job_a = _job(url, tmp_path / "a", log_a, steady, env)
    kills = 0
    while True:
        left = [m for m in killed if m not in {e["model"] for e in _logged(log_b)}]
        if not left:
            break
        job_b = _job(url, tmp_path / "b", log_b, left, env)
        assert job_b.stdout.readline() == "ready\n", job_b.stderr.read()
        if kills < KILLS:
            time.sleep(rng.uniform(0.0, SPAN[where]))  # in a publish: upload, read back, seal, copies, cleanup
            job_b.send_signal(signal.SIGKILL)
            job_b.wait()
            kills += 1
            continue
        out, err = job_b.communicate(timeout=300)
        assert job_b.returncode == 0, err
    out, err = job_a.communicate(timeout=300)
    assert job_a.returncode == 0, err
    # The next publish finishes a sealed version the last kill left, removes an unsealed staging.
    dest = Destination(url)
    dest.mend(dest.survey(RECIPE), say=print)
    time.sleep(0.2)
    poller.stop.set()
    poller.join(timeout=30)

    print("STATS", where, poller.polls, poller.failed_polls, poller.staging_seen, poller.partial_seen, len(poller.checked))
    assert poller.violations == []
    assert poller.polls >= 50 and poller.staging_seen >= 1  # it looked while versions were uploading
    assert len(poller.checked) >= 15  # and checked (nearly) every version, each in a listing showing it whole
    a, b = _logged(log_a), _logged(log_b)
    assert [e["model"] for e in a] == steady and {e["model"] for e in b} == set(killed)
    new = [e["number"] for e in a + b if e["new"]]
    assert len(new) == len(set(new))  # no two publishes got one number
    for entries in (a, b):
        numbers = [e["number"] for e in entries if e["new"]]
        assert numbers == sorted(numbers)  # each job's numbers increase
    survey = dest.survey(RECIPE)
    assert not survey.staged and not survey.sealed  # nothing of the killed job is left in staging
    complete = survey.complete_numbers()
    print("CLAIMS", sorted(survey.claims), "COMPLETE", complete, "NEW", sorted(new), [e["seconds"] for e in a], [e["mended"] for e in a + b if e["mended"]])
    assert set(new) <= set(complete)
    assert set(survey.claims) >= set(complete)  # every version has its claim; killed claims stay used
    models = {}
    for number in complete:  # every visible version is whole and is one of the 20 models
        manifest = json.loads(read(f"{RECIPE}/{number}/tpubuild-manifest.json"))
        assert manifest["version"] == number
        assert manifest["model"] in {f"model-{m}" for m in steady + killed}
        for rel, digest in manifest["files"].items():
            assert blake3.blake3(read(f"{RECIPE}/{number}/{rel}")).hexdigest() == digest
        models[number] = manifest["model"]
    assert set(models.values()) == {f"model-{m}" for m in steady + killed}
    # An unchanged model publishes nothing: the newest version's model again.
    from tests.remote.publish_job import fake_version

    newest = complete[-1]
    again = publish_version(dest, RECIPE, fake_version(tmp_path / "again", RECIPE, models[newest][len("model-"):]),
                            tmp_path)
    assert (again.number, again.new) == (newest, False)
    assert dest.survey(RECIPE).claims.keys() == survey.claims.keys()  # and claimed no number
    left = [rel for rel in listing() if rel.startswith(f"{RECIPE}/{STAGING}") or rel.startswith(f"{RECIPE}/{SEALED}")]
    assert left == []
