"""``weir savepoint`` through a master that is not there for a moment: the request is
asked again of the master found again (not given up on at once), and a request that
reached the first master (its answer lost) is not an error the second time."""

from __future__ import annotations

import argparse

import grpc
import pytest

from weir.master import cli_savepoints
from weir.master.client import WeirClientError


class FakeClient:
    def __init__(self, answers: list[Exception | None], asked: list[str], address: str):
        self.answers, self.asked, self.address = answers, asked, address

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def take_savepoint(self, app_id, path, stop=False):
        self.asked.append(self.address)
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def test_the_savepoint_request_follows_a_master_that_comes_back(monkeypatch, capsys):
    gone = WeirClientError("no master answers at 127.0.0.1:6001", grpc.StatusCode.UNAVAILABLE)
    answers: list[Exception | None] = [gone, gone, None]
    asked: list[str] = []
    args = argparse.Namespace(master="127.0.0.1:6001", master_found=True, wait=30.0,
                              app_id="app-0001", path="/tmp/sp", stop=False)
    monkeypatch.setattr(cli_savepoints, "client_for",
                        lambda a: FakeClient(answers, asked, a.master))
    monkeypatch.setattr(cli_savepoints, "default_master", lambda: "127.0.0.1:6002")
    monkeypatch.setattr(cli_savepoints.time, "sleep", lambda s: None)

    def request(client, left_s):
        client.take_savepoint(args.app_id, args.path)

    cli_savepoints.across_restarts(args, request)
    assert asked == ["127.0.0.1:6001", "127.0.0.1:6002", "127.0.0.1:6002"]
    assert "the master at 127.0.0.1:6001 does not answer" in capsys.readouterr().err


def test_errors_other_than_a_missing_master_are_not_retried(monkeypatch):
    refused = WeirClientError("unknown application 'app-0009'", grpc.StatusCode.NOT_FOUND)
    asked: list[str] = []
    args = argparse.Namespace(master="127.0.0.1:6001", master_found=False, wait=30.0)
    monkeypatch.setattr(cli_savepoints, "client_for",
                        lambda a: FakeClient([refused], asked, a.master))
    with pytest.raises(WeirClientError, match="unknown application"):
        cli_savepoints.across_restarts(
            args, lambda client, left: client.take_savepoint("app-0009", "/tmp/sp"))
    assert asked == ["127.0.0.1:6001"]


def test_a_savepoint_asked_again_that_the_first_asking_started_is_no_error():
    args = argparse.Namespace(app_id="app-0001", path="/tmp/sp", stop=True)
    request = cli_savepoints.savepoint_request(args)
    taken = WeirClientError("application app-0001 is already taking a savepoint at "
                            "'/tmp/sp'", grpc.StatusCode.FAILED_PRECONDITION)
    request(FakeClient([taken], [], "127.0.0.1:6002"), 10.0)  # the first one arrived
    other = WeirClientError("application app-0001 is already taking a savepoint at "
                            "'/tmp/other'", grpc.StatusCode.FAILED_PRECONDITION)
    with pytest.raises(WeirClientError, match="other"):
        request(FakeClient([other], [], "127.0.0.1:6002"), 10.0)
