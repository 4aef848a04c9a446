"""The points of a recipe's charts (report/history_points.py): every version and every build
that published nothing, in build order; numbers missing below the oldest version are
pruned, above it reserved and marked; data of the wrong shape is no figure, not a crash."""

from __future__ import annotations

from tpubuild.report.history_points import points


def manifest(created: str, artifact: int) -> dict:
    return {"recipe": "r", "created": created,
            "report": {"size": {"artifact": artifact, "source": 10}, "max_abs_error": 0.5, "parameters": {"int8": 3}}}


def test_every_build_is_a_point_and_the_unpublished_are_marked() -> None:
    versions = {3: manifest("2026-01-03T00:00:00Z", 30), 4: manifest("2026-01-05T00:00:00Z", 40),
                6: manifest("2026-01-08T00:00:00Z", 60)}
    attempts = [
        {"outcome": "published", "version": 2, "finished": "2026-01-02T00:00:00Z",
         "report": {"size": {"artifact": 20}}},  # pruned since: its figures from the record
        {"outcome": "failed", "version": None, "finished": "2026-01-04T00:00:00Z", "failed_stage": "verify",
         "failed_figures": {"verify": {"max_abs_error": 9.0, "passed": False,
                                       "outputs": [{"argmax_agreement": 0.5}, {"argmax_agreement": None}]}}},
    ]
    found = points(versions, attempts, reserved=7)
    assert [(p["label"], p["status"], p["marked"]) for p in found] == [
        ("v1", "gone", False), ("v2", "pruned", False), ("v3", "published", False), ("✗1", "failed", True),
        ("v4", "published", False), ("v5", "reserved", True), ("v6", "published", False), ("v7", "reserved", True)]
    assert [p["size"] for p in found] == [None, 20, 30, None, 40, None, 60, None]
    failed = found[3]
    assert (failed["max_abs_error"], failed["argmax_agreement"], failed["verified"]) == (9.0, 0.5, False)
    assert failed["status_text"] == "build failed: not published (stage verify failed)"
    assert found[0]["axis"] == "v1\n" and found[2]["axis"] == "v3\n01-03 00:00"


def test_data_of_the_wrong_shape_is_no_figure() -> None:
    odd = {"recipe": "r", "created": 5, "report": {"size": [1], "cost": {"total": "many"}, "parameters": {"f32": True},
                                                   "max_abs_error": None},
           "targets": {"litert": {"verify": {"latency": {"call_seconds": {"litert": {"a": 0.1, "b": "x"}}}}}, "x": 3}}
    attempts = [{"outcome": "failed", "failed_figures": {"verify": {"outputs": "no"}}}, "not a record"]
    found = {p["label"]: p for p in points({1: odd}, [a for a in attempts if isinstance(a, dict)])}
    version = found["v1"]
    assert version["size"] is None and version["cost_total"] is None and version["params"] == {}
    assert version["latency"] == {"litert": 0.1} and version["date"] is None
    assert found["✗1"]["status"] == "failed" and found["✗1"]["max_abs_error"] is None
