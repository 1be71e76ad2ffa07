"""Which master `weir` talks to without --master: $WEIR_MASTER, the default port if it
answers, else the one master of this machine and user that answers (a `weir run`); when
several answer, an error asks which."""

from __future__ import annotations

import os
import socket

import pytest

from weir.master import auth
from weir.master.client import DEFAULT_MASTER, WeirClientError, default_master

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WEIR_MASTER", raising=False)
    return tmp_path / "home"


@pytest.fixture
def listening():
    """Addresses of sockets that accept connections, closed after the test."""
    sockets = []

    def open_one() -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sockets.append(sock)
        return f"127.0.0.1:{sock.getsockname()[1]}"

    yield open_one
    for sock in sockets:
        sock.close()


def published(address: str, mtime: float) -> None:
    path = auth.secret_path(int(address.rsplit(":", 1)[1]))
    auth.write_secret_file(path, address, "s3cret", b"PEM")
    os.utime(path, (mtime, mtime))


def dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_the_one_local_master_that_answers(home, listening):
    answering = listening()
    published(answering, 1_000)
    published(dead_address(), 3_000)  # SIGKILLed: its file stayed, its port is closed
    assert default_master() == answering


def test_several_local_masters_answering_is_an_error_naming_them(home, listening, capsys):
    """A submit must not deploy on whichever master started last (a benchmark's)."""
    from weir.master.cli import main

    older, newer = listening(), listening()
    published(older, 1_000)
    published(newer, 2_000)
    with pytest.raises(WeirClientError) as raised:
        default_master()
    assert f"({newer}, {older}, newest first)" in str(raised.value)
    assert "--master HOST:PORT or $WEIR_MASTER" in str(raised.value)
    assert main(["apps"]) == 2
    assert "2 masters of yours answer on this machine" in capsys.readouterr().err


def test_weir_master_setting_wins_and_nothing_found_is_the_default(home, listening,
                                                                    monkeypatch):
    assert default_master() == DEFAULT_MASTER  # no file at all
    published(dead_address(), 1_000)
    assert default_master() == DEFAULT_MASTER
    published(listening(), 2_000)
    monkeypatch.setenv("WEIR_MASTER", "10.0.0.1:7000")
    assert default_master() == "10.0.0.1:7000"


def test_a_linked_secret_file_is_not_followed(home, listening, tmp_path):
    """The secret goes where the file says: a link planted in the folder is skipped."""
    address = listening()
    elsewhere = tmp_path / "elsewhere.secret"
    auth.write_secret_file(elsewhere, address, "s3cret", b"PEM")
    home.mkdir(exist_ok=True)
    (home / "master-7777.secret").symlink_to(elsewhere)
    assert auth.local_master_addresses() == []
    assert default_master() == DEFAULT_MASTER
