"""The master's young collections run on a clock: at a steady load the young generation's
count hardly grows, and without them every survivor piles up for one long walk."""

from __future__ import annotations

import gc

import pytest

from tests.harness import poll_for
from weir.master.gc_pacing import YoungCollections

pytestmark = pytest.mark.timeout(30)


def test_young_collections_run_by_the_clock_and_stop():
    gc.disable()  # no collection by count: only the pacer's
    try:
        kept = [tuple([i, i + 1]) for i in range(20_000)]  # survivors, as a stats ring's
        assert all(gc.is_tracked(point) for point in kept)
        pacer = YoungCollections(interval_s=0.01).start()
        poll_for(lambda: pacer.collections >= 3, 10, "three young collections")
        assert not any(gc.is_tracked(point) for point in kept)  # walked once, then untracked
        pacer.stop()
        stopped_at = pacer.collections
        assert not pacer._thread.is_alive()
        assert pacer.collections == stopped_at
    finally:
        gc.enable()
