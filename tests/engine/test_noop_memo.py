"""The no-op memo (lock/memo.py): a build with nothing to do is proven from stats alone,
and any change to anything the full check read sends the build down the full path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.cli import REPO, tpubuild
from tests.engine.conftest import build_json

PROBE = """
import contextlib, io, sys
from tpubuild.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        main(["build", "--json"])
except SystemExit as exc:
    code = exc.code
print(code, "tpubuild.config.recipe" in sys.modules, out.getvalue().count('"cached"'))
"""


def probe(ws, **env: str) -> tuple[int, bool, int]:
    """(exit code, whether recipes were loaded, cached rows) of an in-process build."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ws, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env}, check=True).stdout.split()
    return int(out[0]), out[1] == "True", int(out[2])


@pytest.mark.slow
def test_memo_proves_a_noop_and_any_change_takes_the_full_path(built_workspace):
    ws = built_workspace
    time.sleep(2.1)  # the memo remembers only files older than the build that checks them
    build_json(ws)  # the full check, which writes the memo
    assert (ws / ".tpubuild" / "noop-memo").is_file()
    assert probe(ws) == (0, False, 16)  # 3 recipes, every stage cached, no recipe loaded
    # A comment-only edit: the full path runs (the recipe is loaded) and finds nothing to do.
    recipe = ws / "recipes" / "toy.yaml"
    recipe.write_text(recipe.read_text() + "# a comment\n")
    assert probe(ws) == (0, True, 16)
    # A model file rewritten with its mtime put back: only its ctime tells, and the memo
    # reads it (the full path then finds the content unchanged).
    time.sleep(2.1)
    build_json(ws)
    assert probe(ws)[1] is False
    variables = ws / "recipes" / "models" / "tiny" / "variables" / "variables.data-00000-of-00001"
    st = variables.stat()
    variables.write_bytes(variables.read_bytes())
    os.utime(variables, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert probe(ws) == (0, True, 16)
    # An allow-listed environment variable is in the guard: the full path decides (and
    # with a new key for every TensorFlow stage, it would rebuild them).
    time.sleep(2.1)
    build_json(ws)
    assert probe(ws)[1] is False
    dry = tpubuild(ws, "build", "--dry-run", "--json", env={"TF_ENABLE_ONEDNN_OPTS": "0"}, code=0)
    assert "pending" in {row["status"] for row in json.loads(dry.stdout)["rows"]}
    code, loaded, _ = probe(ws, TF_ENABLE_ONEDNN_OPTS="0")
    assert (code, loaded) == (0, True)
