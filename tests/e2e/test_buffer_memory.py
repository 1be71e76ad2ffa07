"""BUFFER_MEMORY_MB takes effect in a real container: its buffer server keeps that much of
the uncommitted streams in memory and spills the rest, and the master's view of the
container says so (its limit, what it holds in memory and on disk, blocks spilled)."""

from __future__ import annotations

import pytest

from tests.harness import poll_for
from weir.container.memory_shares import buffer_memory_bytes
from weir.master.client import WeirClient
from weir.operators import Dag
from weir.operators.library import ConsoleSink, EventGenerator

pytestmark = pytest.mark.timeout(180)


def _container(client: WeirClient, app_id: str):
    [container] = [c for c in client.containers(app_id) if c.operator_ids]
    return container


@pytest.mark.parametrize("buffer_mb", [0, 1])
def test_the_buffer_server_keeps_what_buffer_memory_mb_says_and_spills_past_it(
        master, buffer_mb: int):
    # checkpoints a minute apart: every window of the stream stays uncommitted meanwhile
    dag = Dag("buffer-memory", CONTAINERS=1, HEARTBEAT_INTERVAL_MILLIS=200,
              STREAMING_WINDOW_SIZE_MILLIS=100, CHECKPOINT_WINDOW_COUNT=600,
              BUFFER_MEMORY_MB=buffer_mb)
    gen = dag.add_operator("gen", EventGenerator(rate_per_second=200_000, keys=1_000))
    sink = dag.add_operator("sink", ConsoleSink(limit=0))
    dag.add_stream("events", gen.output, sink.input)
    with WeirClient(master.address) as client:
        app_id = client.submit(dag.to_descriptor())
        try:
            poll_for(lambda: _container(client, app_id).buffer_memory_bytes
                     + _container(client, app_id).buffer_disk_bytes > 3 << 20, 90,
                     "3 MB of the stream in the buffer server")
            container = _container(client, app_id)
            if buffer_mb:
                assert container.buffer_memory_limit_bytes == buffer_mb << 20
                assert container.buffer_memory_bytes <= buffer_mb << 20
                poll_for(lambda: _container(client, app_id).buffer_blocks_spilled > 0, 30,
                         "a block spilled past BUFFER_MEMORY_MB")
            else:  # the default: a share of the machine, nothing spilled at this size
                assert container.buffer_memory_limit_bytes == buffer_memory_bytes({})
                assert container.buffer_disk_bytes == 0
                assert container.buffer_blocks_spilled == 0
        finally:
            client.kill(app_id)
