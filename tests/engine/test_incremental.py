"""Rebuilds by content: option edits, comment edits, touches, early cutoff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tensorflow as tf

from tests.engine.conftest import build_json, export_recipe, source_recipe, statuses
from tests.tolerances import FLOAT32_REORDERED, assert_close


def serve(version_dir: Path, x):
    loaded = tf.saved_model.load(str(version_dir))
    return loaded.signatures["serving_default"](x=tf.constant(x))["y"].numpy().tolist()


def test_first_build_publishes_then_everything_is_cached(built_once, built_workspace):
    ws0, first = built_once
    # `other` (built first) snapshots the shared model into the store; `toy` finds it there.
    assert statuses(first, "other")["source"] == "built"
    assert statuses(first, "toy") == {
        "source": "cached", "batch": "built", "verify": "built", "warmup": "built", "report": "built",
        "publish": "built",
    }
    assert statuses(first, "cut") == {"export": "built", "verify": "built", "report": "built", "publish": "built"}
    assert first["versions"] == {"cut": 1, "other": 1, "toy": 1}
    # Each stage a worker ran says its own peak RSS (a worker imports TensorFlow: well over
    # 100 MiB); the source snapshot and publish run in the CLI and say none.
    peaks = {(r["recipe"], r["stage"]): r["peak_rss_bytes"] for r in first["rows"]}
    assert all(peaks[("toy", stage)] > 100 * 2**20 for stage in ("batch", "verify", "report")), peaks
    assert peaks[("toy", "publish")] is None and peaks[("other", "source")] is None
    # A served float32 result (a batched one here): compared within ulps, never bit-exact.
    assert_close(serve(ws0 / "out" / "toy" / "1", [[1.0, 1.0], [2.0, 0.5]]), [[3.0], [3.0]], FLOAT32_REORDERED)
    second = build_json(built_workspace)
    assert {row["status"] for row in second["rows"]} == {"cached"}
    assert {row["peak_rss_bytes"] for row in second["rows"]} == {None}
    assert second["versions"] == {"cut": 1, "other": 1, "toy": 1}
    assert sorted(os.listdir(built_workspace / "out" / "toy")) == ["1"]
    assert [(r["recipe"], r["stage"], r["key"]) for r in second["rows"]] == [
        (r["recipe"], r["stage"], r["key"]) for r in first["rows"]
    ]


def test_option_edit_reruns_that_stage_and_later_ones(built_workspace):
    ws = built_workspace
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", samples=5))
    doc = build_json(ws, "toy", "other")
    # The warmup requests are filled from verify's samples: they rerun too.
    assert statuses(doc, "toy") == {
        "source": "cached", "batch": "cached", "verify": "built", "warmup": "built", "report": "built",
        "publish": "built",
    }
    assert set(statuses(doc, "other").values()) == {"cached"}
    # The same model (its warmup requests come from the first samples, the same ones):
    # version 1 is updated in place, no new version (issue 38 item 3).
    assert doc["versions"] == {"toy": 1, "other": 1}
    (ws / "recipes" / "toy.yaml").write_text(source_recipe("toy", timeout=200, samples=5))
    doc = build_json(ws, "toy")
    assert statuses(doc, "toy") == {
        "source": "cached", "batch": "built", "verify": "built", "warmup": "built", "report": "built",
        "publish": "built",
    }
    assert doc["versions"] == {"toy": 2}
    assert sorted(os.listdir(ws / "out" / "toy")) == ["1", "2"]  # keep_versions: 2
    assert_close(serve(ws / "out" / "toy" / "2", [[1.0, 1.0]]), [[3.0]], FLOAT32_REORDERED)  # float32: within ulps


def test_comment_edit_and_key_order_rerun_nothing(built_workspace):
    ws = built_workspace
    lines = source_recipe("toy", comment="a new comment").splitlines()
    # `verify:` moved above `name:`: the same mapping in another order.
    (ws / "recipes" / "toy.yaml").write_text("\n".join([lines[0], lines[-1], *lines[1:-1]]) + "\n")
    doc = build_json(ws, "toy")
    assert set(statuses(doc, "toy").values()) == {"cached"}
    assert doc["versions"] == {"toy": 1}


def test_touch_without_change_rehashes_once_then_nothing(built_workspace):
    ws = built_workspace
    build_json(ws, "toy")  # this copy's inodes are new: fill its stat cache
    variables = ws / "recipes" / "models" / "tiny" / "variables" / "variables.data-00000-of-00001"
    os.utime(variables)
    first = build_json(ws, "toy")
    assert set(statuses(first, "toy").values()) == {"cached"}
    assert first["hashed"] == {"files": 1, "bytes": variables.stat().st_size}
    assert build_json(ws, "toy")["hashed"] == {"files": 0, "bytes": 0}


def test_early_cutoff_when_a_stage_output_is_unchanged(built_workspace):
    ws = built_workspace
    (ws / "recipes" / "models" / "notes.py").write_text('# notes, edited: the output stays the same\nNOTE = "first"\n')
    doc = build_json(ws, "cut")
    assert statuses(doc, "cut") == {"export": "built", "verify": "cached", "report": "cached", "publish": "cached"}
    assert doc["versions"] == {"cut": 1}


@pytest.mark.slow
def test_export_script_and_its_deps_are_inputs(make_workspace):
    ws = make_workspace({"exp": export_recipe("exp")})
    build_json(ws)
    # Served float32 results: within ulps, never bit-exact (tests/tolerances.py).
    assert_close(serve(ws / "out" / "exp" / "1", [[1.0, 1.0]]), [[3.0]], FLOAT32_REORDERED)
    (ws / "recipes" / "models" / "helper.py").write_text("SCALE = 3.0\n")
    doc = build_json(ws)
    assert statuses(doc, "exp") == {"export": "built", "verify": "built", "report": "built", "publish": "built"}
    assert doc["versions"] == {"exp": 2}
    assert_close(serve(ws / "out" / "exp" / "2", [[1.0, 1.0]]), [[4.0]], FLOAT32_REORDERED)
