"""The control-plane row, small: played containers against a real master, and against a
dispatcher whose applications each have a master process of their own (their
containers heartbeat to it, and the figures count every master process)."""

from __future__ import annotations

import pytest

from bench import control_plane

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("application_masters", [False, True])
def test_played_containers_are_deployed_and_kept_by_the_master(application_masters):
    figures = control_plane.run(containers=4, operators_per_container=2, duration_s=4.0,
                                warmup_s=1.0, containers_per_app=2,
                                application_masters=application_masters)
    assert figures["applications"] == 2 and figures["containers_listed"] == 4
    assert figures["containers_deployed"] == 4 and figures["operators_reported"] == 8
    assert figures["false_losses"] == 0 and figures["operators_not_active"] == 0
    assert figures["heartbeats_measured"] > 0
    # one master process, or the dispatcher and one master per application
    assert figures["master_processes"] == (3 if application_masters else 1)
