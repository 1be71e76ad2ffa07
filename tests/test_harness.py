"""The tests' own waiting: a deadline given for an idle machine stretches with the load,
so the suite passes on a machine that shares its cores (issue 54)."""

from __future__ import annotations

import pytest

from tests import harness


def test_a_wait_is_stretched_by_the_machines_load(monkeypatch):
    calls = []

    def ready_on_the_sixth_look() -> bool:
        calls.append(1)
        return len(calls) >= 6

    monkeypatch.setattr(harness, "load_stretch", lambda: 1.0)
    with pytest.raises(AssertionError, match=r"timed out after 0.1 s waiting for x$"):
        harness.poll_for(ready_on_the_sixth_look, 0.1, "x", interval_s=0.05)
    calls.clear()
    monkeypatch.setattr(harness, "load_stretch", lambda: 100.0)  # 10 s to wait
    assert harness.poll_for(ready_on_the_sixth_look, 0.1, "x", interval_s=0.05)
    monkeypatch.setattr(harness, "load_stretch", lambda: 2.0)
    with pytest.raises(AssertionError, match=r"after 0 s \(0 s on this busy machine\)"):
        harness.poll_for(lambda: False, 0, "x")
