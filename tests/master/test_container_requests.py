"""What a container asks its cluster manager for (CONTAINER_MEMORY_MB, CONTAINER_CORES):
handed to the launcher with every launch, refused at submit when no node could meet it,
and a container waiting for room shown as such instead of being given up on."""

from __future__ import annotations

import os

import psutil
import pytest

from tests.master.fakes import ManualClock, chain_descriptor
from tests.master.test_heartbeat import make_app
from weir.master.core import MasterCore
from weir.master.errors import InvalidArgument
from weir.master.launcher import RecordingLauncher, Resources, UnplaceableRequest
from weir.master.liveness import check_liveness
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.physical_plan import ContainerState

pytestmark = pytest.mark.timeout(30)


def test_every_launch_carries_the_applications_request():
    launcher = RecordingLauncher()
    core = MasterCore(launcher, clock=ManualClock())
    app_id = core.submit(chain_descriptor(3), {"CONTAINER_MEMORY_MB": "1536",
                                               "CONTAINER_CORES": "0.5"})
    assert launcher.launched and set(launcher.requests) == set(launcher.launched)
    assert set(launcher.requests.values()) == {Resources(memory_mb=1536, cores=0.5)}
    core.kill_application(app_id, "done")


def test_no_request_is_the_default():
    launcher = RecordingLauncher()
    core = MasterCore(launcher, clock=ManualClock())
    core.submit(chain_descriptor(2), {})
    assert set(launcher.requests.values()) == {Resources(memory_mb=0, cores=0.0)}


@pytest.mark.parametrize(("name", "value"), [("CONTAINER_MEMORY_MB", "-1"),
                                             ("CONTAINER_CORES", "nan"),
                                             ("CONTAINER_CORES", "2000")])
def test_a_request_that_is_no_request_is_refused_at_submit(name, value):
    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    with pytest.raises(InvalidArgument, match=name):
        core.submit(chain_descriptor(2), {name: value})


def test_the_local_launcher_refuses_more_than_this_machine_at_submit(tmp_path):
    launcher = LocalProcessLauncher("127.0.0.1:1", log_dir=tmp_path / "logs")
    core = MasterCore(launcher, clock=ManualClock())
    too_much = (psutil.virtual_memory().total >> 20) + 1
    with pytest.raises(InvalidArgument, match="CONTAINER_MEMORY_MB=.*this machine's memory"):
        core.submit(chain_descriptor(2), {"CONTAINER_MEMORY_MB": str(too_much)})
    with pytest.raises(InvalidArgument, match="CONTAINER_CORES=.*cores"):
        core.submit(chain_descriptor(2), {"CONTAINER_CORES": str((os.cpu_count() or 1) + 1)})
    assert core.list_applications() == []  # nothing planned, nothing launched
    assert not list((tmp_path / "logs").iterdir())
    with pytest.raises(UnplaceableRequest):  # and a launch asked directly, too
        launcher.launch("c0", Resources(memory_mb=too_much))
    launcher.check_request(Resources(memory_mb=64, cores=1))  # what fits is fine


def test_a_container_waiting_for_room_is_shown_and_not_given_up_on():
    clock = ManualClock()
    app = make_app(clock, HEARTBEAT_TIMEOUT_MILLIS="1000")
    reason = "0/3 nodes are available: 3 Insufficient memory."
    waiting = {"app-0001-c1": reason}
    for _ in range(5):  # 5 s: far past twice the heartbeat timeout
        clock.advance(1000)
        losses = check_liveness(app, clock(), {}, 60_000, waiting)
        assert "app-0001-c1" not in [loss.container_id for loss in losses]
    c1 = app.plan.containers["app-0001-c1"]
    assert c1.state == ContainerState.ALLOCATED
    assert c1.diagnostics == f"waiting to be placed: {reason}"
    # placed now: the reason goes, and it has twice the timeout from here to call in
    clock.advance(1500)
    assert check_liveness(app, clock(), {}, 60_000, {}) == []
    assert c1.diagnostics == ""
    clock.advance(1000)
    [loss] = check_liveness(app, clock(), {}, 60_000, {})
    assert loss.container_id == "app-0001-c1" and "never sent a heartbeat" in loss.cause
