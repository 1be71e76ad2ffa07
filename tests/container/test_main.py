"""The container's entry point: how long it waits for a master that went away."""

from __future__ import annotations

from container.main import master_retry_window_s


def test_a_container_outlasts_a_slow_master_restart():
    # the heartbeat timeout used to decide alone: 10 s by default, 3 s in tests, while
    # the README promises that containers retry a restarting master for 30 s
    assert master_retry_window_s({}) == 30.0
    assert master_retry_window_s({"HEARTBEAT_TIMEOUT_MILLIS": "3000"}) == 30.0
    assert master_retry_window_s({"HEARTBEAT_TIMEOUT_MILLIS": "60000"}) == 60.0
