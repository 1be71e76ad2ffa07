"""Keyed state larger than the container's memory limit, through real processes: a
``RegularJoin`` keeps every person's row (4 KB each, about 900 MB in all) while the local
launcher holds each container to ``CONTAINER_MEMORY_MB=768`` (a container over it is
killed). The run finishes with every pair Python's join of the same rows gives, no
container was lost, and while the join's store on disk grew past the limit, its
container's resident memory stayed under it: the state lives in the keyed store, not in
memory.

The container's memory is measured as the guard measures it (resident pages not backed
by a file). Measured here with a 600 MB limit and 820 MB of state, the join's container
held 327-510 MB over eight runs (mostly about 320, with spikes), so the limit leaves room:
about 170-190 MB is the operator's (alone in a process, for any store size), the rest
the container's traffic.
"""

from __future__ import annotations

import collections
import json
import os
import random
import textwrap
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import container_logs
from weir.master.client import WeirClient
from weir.master.local_limits import tree_memory_bytes
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

LIMIT_MB = 768
PERSONS, AUCTIONS, BIO_BYTES = 215_000, 2_000, 4_096
FILES = 43

APP = """
    from weir.operators import Dag
    from weir.operators.library import FileSink, ParquetSource, RegularJoin

    dag = Dag("beyond-memory", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              CHECKPOINT_WINDOW_COUNT=2, STATE_DIR={state!r},
              CONTAINER_MEMORY_MB={limit})
    persons = dag.add_operator("persons", ParquetSource({persons!r}, rows_per_window=2_600,
                                                        batch_rows=650), CONTAINER=0)
    auctions = dag.add_operator("auctions", ParquetSource({auctions!r}, rows_per_window=40),
                                CONTAINER=0)
    join = dag.add_operator("join", RegularJoin("seller", ttl_millis=3_600_000), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("persons", persons.output, join.left)
    dag.add_stream("auctions", auctions.output, join.right)
    dag.add_stream("pairs", join.output, sink.input)
"""


def write_inputs(root: Path) -> collections.Counter:
    """Persons (a seller each, a 4 KB bio of random text) and auctions of random sellers,
    as Parquet folders; returns the reference join as a multiset of (seller, item)."""
    rng = random.Random(5)
    folder = root / "persons"
    folder.mkdir()
    per_file = PERSONS // FILES
    for part in range(FILES):
        sellers = range(part * per_file, (part + 1) * per_file)
        bios = [os.urandom(BIO_BYTES // 2).hex() for _ in sellers]
        pq.write_table(pa.table({"seller": pa.array(sellers, pa.int64()),
                                 "bio": pa.array(bios)}), folder / f".{part}.tmp",
                       compression="zstd")
        os.replace(folder / f".{part}.tmp", folder / f"part-{part:03d}.parquet")
    items = [{"seller": rng.randrange(PERSONS + 1_000), "item": f"i{i}"}  # some match no one
             for i in range(AUCTIONS)]
    (root / "auctions").mkdir()
    pq.write_table(pa.Table.from_pylist(items), root / "auctions" / "part-0.parquet")
    return collections.Counter((a["seller"], a["item"]) for a in items
                               if a["seller"] < PERSONS)


def _store_bytes(state: Path) -> int:
    return sum(path.stat().st_size for path in state.rglob("*.sqlite*")
               if path.is_file())


def test_a_join_keeps_more_state_than_its_container_may_hold(master, tmp_path):
    expected = write_inputs(tmp_path)
    state = tmp_path / "state"
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(state), limit=LIMIT_MB, persons=str(tmp_path / "persons"),
        auctions=str(tmp_path / "auctions"), out=str(tmp_path / "out"))))
    peak = {"memory_mb": 0, "store_mb": 0}
    done = threading.Event()
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())

        def watch() -> None:  # the join's container's memory and its store's size
            while not done.wait(0.25):
                try:
                    ops = {op.name: op.id for op in client.operators(app_id)}
                    for container in client.containers(app_id):
                        if ops.get("join") in container.operator_ids:
                            pid = int(container.process_name.split("@")[0])
                            peak["memory_mb"] = max(peak["memory_mb"],
                                                    tree_memory_bytes(pid) >> 20)
                except Exception:  # noqa: BLE001 - a poll during the end; the next one counts
                    continue
                peak["store_mb"] = max(peak["store_mb"], _store_bytes(state) >> 20)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            info = client.wait(app_id, 360)
        finally:
            done.set()
            watcher.join(5)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        assert info.recoveries == 0, f"{info.last_recovery}\n{container_logs(master)}"
    rows = [json.loads(line) for file in sorted((tmp_path / "out").glob("*.jsonl"))
            for line in file.read_text().splitlines()]
    got = collections.Counter((r["seller"], r["item"]) for r in rows)
    assert got == expected
    assert all(len(r["bio"]) == BIO_BYTES for r in rows)
    assert peak["store_mb"] > LIMIT_MB, peak
    assert 0 < peak["memory_mb"] < LIMIT_MB, peak
    print(f"the join's container held at most {peak['memory_mb']} MB while its store "
          f"reached {peak['store_mb']} MB (limit {LIMIT_MB} MB)")
