"""RunningCount through real processes: its totals live in a keyed store on local disk, and
the container running it is SIGKILLed twice at random moments; every word's published
totals still rise window by window, no window is published twice, and the last total is
Python's count (a window applied twice to the store, or lost, would show)."""

from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path

import pytest

from tests.e2e.test_exactly_once import APP, chaos_seed, kill_operators_container, write_input
from tests.e2e.test_recovery import wait_finished
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)


def published_rows(out: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(out.glob("*.jsonl"))
            for line in file.read_text().splitlines()]


def test_running_count_totals_are_exact_after_sigkills_of_its_container(master, tmp_path):
    rng, note = chaos_seed()
    expected = write_input(tmp_path / "inbox")
    app = tmp_path / "running_count_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"),
        sink=f"FileSink({str(tmp_path / 'out')!r}, exactly_once=True)", crash="",
        mode="AT_LEAST_ONCE", checkpoints=4, count_checkpoints=4)
        .replace("WindowedCount", "RunningCount")))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        kills = kill_operators_container(master, client, app_id, "count", rng, note,
                                         max_pause_s=2.0)
        wait_finished(client, master, app_id, timeout_s=240)
    assert kills >= 1, f"the run ended before a kill; {note}"

    rows = published_rows(tmp_path / "out")
    seen = collections.Counter((r["word"], r["window_id"]) for r in rows)
    assert max(seen.values()) == 1, f"a window published twice; {note}"
    by_word: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for row in rows:
        by_word[row["word"]].append((row["window_id"], row["count"]))
    for word, totals in by_word.items():
        counts = [c for _, c in sorted(totals)]
        assert counts == sorted(set(counts)), f"{word}: totals {counts} do not rise; {note}"
    last = {word: max(c for _, c in totals) for word, totals in by_word.items()}
    assert last == dict(expected), (
        f"{note}: {sum(last.get(w) != n for w, n in expected.items())} words' totals differ, "
        f"e.g. {[(w, last.get(w), n) for w, n in expected.items() if last.get(w) != n][:5]}")
    stores = list((tmp_path / "state").glob("runs/*/operators/*/running-count.sqlite"))
    assert len(stores) == 1, stores
