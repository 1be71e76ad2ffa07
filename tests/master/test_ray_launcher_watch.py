"""The Ray launcher's watch failing (Ray unreachable) is its ``trouble``, shown on every
live container, until a wait succeeds again. A stand-in for the ``ray`` module: the
suite's own process never becomes a Ray driver (the real cluster's checks are in
``ray_launcher_checks.py``)."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from tests.harness import poll_for
from weir.master.launcher import NO_REQUEST

pytestmark = pytest.mark.timeout(30)


class _Remote:
    def remote(self) -> object:
        return object()


class _Actor:
    where = _Remote()
    wait = _Remote()


def test_a_watch_that_cannot_reach_ray_is_the_launchers_trouble_until_it_can(monkeypatch):
    reachable = threading.Event()

    def wait(refs, num_returns=1, timeout=None):
        if not reachable.is_set():
            raise ConnectionError("the GCS at 10.0.0.1:6379 does not answer")
        return [], refs

    fake = types.SimpleNamespace(is_initialized=lambda: True, wait=wait,
                                 get=lambda ref: 0)
    monkeypatch.setitem(sys.modules, "ray", fake)
    from weir.master.ray_launcher import RayLauncher, _Held

    launcher = RayLauncher("127.0.0.1:5151")
    try:
        with launcher._lock:
            launcher._held["app-0001-c1"] = _Held(_Actor(), NO_REQUEST)
        trouble = poll_for(launcher.trouble, 10, "the watch's failure")
        assert trouble.startswith("watching Ray actors fails since ")
        assert trouble.endswith("ConnectionError: the GCS at 10.0.0.1:6379 does not answer")
        reachable.set()
        poll_for(lambda: launcher.trouble() == "", 10, "the watch to recover")
    finally:
        launcher._stop.set()
        launcher._watcher.join(5)
