"""A launcher that runs containers on several nodes refuses, at submit, a STATE_DIR that a
replacement on another node could not reach; a shared store or a declared shared folder
is taken."""

from __future__ import annotations

import pytest

from tests.master.fakes import ManualClock, chain_descriptor
from weir.master.core import MasterCore
from weir.master.errors import FailedPrecondition, InvalidArgument
from weir.master.launcher import RecordingLauncher
from weir.master.state_location import unshared_state_problem


@pytest.mark.parametrize("attributes", [
    {"STATE_DIR": "s3://bucket/weir"}, {"STATE_DIR": "gs://bucket/weir"},
    {"STATE_DIR": "hdfs://namenode:8020/weir"},
    {"STATE_DIR": "/mnt/nfs/weir", "STATE_DIR_SHARED": True},
    {"STATE_DIR": "file:///mnt/nfs/weir", "STATE_DIR_SHARED": True}])
def test_a_shared_store_or_a_declared_shared_folder_is_taken(attributes):
    assert unshared_state_problem(attributes, "Ray") is None


@pytest.mark.parametrize(("attributes", "said"), [
    ({}, "STATE_DIR is not set (a temporary folder on each node)"),
    ({"STATE_DIR_SHARED": True}, "STATE_DIR is not set"),
    ({"STATE_DIR": "/var/lib/weir"}, "STATE_DIR='/var/lib/weir' is a folder of each node"),
    ({"STATE_DIR": "mem://x", "STATE_DIR_SHARED": True}, "not a store Weir knows to be shared")])
def test_anything_else_is_refused_naming_what_to_set(attributes, said):
    problem = unshared_state_problem(attributes, "Kubernetes")
    assert problem is not None and said in problem
    assert "the Kubernetes launcher runs containers on several nodes" in problem
    assert "STATE_DIR_SHARED=true" in problem and "docs/operations/several-hosts.md" in problem


class SeveralHosts(RecordingLauncher):
    spans_hosts = True


def test_a_master_whose_launcher_spans_hosts_refuses_it_at_submit_and_plans_nothing():
    core = MasterCore(SeveralHosts(), clock=ManualClock())
    with pytest.raises((FailedPrecondition, InvalidArgument),
                       match="STATE_DIR is not set .* several nodes"):
        core.submit(chain_descriptor(2), {})
    assert core.list_applications() == []
    app_id = core.submit(chain_descriptor(2, STATE_DIR="/mnt/nfs/weir", STATE_DIR_SHARED="true"),
                         {})
    assert core.application(app_id).state.value in ("ACCEPTED", "RUNNING")


def test_a_master_on_one_machine_takes_any_state_folder():
    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    assert core.submit(chain_descriptor(2), {})
