"""TcpLineSource's connections are bounded: past ``max_connections`` a sender is refused
and counted, and a process out of file descriptors (``accept`` failing with ``EMFILE``
and the like) pauses accepting instead of ending the receiver."""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.harness import poll_for
from tests.operators.test_tcp_source import (
    TIMEOUT_S,
    Sender,
    source,  # noqa: F401 - the fixture
    started,
    window,
)
from weir.operators.library import TcpLineSource
from weir.operators.library import tcp as tcp_module
from weir.operators.metrics import collect_metrics


def test_senders_past_max_connections_are_refused_counted_and_let_in_once_one_leaves(
        source) -> None:  # noqa: F811 - the fixture
    src, emitted = source(max_connections=2)
    first, second = Sender(src.bound_port), Sender(src.bound_port)
    try:
        first.send_acked(["a"])
        second.send_acked(["b"])  # both are accepted and served
        third = Sender(src.bound_port)
        assert third.reply() == "ERR too many connections: 2 are open"
        assert third.reply() == ""  # closed by the source
        third.close()
        metrics = collect_metrics(src)
        assert (metrics["connections"], metrics["connections_refused"]) == (2, 1)
        first.close()
        poll_for(lambda: src.connections() == 1, TIMEOUT_S, "the closed sender to be let go")
        fourth = Sender(src.bound_port)
        fourth.send_acked(["c"])
        fourth.close()
        window(src, emitted, 1, calls=10)
        assert sorted(r["line"] for r in emitted.rows()) == ["a", "b", "c"]
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_max_connections_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match=f"max_connections must be a positive integer .*not "
                                         f"{bad!r}"):
        TcpLineSource(port=0, max_connections=bad)


class OutOfResources:
    """A listening socket whose first ``failures`` accepts fail as in a process out of file
    descriptors (or memory): the connection waits in the kernel's backlog."""

    def __init__(self, sock: socket.socket, failures: int, code: int) -> None:
        self.sock, self.failures, self.code = sock, failures, code

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(self.code, os.strerror(self.code))
        return self.sock.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_accept_out_of_resources_pauses_accepting_and_the_sender_is_served_later(
        tmp_path: Path, monkeypatch, caplog, code: int) -> None:
    real_listen = tcp_module.listen
    monkeypatch.setattr(tcp_module, "listen",
                        lambda *a, **k: OutOfResources(real_listen(*a, **k), 3, code))
    src = TcpLineSource(port=0)
    caplog.set_level(logging.INFO, "weir.operators.library.tcp")
    emitted = started(src, tmp_path / "state")
    try:
        sender = Sender(src.bound_port)  # waits in the backlog while accept fails
        sender.send_acked(["kept"])
        sender.close()
        assert src._receiver.error is None and src._receiver._thread.is_alive()
        window(src, emitted, 1, calls=10)
        assert [r["line"] for r in emitted.rows()] == ["kept"]
        said = [r.getMessage() for r in caplog.records]
        assert sum("cannot accept a connection" in m for m in said) == 1, said  # not 3 times
    finally:
        src.teardown()
