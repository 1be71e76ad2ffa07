"""The Kubernetes launcher through the official client against the test API server (a
fixture whose kubelet runs each pod's command here), without a master: what it creates,
how it reads a pod that waits, ends, is evicted or vanishes, and what it cleans up."""

from __future__ import annotations

import json
import queue
import sys

import pytest

from tests.harness import poll_for
from tests.kubernetes_api import kube_api  # noqa: F401 - the fixture
from weir.master.kubernetes_launcher import KubernetesLauncher
from weir.master.kubernetes_pods import LABEL_CONTAINER
from weir.master.launcher import Resources
from weir.proto.contract import SECRET_ENV, TLS_CA_ENV

pytestmark = pytest.mark.timeout(60)

NS = "weir"
# Stands in for `python -m weir.container`: the image's Python runs this script instead,
# which shows it was handed the credentials file, then waits to be stopped.
FAKE_CONTAINER = """
import json, sys, time
path = sys.argv[sys.argv.index("--secret-file") + 1]
print("SECRET", json.load(open(path))["secret"], flush=True)
time.sleep(120)
"""


@pytest.fixture
def launcher(kube_api, tmp_path):  # noqa: F811 - the fixture
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    script = tmp_path / "fake_container.py"
    script.write_text(FAKE_CONTAINER)
    made = KubernetesLauncher(
        "127.0.0.1:5151", image="weir:test", namespace=NS,
        kubeconfig=str(kube_api.write_kubeconfig(tmp_path / "kubeconfig")),
        command=[sys.executable, str(script)], service_account="weir-container")
    made.set_credentials({SECRET_ENV: "s3cret", TLS_CA_ENV: str(ca)})
    yield made
    made.stop_all(grace_s=1.0)


def _pod(kube_api, container_id):  # noqa: F811
    return next((p for p in kube_api.pods(NS)
                 if p["metadata"]["labels"].get(LABEL_CONTAINER) == container_id), None)


def test_a_container_is_a_pod_with_its_credentials_in_a_secret(launcher, kube_api):  # noqa: F811
    launcher.launch("app-0001-c0", Resources(memory_mb=512, cores=0.5))
    pod = poll_for(lambda: (p := _pod(kube_api, "app-0001-c0"))
                   and p["status"].get("phase") == "Running" and p, 20, "the pod to run")
    [secret] = kube_api.secrets(NS)
    assert json.loads(secret["stringData"]["credentials.json"]
                      if "stringData" in secret else _decoded(secret)) == {
        "secret": "s3cret", "tls_ca_pem": (launcher.credential_env[TLS_CA_ENV] and
                                            open(launcher.credential_env[TLS_CA_ENV]).read())}
    assert "s3cret" not in json.dumps(pod)  # never in the pod spec
    [main] = pod["spec"]["containers"]
    assert main["resources"]["requests"] == {"memory": "512Mi", "cpu": "500m"}
    assert pod["spec"]["serviceAccountName"] == "weir-container"
    name = pod["metadata"]["name"]
    poll_for(lambda: "SECRET s3cret" in kube_api.pod_log(NS, name), 20,
             "the container to read the mounted credentials")
    data, truncated, where = launcher.log("app-0001-c0", 1000)
    assert b"SECRET s3cret" in data and not truncated and where == f"pod {NS}/{name}"
    assert launcher.exit_code("app-0001-c0") is None and launcher.waiting("app-0001-c0") == ""


def _decoded(secret):
    import base64

    return base64.b64decode(secret["data"]["credentials.json"]).decode()


def test_a_pod_that_cannot_be_placed_says_why(launcher, kube_api):  # noqa: F811
    launcher.launch("app-0001-c0", Resources(memory_mb=64 << 10))  # more than the node
    reason = poll_for(lambda: "Insufficient" in (r := launcher.waiting("app-0001-c0")) and r,
                      20, "the scheduler's reason")
    assert reason.startswith("Unschedulable: ") and "Insufficient memory" in reason, reason
    assert launcher.exit_code("app-0001-c0") is None


def test_an_evicted_pod_is_an_ended_container_told_at_once(launcher, kube_api):  # noqa: F811
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    launcher.launch("app-0001-c0")
    name = poll_for(lambda: (p := _pod(kube_api, "app-0001-c0")) and p["status"].get(
        "phase") == "Running" and p["metadata"]["name"], 20, "the pod to run")
    poll_for(lambda: "SECRET" in kube_api.pod_log(NS, name), 20, "the container to start")
    kube_api.evict(NS, name)
    assert told.get(timeout=20) == "app-0001-c0"
    assert launcher.exit_code("app-0001-c0") in (137, -9)  # SIGKILLed, however it is told
    # released: the pod is deleted, its log kept for `weir logs`
    poll_for(lambda: _pod(kube_api, "app-0001-c0") is None, 20, "the ended pod's deletion")
    assert b"SECRET s3cret" in launcher.log("app-0001-c0", 1000)[0]


def test_a_vanished_pod_is_an_ended_container(launcher, kube_api):  # noqa: F811
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    launcher.launch("app-0001-c1")
    name = poll_for(lambda: (p := _pod(kube_api, "app-0001-c1")) and p["metadata"]["name"],
                    20, "the pod")
    kube_api.vanish(NS, name)
    assert told.get(timeout=20) == "app-0001-c1"
    assert launcher.exit_code("app-0001-c1") == -9
    assert "its pod was deleted" in launcher.exit_reason("app-0001-c1")


def test_a_pod_a_relist_lacks_is_ended_if_it_existed_when_listed(launcher, kube_api):  # noqa: F811
    """A deletion while the watch was broken sends no event: the next list tells it."""
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    launcher.launch("app-0001-c1")
    poll_for(lambda: _pod(kube_api, "app-0001-c1"), 20, "the pod")
    created_s = launcher._pods["app-0001-c1"].created_s
    assert created_s > 0
    launcher._missing(set(), asked_s=created_s - 1)  # a list asked before the create
    assert told.empty() and launcher.exit_code("app-0001-c1") is None
    launcher._missing(set(), asked_s=created_s + 1)
    assert told.get(timeout=5) == "app-0001-c1"
    assert launcher.exit_code("app-0001-c1") == -9
    assert "deleted" in launcher.exit_reason("app-0001-c1")


def test_kill_deletes_the_pod_and_stop_all_the_secret_too(launcher, kube_api):  # noqa: F811
    launcher.launch("app-0001-c0")
    launcher.launch("app-0001-c1")
    poll_for(lambda: len(kube_api.pods(NS)) == 2, 20, "two pods")
    launcher.kill("app-0001-c0")
    poll_for(lambda: _pod(kube_api, "app-0001-c0") is None, 20, "the killed pod to go")
    assert launcher.exit_code("app-0001-c0") == -9 and _pod(kube_api, "app-0001-c1")
    launcher.stop_all(grace_s=1.0)
    assert kube_api.pods(NS) == [] and kube_api.secrets(NS) == []
    with pytest.raises(KeyError):
        launcher.log("app-0001-c9", 10)


def test_a_restarted_master_adopts_its_pods_and_learns_of_gone_ones(
        launcher, kube_api, tmp_path):  # noqa: F811 - the fixture
    launcher.launch("app-0001-c0")
    launcher.launch("app-0001-c1")
    poll_for(lambda: len([p for p in kube_api.pods(NS) if p["status"].get("phase")
                          == "Running"]) == 2, 20, "two running pods")
    kube_api.vanish(NS, launcher.pod_name("app-0001-c1"))  # while no master watched
    # a new master process: same secret (kept in its state folder), so the same tag
    again = KubernetesLauncher(
        "127.0.0.1:5151", image="weir:test", namespace=NS,
        kubeconfig=str(kube_api.write_kubeconfig(tmp_path / "kubeconfig2")))
    again.set_credentials(launcher.credential_env)
    assert again.tag == launcher.tag
    told: queue.Queue[str] = queue.Queue()
    again.on_exit = told.put
    try:
        again.adopt("app-0001-c0", 0, "")
        again.adopt("app-0001-c1", 0, "")
        assert told.get(timeout=20) == "app-0001-c1" and again.exit_code("app-0001-c1") == -9
        assert again.exit_code("app-0001-c0") is None
        again.kill("app-0001-c0")  # it may delete what it adopted
        poll_for(lambda: _pod(kube_api, "app-0001-c0") is None, 20, "the adopted pod to go")
    finally:
        again.stop_all(grace_s=1.0)


def test_a_watch_that_fails_is_the_launchers_trouble(launcher, kube_api):  # noqa: F811
    launcher.launch("app-0001-c0")
    poll_for(lambda: _pod(kube_api, "app-0001-c0"), 20, "the pod")
    assert launcher.trouble() == ""
    kube_api.stop()  # the API server goes away: the watch breaks and cannot list again
    trouble = poll_for(launcher.trouble, 30, "the watch's failure")
    assert trouble.startswith(f"watching pods in namespace {NS} fails since ")
