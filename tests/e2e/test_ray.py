"""The master asks Ray for its containers: `weir master --launcher ray --ray-address ADDR`
on a real three-node Ray cluster on this machine (tests/ray_cluster.py). The word count is
exact; the node running the counter is killed mid-run (its raylet and everything on it),
the master sees the container go at once, Ray places its replacement on the other node,
and the count is still exact. The recovery time is printed."""

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
from tests.ray_cluster import RayTestCluster, ray_cluster  # noqa: F401 - the fixture
from weir.master.client import WeirClient
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


def test_word_count_on_ray_exact_when_a_node_is_lost(ray_cluster, tmp_path: Path,  # noqa: F811
                                                     monkeypatch):
    monkeypatch.setenv("WEIR_HOME", str(tmp_path / "home"))  # the master's secret file
    app, lines = write_wordcount_app(
        tmp_path, "ray", 3_000, WORDCOUNT_DAG + ", CONTAINER_CORES=1, "
        "HEARTBEAT_TIMEOUT_MILLIS=120000, CHECKPOINT_WINDOW_COUNT=2", lines_per_window=100)
    master = WeirProcess(["master", "--port", "0", "--json", "--launcher", "ray",
                          "--ray-address", ray_cluster.address], dict(os.environ),
                         tmp_path, tmp_path / "master.log")
    try:
        address = poll_for(lambda: _address(master), 60, "the master to start")
        with WeirClient(address) as client:
            app_id = client.submit(load_app(app).to_descriptor())
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 180,
                     f"a first committed window\n{master.output()}")
            victim = f"{app_id}-c0"  # source, tokenizer and counter
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
            replacement = next(c for c in client.containers(app_id) if c.id == lost.replaced_by)
            info = client.wait(app_id, 240)
            assert info.state == "FINISHED", f"{info.diagnostics}\n{master.output()}"
            assert replacement.id and node not in ray_cluster.workers
    finally:
        if master.proc.poll() is None:
            master.proc.send_signal(signal.SIGTERM)
            master.wait(30)
        master.stop()
    counted, _ = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words_of(lines))
