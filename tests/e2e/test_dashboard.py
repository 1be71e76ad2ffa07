"""The web dashboard in a real browser: headless Chromium (Debian's) driven by Playwright
opens the master's dashboard while an application runs and finds the DAG, the operator
table and a chart drawn with live numbers. A screenshot is kept for people to look at.

Skipped, naming why, without /usr/bin/chromium or Playwright, unless WEIR_REQUIRE_BROWSER=1
(CI sets it: there the test must run).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import ROOT, poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(240)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOT_COPY = ROOT / "out" / "screenshots" / "dashboard.png"  # /out/ is not committed

APP = """
    import pyarrow as pa
    import pyarrow.compute as pc
    from weir.operators import Dag, Operator, InputPort, OutputPort, metric
    from weir.operators.library import EventGenerator, FileSink

    class Evens(Operator):
        input = InputPort()
        output = OutputPort()
        METRICS = ("rows_seen",)

        def __init__(self):
            self.rows_seen = 0

        def process(self, port, batch):
            self.rows_seen += batch.num_rows
            self.output.emit(batch.filter(pc.equal(pc.bit_wise_and(batch.column("value"), 1), 0)))

    class Tally(Operator):
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            self.output.emit(pa.table(batch).group_by("key").aggregate([("value", "sum")]))

    dag = Dag("dashboard-demo", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=250,
              HEARTBEAT_INTERVAL_MILLIS=250, CHECKPOINT_WINDOW_COUNT=8,
              THROUGHPUT_CALCULATION_INTERVAL_MILLIS=3000, STATE_DIR={state!r})
    source = dag.add_operator("events", EventGenerator(rate_per_second=20_000, keys=50,
                                                       batch_rows=1000), CONTAINER=0)
    evens = dag.add_operator("evens", Evens(), CONTAINER=0)
    tally = dag.add_operator("tally", Tally(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=1)
    dag.add_stream("events", source.output, evens.input)
    dag.add_stream("kept", evens.output, tally.input)
    dag.add_stream("sums", tally.output, sink.input)
"""


def _browser_or_skip() -> None:
    required = os.environ.get("WEIR_REQUIRE_BROWSER") == "1"
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} is missing (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("Playwright for Python is not installed (pip install playwright)")
    if missing and required:
        pytest.fail("WEIR_REQUIRE_BROWSER=1 but " + "; ".join(missing))
    if missing:
        pytest.skip("the browser test needs " + "; ".join(missing))


def test_dashboard_draws_the_dag_the_table_and_charts_with_live_numbers(master, tmp_path):
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    app_file = tmp_path / "dashboard_app.py"
    app_file.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"),
                                                   out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app_file).to_descriptor())

        def committed() -> bool:
            info = client.application(app_id)
            assert info.state in ("ACCEPTED", "RUNNING"), (info.diagnostics,
                                                           container_logs(master))
            return info.committed_window_id >= 0

        poll_for(committed, 120, "a committed window (the application runs and checkpoints)",
                 interval_s=0.25)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                             timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            denied = page.goto(master.core.dashboard_url, timeout=30_000)
            assert denied is not None and denied.status == 401  # no secret, no dashboard
            page.goto(master.dashboard_url, timeout=30_000)  # the URL with ?token=

            # the DAG: four operators and three streams, each node with its live rate
            wait_js(page, "document.querySelectorAll('#dag g.node').length === 4",
                    "the DAG's four operators")
            assert page.locator("#dag g.stream").count() == 3
            assert page.locator("#dag g.node[data-operator='evens']").get_attribute(
                "data-state") == "ACTIVE"
            # the operator table with tuples processed going up between refreshes
            cell = "#operators tbody tr[data-operator='evens'] td.processed"
            page.wait_for_selector(cell, timeout=30_000)
            first = _count(page.inner_text(cell))
            wait_js(page, f"Number(document.querySelector(\"{cell}\").textContent"
                          f".replace(/,/g, '')) > {first}", "tuples processed to go up")
            assert page.locator("#operators tbody tr").count() == 4
            assert "rows_seen=" in page.inner_text("#operators tbody tr[data-operator='evens']")
            # its state's size: the last checkpoint's (there was one: a window is committed)
            size = "#operators tbody tr[data-operator='evens'] td.state-size"
            state = page.inner_text(size)
            assert re.fullmatch(r"\d+(\.\d)? (B|kB|MB)", state), state
            # seen, not only there: drawn in the table's colour (as a badge it was white)
            assert page.eval_on_selector(size, "td => getComputedStyle(td).color") != \
                "rgb(255, 255, 255)"
            # the charts: a line per operator with points of its recent windows
            wait_js(page, "[...document.querySelectorAll('#throughput-chart polyline')]"
                          ".some(p => p.getAttribute('points').split(' ').length >= 3)",
                    "a throughput line of three windows or more")
            assert page.locator("#latency-chart polyline").count() >= 1
            assert page.inner_text("#committed-window") != "-"
            assert page.locator("#containers tbody tr").count() == 2
            assert "ms" in page.inner_text("#latency")
            assert not errors, errors

            screenshot = tmp_path / "dashboard.png"
            page.screenshot(path=str(screenshot), full_page=True)
            assert screenshot.stat().st_size > 10_000
            SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(screenshot, SCREENSHOT_COPY)
        finally:
            browser.close()


def wait_js(page, expression: str, what: str, timeout_s: float = 30) -> None:
    """Polls a JavaScript expression from outside the page: ``wait_for_function`` would
    evaluate it inside, which the dashboard's Content-Security-Policy (no eval) forbids,
    and the test keeps that policy on to check the page works under it."""
    poll_for(lambda: page.evaluate(expression), timeout_s, what, interval_s=0.2)


def _count(text: str) -> int:
    return int(text.replace(",", "").strip() or 0)
