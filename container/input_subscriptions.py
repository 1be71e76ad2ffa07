"""How an input port subscribes to its upstream stream: from this container's own buffer
server directly when the upstream runs here (``container.local_subscription``), over
Flight otherwise (``container.buffer_client``); not at all when the upstream ended before
the input's checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from weir.container.buffer_client import Subscription
from weir.container.local_subscription import LocalSubscription
from weir.container.stream_messages import Kind, Message
from weir.operators.partitioning import PartitionFilter
from weir.proto import plan_pb2

if TYPE_CHECKING:
    from weir.container.buffer_server import BufferServer

__all__ = ["Subscribe", "stream_id", "subscriber"]

Subscribe = Callable[..., tuple[Iterable[Message], Callable[[], None]]]
"""``subscribe(from_window, latest=False)``: the messages, and how to cancel them."""


def stream_id(operator_id: int, port_name: str) -> str:
    """The buffer-server identifier of an output port: ``<operator id>.<port>``."""
    return f"{operator_id}.{port_name}"


def subscriber(info: plan_pb2.InputDeployInfo, partition: PartitionFilter | None,
               local: BufferServer, local_address: tuple[str, int], *,
               secret: str | None = None, tls_root_certs: bytes | None = None) -> Subscribe:
    """``info``'s subscribe function. ``local_address``: where the master was told
    ``local`` serves (an upstream publishing there publishes into ``local``)."""
    ended = info.upstream_end_window if info.HasField("upstream_end_window") else None
    stream = stream_id(info.source_node_id, info.source_port_name)
    here = (info.buffer_server_host, info.buffer_server_port) == tuple(local_address)

    def subscribe(from_window: int, latest: bool = False):
        if ended is not None:  # the upstream finished before our checkpoint: just end
            return iter([Message(Kind.END_STREAM, ended)]), lambda: None
        subscription: LocalSubscription | Subscription
        if here:
            subscription = LocalSubscription(local, stream, from_window, partition=partition,
                                             latest=latest, generation=info.source_generation)
        else:
            subscription = Subscription(info.buffer_server_host, info.buffer_server_port,
                                        stream, from_window=from_window, secret=secret,
                                        tls_root_certs=tls_root_certs, partition=partition,
                                        latest=latest, generation=info.source_generation)
        return subscription, subscription.close
    return subscribe
