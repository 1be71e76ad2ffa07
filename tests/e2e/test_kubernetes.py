"""The master asks Kubernetes for its containers: the word count through the Kubernetes
launcher and the official client, against the test API server (tests/kubernetes_api.py,
whose kubelet runs each pod's command here as a process: real containers, real Spark).
Its counter's pod is deleted mid-run (its node lost): the master sees the pod go at
once (not at the heartbeat timeout), the warm spare's pod takes over, and the count is
exact."""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.wordcount import (
    WORDCOUNT_DAG,
    published_counts,
    words_of,
    write_wordcount_app,
)
from tests.harness import poll_for
from tests.kubernetes_api import KubernetesTestApi, kube_api  # noqa: F401 - the fixture
from weir.master.client import WeirClient
from weir.master.kubernetes_launcher import KubernetesLauncher
from weir.master.kubernetes_pods import LABEL_CONTAINER
from weir.master.server import MasterServer
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(300)

NS = "weir"


@contextlib.contextmanager
def kubernetes_master(api: KubernetesTestApi, tmp_path: Path) -> Iterator[MasterServer]:
    """A master whose launcher makes pods through the test API server (a kubeconfig, as
    a user outside the cluster would give it)."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    server = MasterServer("127.0.0.1", 0, lambda address: KubernetesLauncher(
        address, image="weir:test", kubeconfig=str(kubeconfig),
        command=[sys.executable, "-m", "weir.container"]), container_stop_grace_ms=5_000)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def shared_state(tmp_path: Path) -> str:
    """The ``Dag(...)`` arguments of a state folder every pod reaches: the test's pods all
    run on this machine, so a folder of it is one every "node" mounts (a real cluster
    needs a shared store: ``master.state_location``)."""
    return f", STATE_DIR={str(tmp_path / 'state')!r}, STATE_DIR_SHARED=True"


def pod_logs(api: KubernetesTestApi) -> str:
    return "\n".join(f"--- pod {p['metadata']['name']} ({p['status'].get('phase')})\n"
                     f"{api.pod_log(NS, p['metadata']['name'])[-3000:]}"
                     for p in api.pods(NS))


def finished(client: WeirClient, app_id: str, api: KubernetesTestApi, timeout_s: float = 180):
    try:
        info = client.wait(app_id, timeout_s)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{pod_logs(api)}") from None
    assert info.state == "FINISHED", f"{info.diagnostics}\n{pod_logs(api)}"
    return info


def test_the_word_count_runs_in_pods_exactly_also_when_one_is_lost(kube_api, tmp_path):  # noqa: F811
    # a long heartbeat timeout: only the pod watch can notice the loss quickly
    app, lines = write_wordcount_app(
        tmp_path, "k8s", 3_000, WORDCOUNT_DAG + ", HEARTBEAT_TIMEOUT_MILLIS=120000, "
        "CHECKPOINT_WINDOW_COUNT=2, CONTAINER_MEMORY_MB=1536, SPARE_CONTAINERS=1"
        + shared_state(tmp_path),
        lines_per_window=100)
    with kubernetes_master(kube_api, tmp_path) as master, \
            WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: len(kube_api.pods(NS)) == 3, 60, "a pod per container and spare")
        pods = kube_api.pods(NS)
        assert sorted(p["metadata"]["labels"][LABEL_CONTAINER] for p in pods) == [
            f"{app_id}-c0", f"{app_id}-c1", f"{app_id}-c2"]
        assert all(p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "1536Mi"
                   for p in pods)
        assert master.secret not in json.dumps(pods)  # the secret reaches them as a Secret
        assert len(kube_api.secrets(NS)) == 1
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 120,
                 f"a first committed window\n{pod_logs(kube_api)}")
        spare = poll_for(lambda: next((c.id for c in client.containers(app_id)
                                       if c.state == "SPARE"), ""), 120,
                         f"a spare with warm Spark\n{pod_logs(kube_api)}")
        victim = f"{app_id}-c0"  # source, tokenizer and counter
        [pod] = [p for p in pods if p["metadata"]["labels"][LABEL_CONTAINER] == victim]
        lost_at = time.monotonic()
        kube_api.vanish(NS, pod["metadata"]["name"])  # as when its node is lost
        lost = poll_for(lambda: next((c for c in client.containers(app_id)
                                      if c.id == victim and c.state == "KILLED"), None),
                        60, f"{victim} to be seen lost")
        print(f"pod of {victim} deleted: seen lost after {time.monotonic() - lost_at:.1f} s "
              f"(heartbeat timeout 120 s)")
        assert "exited" in lost.diagnostics, lost.diagnostics  # the watch, not a timeout
        assert lost.replaced_by == spare  # a warm spare's pod takes over
        finished(client, app_id, kube_api)
        log = client.container_log(app_id, f"{app_id}-c1")
        assert log.path.startswith(f"pod {NS}/")  # its content: test_kubernetes_launcher
    counted, _ = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words_of(lines))
    assert kube_api.pods(NS) == [] and kube_api.secrets(NS) == []  # all released


def test_a_lost_node_is_found_by_the_heartbeat_timeout_and_its_late_writes_are_fenced(
        kube_api, tmp_path, s3_server):  # noqa: F811
    """A node lost as a real one is: its pod sends nothing more and no DELETED comes, so
    the master finds the loss by the heartbeat timeout; its force delete removes the pod
    while the process stays frozen there. The replacement takes over; then the node comes
    back and the old process goes on (its writes refused by the fence) until its kubelet
    kills it. The count is exact. Each pod has a temporary folder of its own, and the
    state is on an S3-protocol server (``tests/s3_server.py``), as on a real cluster."""
    import psutil

    state = s3_server.uri("weir-state", "k8s-lost-node")
    app, lines = write_wordcount_app(
        tmp_path, "k8s-lost-node", 3_000, WORDCOUNT_DAG + ", HEARTBEAT_TIMEOUT_MILLIS=5000, "
        f"CHECKPOINT_WINDOW_COUNT=2, STATE_DIR={state!r}", lines_per_window=100)
    with kubernetes_master(kube_api, tmp_path) as master, \
            WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 120,
                 f"a first committed window\n{pod_logs(kube_api)}")
        victim = f"{app_id}-c0"  # source, tokenizer and counter
        [pod] = [p for p in kube_api.pods(NS)
                 if p["metadata"]["labels"][LABEL_CONTAINER] == victim]
        name = pod["metadata"]["name"]
        pid = kube_api.pod_pid(NS, name)
        assert pid is not None
        kube_api.lose_node(NS, name)
        lost = poll_for(lambda: next((c for c in client.containers(app_id)
                                      if c.id == victim and c.state == "KILLED"), None),
                        60, f"{victim} to be found lost\n{pod_logs(kube_api)}")
        assert "heartbeat" in lost.diagnostics, lost.diagnostics  # no watch event came
        poll_for(lambda: name not in {p["metadata"]["name"] for p in kube_api.pods(NS)}, 30,
                 "the lost pod's force delete")
        assert psutil.Process(pid).is_running()  # its process is still there, frozen
        moved = client.application(app_id).committed_window_id
        poll_for(lambda: client.application(app_id).committed_window_id > moved, 120,
                 f"the replacement to commit windows\n{pod_logs(kube_api)}")
        kube_api.restore_node(NS, name)  # the old deployment wakes up and tries to go on
        poll_for(lambda: not psutil.pid_exists(pid)
                 or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
                 "the returning kubelet to kill the old process")
        finished(client, app_id, kube_api)
    counted, _ = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words_of(lines))
    import pyarrow.fs

    store, root = pyarrow.fs.FileSystem.from_uri(state)
    kept = [info.path for info in store.get_file_info(pyarrow.fs.FileSelector(
        root, recursive=True, allow_not_found=True))]
    assert any("/" in p.removeprefix(root) for p in kept), kept  # its checkpoints were there
