"""What a container says costs the master a bounded amount: error reports, operator
errors and log lines are kept (and journaled, and logged) cut to ``MAX_ERROR_CHARS``."""

from __future__ import annotations

import os

import pytest

from tests.harness import master_channel
from tests.master.fakes import chain_descriptor, container_heartbeat, operator_report
from weir.master.client import WeirClient
from weir.master.launcher import RecordingLauncher
from weir.master.report_filter import MAX_ERROR_CHARS
from weir.master.server import MasterServer
from weir.proto import umbilical_pb2, umbilical_pb2_grpc

pytestmark = pytest.mark.timeout(120)

BIG = 1 << 20  # a 1 MB error text, as a stack trace of a recursion can be


def folder_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def test_large_error_reports_are_kept_cut_and_the_journal_stays_small(tmp_path):
    master = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "master",
                          loop_interval_s=0.05)
    master.start()
    channel = master_channel(master.address, master.secret)
    try:
        umbilical = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
        with WeirClient(master.address, timeout_s=30, secret=master.secret) as client:
            app_id = client.submit(chain_descriptor(1), {"CONTAINERS": "1"})
            cid = f"{app_id}-c0"
            umbilical.ProcessHeartbeat(container_heartbeat(cid), timeout=10)
            for n in range(60):
                umbilical.ReportError(umbilical_pb2.ReportErrorRequest(
                    container_id=cid, msg=f"report {n}: " + "x" * BIG + " the last line"),
                    timeout=30)
                umbilical.ProcessHeartbeat(container_heartbeat(cid), timeout=10)
            failed = operator_report(1, state=umbilical_pb2.OPERATOR_STATE_FAILED,
                                     error="Traceback " + "y" * BIG + " ValueError: bad")
            umbilical.ProcessHeartbeat(container_heartbeat(cid, operators=[failed]), timeout=10)
            failures = client.application(app_id).recent_failures
        assert failures, "the reports are shown"
        for failure in failures:
            assert len(failure.message) <= MAX_ERROR_CHARS + 200, failure.message[:100]
        reports = [f.message for f in failures if f.kind == "error"]
        assert reports[0].endswith(" the last line") and "characters cut" in reports[0]
        assert any("ValueError: bad" in f.message for f in failures if f.kind == "operator")
        assert folder_bytes(tmp_path / "master" / "journal") < 10 * BIG
    finally:
        channel.close()
        master.stop()
