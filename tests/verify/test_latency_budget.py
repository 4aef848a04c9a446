"""verify/latency.py: a latency figure stops taking calls once its budget is spent, so a
large model's verification does not spend a minute timing one call 200 times."""

from __future__ import annotations

import time

from tpubuild.verify import latency


def _counting(seconds: float) -> tuple[list[int], object]:
    count = [0]

    def call() -> None:
        count[0] += 1
        time.sleep(seconds)

    return count, call


def test_a_slow_call_is_timed_until_the_budget_is_spent(monkeypatch):
    monkeypatch.setattr(latency, "BUDGET_SECONDS", 0.2)
    count, call = _counting(0.02)
    median = latency.median_call_seconds(call, calls=1000)
    timed = count[0] - latency.WARMUP_CALLS
    # time.sleep never returns early, so 10 calls always reach 0.2 s; the 5-call minimum holds.
    assert latency.MIN_CALLS <= timed <= 10
    assert median >= 0.02


def test_a_call_longer_than_the_budget_still_takes_the_minimum(monkeypatch):
    monkeypatch.setattr(latency, "BUDGET_SECONDS", 0.01)
    count, call = _counting(0.02)
    latency.median_call_seconds(call, calls=1000)
    assert count[0] - latency.WARMUP_CALLS == latency.MIN_CALLS


def test_a_fast_call_takes_every_call_asked_for():
    count, call = _counting(0)
    latency.median_call_seconds(call, calls=50)
    assert count[0] - latency.WARMUP_CALLS == 50
