"""Runs the real `tpubuild` CLI in a real process for the engine tests.

While the `report` stage is being written (another part of the project), the engine
tests can point its registry entry at `report_stand_in.py` (this directory) with
TPUBUILD_TEST_REPORT_STAND_IN=1, in the test's process only; the production registry
is untouched.
"""

from __future__ import annotations

import dataclasses
import os
import sys

if os.environ.get("TPUBUILD_TEST_REPORT_STAND_IN") == "1":
    from tpubuild import pipeline

    pipeline.STAGES["report"] = dataclasses.replace(
        pipeline.STAGES["report"], entry="tests.engine.report_stand_in:run"
    )

from tpubuild.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "tpubuild"
    main()
