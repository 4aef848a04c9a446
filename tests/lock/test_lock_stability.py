"""A build never dirties a clean checkout it did not change (issue 30): a lock file whose
keys match what the build resolved stays byte-identical, whatever this machine measured;
it changes when a key changes, and with `build --relock`."""

from __future__ import annotations

from tests.cli import tpubuild
from tests.engine.conftest import (
    as_another_machine_wrote_it,
    build_json,
    source_recipe,
    statuses,
)
from tpubuild.lock import MEASURED


def test_measured_lines_of_another_machine_stay_byte_identical(built_workspace):
    ws = built_workspace
    lock = ws / "recipes" / "toy.lock.yaml"
    ours = lock.read_text()
    theirs = as_another_machine_wrote_it(ours)
    assert theirs != ours and theirs.count(MEASURED) == ours.count(MEASURED)
    lock.write_text(theirs)
    # build --check's quick path pins only the keys every machine computes alike: another
    # machine's measured keys do not send it down the full path (lock/quickcheck.py).
    from tpubuild.lock import quick_check

    assert quick_check(ws, None) == 3

    # The full path (the lock file's stat changed, so the no-op memo does not answer).
    document = build_json(ws)
    assert set(statuses(document, "toy").values()) == {"cached"}
    assert lock.read_text() == theirs
    # Again, through whatever path the second build takes.
    assert set(statuses(build_json(ws), "toy").values()) == {"cached"}
    assert lock.read_text() == theirs
    # --check answers from keys: the keys match.
    check = tpubuild(ws, "build", "--check")
    assert (check.returncode, check.stdout) == (0, "3 lock files up to date\n"), check.stderr

    # --relock writes this machine's figures: the file this machine wrote in the first place.
    relock = tpubuild(ws, "build", "--relock")
    assert relock.returncode == 0, relock.stderr
    assert lock.read_text() == ours


def test_a_changed_key_rewrites_the_lock_file(built_workspace):
    ws = built_workspace
    lock = ws / "recipes" / "toy.lock.yaml"
    lock.write_text(as_another_machine_wrote_it(lock.read_text()))
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=5))
    document = build_json(ws, "toy")
    assert statuses(document, "toy")["verify"] == "built"
    text = lock.read_text()
    verify = next(row for row in document["rows"] if row["recipe"] == "toy" and row["stage"] == "verify")
    assert f"  key: {verify['key']}\n" in text
    # Rewritten in full by this machine: no line of the other machine's is left.
    fresh = tpubuild(ws, "build", "--relock", "toy")
    assert fresh.returncode == 0, fresh.stderr
    assert lock.read_text() == text
