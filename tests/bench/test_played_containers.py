"""The control-plane bench's played containers send what a real container would."""

from __future__ import annotations

from bench.played_containers import PlayedContainer
from weir.operators.windows import window_counter
from weir.proto import plan_pb2, umbilical_pb2

_START_MS = 1_764_140_000_000


def _container(windows_per_heartbeat: int = 2, checkpoint_every: int = 4) -> PlayedContainer:
    container = PlayedContainer("app-0001-c1", 1, windows_per_heartbeat, 4_000)
    container.init(umbilical_pb2.StreamingContainerContext(
        heartbeat_interval_millis=1_000, start_window_millis=_START_MS,
        checkpoint_window_count=checkpoint_every))
    return container


def _deploy(container: PlayedContainer, *node_ids: int) -> None:
    container.deploy([plan_pb2.OperatorDeployInfo(
        id=node_id, type=plan_pb2.OPERATOR_TYPE_GENERIC,
        inputs=[plan_pb2.InputDeployInfo(port_name="input")],
        outputs=[plan_pb2.OutputDeployInfo(port_name="output")]) for node_id in node_ids],
        _START_MS + 60_000, 0.0)


def test_each_heartbeat_reports_the_next_windows_with_a_checkpoint_every_n_windows() -> None:
    container = _container(windows_per_heartbeat=2, checkpoint_every=4)
    _deploy(container, 3, 5)
    seen: dict[int, list[int]] = {3: [], 5: []}
    checkpoints: dict[int, list[int]] = {3: [], 5: []}
    for beat in range(6):
        # serialized and parsed back, as the master gets it: a message kept and updated in
        # place must not carry a number of one heartbeat into the next
        message = umbilical_pb2.ContainerHeartbeat.FromString(
            container.heartbeat(_START_MS + 60_000 + beat * 1_000).SerializeToString())
        assert message.sent_tms == _START_MS + 60_000 + beat * 1_000
        for report in message.stats.operators:
            assert report.state == umbilical_pb2.OPERATOR_STATE_ACTIVE
            for window in report.window_stats:
                seen[report.node_id].append(window_counter(window.window_id))
                assert [p.id for p in window.input_ports] == ["input"]
                assert window.input_ports[0].tuple_count > 0
                if window.HasField("checkpoint"):
                    assert window.checkpoint.window_id == window.window_id
                    checkpoints[report.node_id].append(window_counter(window.window_id))
    first = seen[3][0]
    assert seen[3] == seen[5] == list(range(first, first + 12))
    assert checkpoints[3] == checkpoints[5] == [c for c in seen[3] if (c + 1) % 4 == 0]


def test_a_deploy_or_undeploy_reshapes_the_message() -> None:
    container = _container()
    _deploy(container, 1)
    assert [r.node_id for r in container.heartbeat(_START_MS + 61_000).stats.operators] == [1]
    _deploy(container, 2)
    assert [r.node_id for r in container.heartbeat(_START_MS + 62_000).stats.operators] == [1, 2]
    container.undeploy([1])
    assert [r.node_id for r in container.heartbeat(_START_MS + 63_000).stats.operators] == [2]
