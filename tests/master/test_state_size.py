"""An operator's state size as the master shows it: the size of its last checkpoint, per
partition and added up per logical operator, in ``weir stats`` and Prometheus."""

from __future__ import annotations

import pickle

import pytest
from prometheus_client import generate_latest

from tests.master.fakes import (
    ManualClock,
    container_heartbeat,
    operator_report,
    partitioned_dag,
    window,
)
from tests.master.test_metrics import samples, value
from weir.master.checkpoints import CheckpointBook
from weir.master.core import MasterCore
from weir.master.launcher import RecordingLauncher
from weir.master.metrics import master_registry
from weir.master.tables import operator_details
from weir.operators.windows import make_window_id
from weir.proto import client_pb2

pytestmark = pytest.mark.timeout(30)

T = 1_700_000_000_000
SIZES = {"source": 1_000, "relay#0": 3 * 2**20, "relay#1": 2**20}


def checkpointed_core() -> tuple[MasterCore, str]:
    """source -> relay (two partitions) -> sink; each reports two checkpoints, the last of
    the size in ``SIZES`` (the first twice as large: only the last counts)."""
    clock = ManualClock(T)
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=clock)
    app_id = core.submit(partitioned_dag("sized").to_descriptor(), {})
    cid = f"{app_id}-c0"
    core.heartbeat(container_heartbeat(cid, port=7000))
    start = core.application_info(app_id).start_window_millis
    clock.advance(5_000)
    reports = []
    for op in core.list_operators(app_id):
        size = SIZES.get(op.name, 0)
        windows = [window(w := make_window_id(start // 1000, i), end_ms=start + 500 * (i + 1),
                          in_port=None if op.name == "source" else "input",
                          out_port=None if op.name == "sink" else "output",
                          checkpoint=w, checkpoint_bytes=size * (2 - i // 3))
                   for i in (1, 3)]
        reports.append(operator_report(op.id, windows=windows))
    core.heartbeat(container_heartbeat(cid, port=7000, operators=reports))
    return core, app_id


def test_each_partition_shows_its_last_checkpoint_size_and_the_logical_the_sum():
    core, app_id = checkpointed_core()
    ops = {op.name: op for op in core.list_operators(app_id)}
    assert {name: ops[name].checkpoint_bytes for name in SIZES} == SIZES
    assert ops["sink"].checkpoint_bytes == 0
    logical = {op.name: op for op in core.application_info(app_id).logical_operators}
    assert logical["relay"].checkpoint_bytes == 4 * 2**20


def test_weir_stats_and_prometheus_show_it():
    core, app_id = checkpointed_core()
    text = operator_details(core.operator_info(app_id, "relay#0"), now_ms=T)
    assert "state:             3.0 MB (its last checkpoint)\n" in text
    assert "state:             -\n" in operator_details(client_pb2.OperatorInfo(name="x"), 0)
    found = samples(generate_latest(master_registry(core)).decode())
    assert value(found, "weir_operator_checkpoint_bytes", operator="relay#1") == 2**20


def test_a_book_journaled_before_sizes_has_none():
    book = CheckpointBook()
    state = book.__dict__.copy()
    del state["last_bytes"]
    old = CheckpointBook.__new__(CheckpointBook)
    old.__dict__.update(state)
    assert old.last_bytes == 0
    assert pickle.loads(pickle.dumps(book)).last_bytes == 0
