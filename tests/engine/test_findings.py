"""A stage's warnings (its checks' findings) reach the published report, built or cached."""

from __future__ import annotations

import json

import numpy as np

from tests.engine.conftest import build_json, statuses

RECIPE = """\
name: few
model: {saved_model: models/tiny}
converter:
  quantization_options:
    method: STATIC_RANGE
    representative_datasets:
      serving_default: {npz: models/few.npz}
verify: {samples: 4}
"""


def test_dataset_warning_is_in_the_report(make_workspace):
    ws = make_workspace({"few": RECIPE})
    np.savez(ws / "recipes" / "models" / "few.npz", x=np.ones((5, 1, 2), np.float32))
    document = build_json(ws)
    assert statuses(document, "few")["dataset"] == "built"
    version = ws / "out" / "few" / "1"
    expected = (
        "representative_datasets.serving_default: recipes/models/few.npz: only 5 samples; "
        "the converter recommends at least 200 for calibration"
    )
    report = json.loads((version / "tpubuild-report.json").read_text())
    assert expected in json.dumps(report)
    assert f"Finding (dataset): {expected}" in (version / "tpubuild-report.md").read_text()
