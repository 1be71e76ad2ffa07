"""The master asks Ray for its containers: `weir master --launcher ray --ray-address ADDR`
on a real three-node Ray cluster on this machine (tests/ray_cluster.py). The word count is
exact; the node running it is killed mid-run (its raylet and everything on it), the
master sees the container go at once, its warm spare on the other node takes over, and
the count is still exact. The recovery time is printed."""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.wordcount import WORDCOUNT_DAG, published_counts, words_of, write_wordcount_app
from tests.harness import WeirProcess, poll_for
from tests.ray_cluster import WORKER_CPUS, ray_cluster  # noqa: F401 - the fixture
from weir.master.client import WeirClient, WeirClientError
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(400)


def _address(process: WeirProcess) -> str | None:
    lines = process.output().splitlines()
    if "{" in lines and "}" in lines[lines.index("{"):]:
        start = lines.index("{")
        return json.loads("\n".join(lines[start:lines.index("}", start) + 1]))["address"]
    if process.proc.poll() is not None:
        raise AssertionError(f"the master exited:\n{process.output()}")
    return None


def test_word_count_on_ray_exact_when_a_node_is_lost(s3_server, ray_cluster,  # noqa: F811
                                                     tmp_path: Path, monkeypatch):
    """The application (one container) and its warm spare ask for a whole worker each:
    Ray places them on the two workers; the container's node is killed; its operators go
    to the spare on the other node; the new spare finds no room and says so. Each node
    has a temporary folder of its own, so the state is on an S3-protocol server
    (``tests/s3_server.py``); without a shared STATE_DIR the run is refused at submit."""
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "home"))  # the master's secret file
    dag = (WORDCOUNT_DAG.replace("CONTAINERS=2", "CONTAINERS=1")
           + f", SPARE_CONTAINERS=1, CONTAINER_CORES={WORKER_CPUS}, "
           "HEARTBEAT_TIMEOUT_MILLIS=120000, CHECKPOINT_WINDOW_COUNT=2")
    unshared, _ = write_wordcount_app(tmp_path, "ray-unshared", 3_000, dag, pinned=False)
    app, lines = write_wordcount_app(
        tmp_path, "ray", 3_000, dag + f", STATE_DIR={s3_server.uri('weir-state', 'ray')!r}",
        lines_per_window=100, pinned=False)
    master = WeirProcess(["master", "--port", "0", "--json", "--launcher", "ray",
                          "--ray-address", ray_cluster.address], dict(os.environ),
                         tmp_path, tmp_path / "master.log")
    try:
        address = poll_for(lambda: _address(master), 60, "the master to start")
        with WeirClient(address) as client:
            with pytest.raises(WeirClientError, match="STATE_DIR is not set .* Ray launcher"):
                client.submit(load_app(unshared).to_descriptor())
            app_id = client.submit(load_app(app).to_descriptor())
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 180,
                     f"a first committed window\n{master.output()}")
            spare = poll_for(lambda: next((c.id for c in client.containers(app_id)
                                           if c.state == "SPARE"), ""), 120,
                             f"a spare with warm Spark\n{master.output()}")
            victim = f"{app_id}-c0"  # every operator
            [info] = [c for c in client.containers(app_id) if c.id == victim]
            pid = int(info.process_name.split("@")[0])
            node = ray_cluster.node_of(pid)
            lost_at = time.monotonic()
            committed = client.application(app_id).committed_window_id
            ray_cluster.kill_node_of(pid)
            lost = poll_for(lambda: next((c for c in client.containers(app_id)
                                          if c.id == victim and c.state == "KILLED"), None),
                            60, f"{victim} to be seen lost\n{master.output()}")
            seen_s = time.monotonic() - lost_at
            poll_for(lambda: client.application(app_id).committed_window_id > committed
                     or client.application(app_id).state != "RUNNING", 180,
                     f"windows moving again\n{master.output()}")
            print(f"Ray node of {victim} killed: seen lost after {seen_s:.1f} s (heartbeat "
                  f"timeout 120 s), windows committed again after "
                  f"{time.monotonic() - lost_at:.1f} s")
            assert "exited" in lost.diagnostics, lost.diagnostics  # Ray told, not a timeout
            assert lost.replaced_by == spare  # on the other node, its Spark already warm
            assert node not in ray_cluster.workers
            # Ray may first place the new spare on the killed node, which it still counts
            # alive, with the lost actor's CPUs free: that spare dies and another is asked
            # for. One of them, live, must say it has no room.
            def no_room() -> str:
                spares = [c for c in client.containers(app_id) if c.spare and c.id != spare]
                return next((c.id for c in spares if c.state != "KILLED" and
                             "waiting to be placed: Ray has no node" in c.diagnostics), "")

            try:
                poll_for(no_room, 90, "a new spare to say it has no room")
            except AssertionError as exc:
                seen = [(c.id, c.state, c.diagnostics) for c in client.containers(app_id)]
                raise AssertionError(f"{exc}: {seen}") from None
            info = client.wait(app_id, 240)
            assert info.state == "FINISHED", f"{info.diagnostics}\n{master.output()}"
    finally:
        if master.proc.poll() is None:
            master.proc.send_signal(signal.SIGTERM)
            master.wait(30)
        master.stop()
    counted, _ = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words_of(lines))
    import pyarrow.fs

    store, root = pyarrow.fs.FileSystem.from_uri(s3_server.uri("weir-state", "ray"))
    kept = store.get_file_info(pyarrow.fs.FileSelector(root, recursive=True,
                                                       allow_not_found=True))
    assert kept, "no checkpoint was written to the S3-protocol server"
