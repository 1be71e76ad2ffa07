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
        "CHECKPOINT_WINDOW_COUNT=2, CONTAINER_MEMORY_MB=1536, SPARE_CONTAINERS=1",
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
