"""Bounded resources: batch sizes the runtime can serve, and a worker memory limit that
turns a runaway allocation into one line naming the stage."""

from __future__ import annotations

import json

from tests.cli import tpubuild
from tests.engine.conftest import export_recipe, source_recipe, statuses

# Address space, not memory: an untouched 6 GiB array costs nothing without a limit.
GREEDY = "import numpy\n\n\ndef export(output_dir):\n    numpy.empty(6 << 30, dtype=numpy.uint8)\n"


def test_batch_sizes_beyond_what_the_runtime_serves_fail_validate(make_workspace):
    text = source_recipe("toy").replace("max_batch_size: 4", "max_batch_size: 2147483647") \
        .replace("allowed_batch_sizes: [2, 4]", "allowed_batch_sizes: [2, 2147483647]") \
        .replace("num_batch_threads: 1", "num_batch_threads: 100000")
    ws = make_workspace({"toy": text})
    result = tpubuild(ws, "validate")
    assert result.returncode == 2
    rows = "(TensorFlow's BatchFunction pads every batch to its size in host memory)"
    assert result.stderr.splitlines() == [
        "recipes/toy.yaml:6:26: converter.batch_options[0].num_batch_threads: must be at most 1024 threads, got 100000 "
        "(TensorFlow's BatchFunction starts one thread each)",
        f"recipes/toy.yaml:7:23: converter.batch_options[0].max_batch_size: must be at most 65536 rows, "
        f"got 2147483647 {rows}",
        f"recipes/toy.yaml:9:32: converter.batch_options[0].allowed_batch_sizes[1]: must be at most 65536 rows, "
        f"got 2147483647 {rows}",
    ]
    (ws / "recipes" / "toy.yaml").write_text(text.replace("2147483647", "65536").replace("100000", "1024"))
    assert tpubuild(ws, "validate").returncode == 0


def test_a_stage_past_the_worker_memory_limit_fails_in_one_line(make_workspace):
    ws = make_workspace({"greedy": export_recipe("greedy", "models/greedy.py", "models/helper.py")})
    (ws / "recipes" / "models" / "greedy.py").write_text(GREEDY)
    with open(ws / "tpubuild.yaml", "a") as f:
        f.write("worker_memory_limit: 4GiB\n")
    result = tpubuild(ws, "build", "--json")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "greedy.yaml" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("recipes/greedy.yaml: stage export: out of memory: the stage needed more than the "
                                "worker memory limit (4 GiB, worker_memory_limit in tpubuild.yaml): "), errors
    assert "Traceback" not in result.stderr
    assert statuses(json.loads(result.stdout), "greedy")["export"] == "failed"
    # Without the limit the same stage maps its 6 GiB (never touched) and goes on.
    (ws / "tpubuild.yaml").write_text((ws / "tpubuild.yaml").read_text().replace("worker_memory_limit: 4GiB\n", ""))
    result = tpubuild(ws, "build", "--json")
    assert "out of memory" not in result.stderr
