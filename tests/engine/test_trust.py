"""Issue 32: a shared cache no co-user can poison, objects that are regular files, version
numbers never reused, the layout validated, version names, provenance for standard tools."""

from __future__ import annotations

import json

from tests.engine.conftest import build_json, tpubuild


def test_only_ascii_digit_directories_are_versions(built_workspace):
    # `²` and `١` pass str.isdigit(); int() refuses the first and reads the second as 1.
    # Both are the user's directories: left alone, never a version, never a crash.
    ws = built_workspace
    for name in ("²", "١", "01"):
        (ws / "out" / "toy" / name).mkdir()
    (ws / "out" / "toy" / "١" / "keep.txt").write_text("mine")
    result = tpubuild(ws, "build", "--check")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = build_json(ws, "toy")
    assert [r["status"] for r in document["rows"] if r["stage"] == "publish"] == ["cached"]
    (ws / "recipes" / "toy.yaml").write_text((ws / "recipes" / "toy.yaml").read_text().replace("samples: 4", "samples: 3"))
    build_json(ws, "toy")
    assert {p.name for p in (ws / "out" / "toy").iterdir() if not p.name.startswith(".")} == \
        {"01", "1", "2", "١", "²"}
    assert (ws / "out" / "toy" / "١" / "keep.txt").read_text() == "mine"
    result = tpubuild(ws, "clean", "toy")
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (ws / "out" / "toy").iterdir()} == {"01", "١", "²"}
