"""The dispatcher's watch (restarting application masters, keeping ended applications):
a pass that fails is a state every listing shows until a pass works again, not only a
log line."""

from __future__ import annotations

from pathlib import Path

from weir.master.dispatcher import AppMaster, Dispatcher
from weir.proto import client_pb2


def test_a_failing_watch_is_shown_in_every_listing_until_it_works_again(tmp_path, monkeypatch):
    dispatcher = Dispatcher(tmp_path / "dispatcher")
    ended = client_pb2.ApplicationInfo(id="app-0001", state="FINISHED")
    dispatcher._apps["app-0001"] = AppMaster("app-0001", Path(tmp_path), final=ended)  # noqa: SLF001

    def broken() -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(dispatcher, "check", broken)
    dispatcher.watch_once()
    [info] = dispatcher.list_applications().applications
    assert "watch of application masters fails: OSError: no more processes" in info.diagnostics
    assert ended.diagnostics == ""  # its record stays as it was
    monkeypatch.setattr(dispatcher, "check", lambda: None)
    dispatcher.watch_once()
    [info] = dispatcher.list_applications().applications
    assert dispatcher.trouble == "" and info.diagnostics == ""
    dispatcher.stop()
