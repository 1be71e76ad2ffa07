"""Keys in a state or savepoint URI (``s3://KEY:SECRET@bucket/…``) are never shown: not in
``weir apps`` / ``weir app``, the read-only HTTP API, nor the master's log."""

from __future__ import annotations

import logging

from tests.master.fakes import chain_descriptor
from weir.master.application import Application
from weir.master.planner import build_physical_plan
from weir.master.savepoints import SavepointProgress, start
from weir.master.tables import application_details, application_rows
from weir.master.views import application_info

STATE = "s3://AKIAKEY:TOPSECRET@bucket/state?region=eu-west-1"
SAVEPOINT = "s3://AKIAKEY:TOPSECRET@bucket/sp/v2"


def test_keys_in_state_and_savepoint_uris_are_not_shown_or_logged(caplog):
    dag = chain_descriptor(1)
    app = Application("app-0001", dag, build_physical_plan(dag, {"STATE_DIR": STATE},
                                                           "app-0001"), 0)
    app.from_savepoint = "s3://AKIAKEY:TOPSECRET@bucket/sp/v1"
    with caplog.at_level(logging.INFO):
        start(app, SAVEPOINT, stop=True)
    info = application_info(app, now_ms=0)
    shown = [str(info), *map(str, application_rows([info], now_ms=0)),
             application_details(info, now_ms=0), caplog.text]
    assert not [text for text in shown if "TOPSECRET" in text or "AKIAKEY" in text]
    assert info.attributes["STATE_DIR"] == "s3://***@bucket/state?region=eu-west-1"
    assert info.savepoint_path == "s3://***@bucket/sp/v2"
    assert isinstance(app.savepoint, SavepointProgress) and app.savepoint.path == SAVEPOINT
