"""The dispatcher's watch (restarting application masters, keeping ended applications):
a pass that fails is a state every listing shows until a pass works again, not only a
log line."""

from __future__ import annotations

import json
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


def test_an_application_whose_master_keeps_exiting_is_failed_for_good(tmp_path, monkeypatch):
    """Past MAX_RESTARTS exits in a row its application is FAILED, with the end of its
    master's log, and stays so when the dispatcher restarts; not RUNNING as last seen."""
    from weir.master import dispatcher as module

    dispatcher = Dispatcher(tmp_path / "dispatcher")
    folder = tmp_path / "dispatcher" / "apps" / "app-0001"
    folder.mkdir(parents=True)
    (folder / "app-master.log").write_text("Traceback ...\nMemoryError\n")
    seen = client_pb2.ApplicationInfo(id="app-0001", name="counts", state="RUNNING",
                                      total_tuples_processed=1234)
    app = AppMaster("app-0001", folder, restarts=module.MAX_RESTARTS, last_info=seen)
    dispatcher._apps["app-0001"] = app  # noqa: SLF001
    dispatcher._journal.put("app/app-0001", json.dumps(  # noqa: SLF001 - as submit does
        {"id": "app-0001", "folder": str(folder)}).encode())
    monkeypatch.setattr(dispatcher, "_start", lambda _: (_ for _ in ()).throw(
        AssertionError("not started again")))
    dispatcher.check()
    [info] = dispatcher.list_applications().applications
    assert info.state == "FAILED" and info.total_tuples_processed == 1234
    assert "exited 5 times in a row" in info.diagnostics and "MemoryError" in info.diagnostics
    dispatcher.stop()
    again = Dispatcher(tmp_path / "dispatcher")
    again.restore()
    [info] = again.list_applications().applications
    assert info.state == "FAILED"
    again.stop()
