"""The Kubernetes API server for tests (``tests/kubernetes_api.py``), driven through the
official client as a launcher would: if it drifts from what the client expects, the
launcher's tests would prove nothing."""

from __future__ import annotations

import base64
import json
import os
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
import psutil
import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness import poll_for
from tests.kubernetes_api import KubernetesTestApi, kube_api  # noqa: F401 - the fixture
from tests.kubernetes_kubelet import ObjectStore, parse_quantity

pytestmark = pytest.mark.timeout(60)

NS = "weir-jobs"
SLEEP = "import time; print('up', flush=True); time.sleep(60)"


@pytest.fixture
def core(kube_api: KubernetesTestApi) -> Iterator[kubernetes.client.CoreV1Api]:  # noqa: F811
    with kubernetes.client.ApiClient(kube_api.configuration()) as client:
        yield kubernetes.client.CoreV1Api(client)


def pod_body(name: str, code: str, *, labels: dict[str, str] | None = None,
             memory: str | None = None, fs_group: int | None = None,
             **container: Any) -> dict[str, Any]:
    volumes = container.pop("volumes", [])
    resources = {"requests": {"memory": memory}} if memory else {}
    security = {"securityContext": {"fsGroup": fs_group}} if fs_group is not None else {}
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "volumes": volumes, **security, "containers": [
                {"name": "main", "image": "weir:test", "command": [sys.executable, "-c", code],
                 "resources": resources, **container}]}}


def phase(core: kubernetes.client.CoreV1Api, name: str, wanted: str) -> kubernetes.client.V1Pod:
    def reached() -> kubernetes.client.V1Pod | None:
        pod = core.read_namespaced_pod(name, NS)
        return pod if pod.status.phase == wanted else None
    return poll_for(reached, 10, f"pod {name} {wanted}", interval_s=0.05)


def first_events(list_call: Any, *args: Any, count: int, **kwargs: Any) -> list[dict[str, Any]]:
    """A watch's first ``count`` events (fewer if its 5 s pass first)."""
    watch, events = kubernetes.watch.Watch(), []
    for event in watch.stream(list_call, *args, timeout_seconds=5, **kwargs):
        events.append(event)
        if len(events) == count:
            watch.stop()
    return events


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever adopted it counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def started(kube_api: KubernetesTestApi, name: str) -> int:  # noqa: F811
    """The pod's pid once its process printed its first line."""
    poll_for(lambda: kube_api.pod_log(NS, name), 10, f"pod {name}'s first output", 0.05)
    pid = kube_api.pod_pid(NS, name)
    assert pid is not None
    return pid


def test_requests_need_the_token(kube_api: KubernetesTestApi) -> None:  # noqa: F811
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{kube_api.url}/api/v1/namespaces/{NS}/pods", timeout=5)
    assert refused.value.code == 401
    assert json.loads(refused.value.read())["reason"] == "Unauthorized"
    config = kube_api.configuration()
    config.api_key = {"authorization": "not-the-token"}
    with kubernetes.client.ApiClient(config) as client:
        with pytest.raises(ApiException) as wrong:
            kubernetes.client.CoreV1Api(client).list_namespaced_pod(NS)
    assert wrong.value.status == 401
    with kubernetes.client.ApiClient(kube_api.configuration()) as client:
        assert kubernetes.client.VersionApi(client).get_code().git_version == "v1.30.0-weir-test"
        assert kubernetes.client.CoreApi(client).get_api_versions().versions == ["v1"]
    assert ("GET", f"/api/v1/namespaces/{NS}/pods") in kube_api.requests


def test_secrets_are_created_read_listed_and_deleted(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    body = kubernetes.client.V1Secret(
        metadata=kubernetes.client.V1ObjectMeta(name="weir-creds", labels={"app": "weir"}),
        data={"a": base64.b64encode(b"one").decode()}, string_data={"b": "two"})
    created = core.create_namespaced_secret(NS, body)
    assert created.type == "Opaque" and created.metadata.uid and created.string_data is None
    read = core.read_namespaced_secret("weir-creds", NS)
    assert {k: base64.b64decode(v) for k, v in read.data.items()} == {"a": b"one", "b": b"two"}
    assert read.metadata.namespace == NS and read.metadata.creation_timestamp is not None
    listed = core.list_namespaced_secret(NS, label_selector="app=weir")
    assert [s.metadata.name for s in listed.items] == ["weir-creds"]
    assert int(listed.metadata.resource_version) >= int(read.metadata.resource_version)
    assert core.list_namespaced_secret("elsewhere").items == []
    with pytest.raises(ApiException) as duplicate:
        core.create_namespaced_secret(NS, body)
    assert duplicate.value.status == 409
    assert json.loads(duplicate.value.body)["reason"] == "AlreadyExists"
    core.delete_namespaced_secret("weir-creds", NS)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret("weir-creds", NS)
    assert missing.value.status == 404
    assert kube_api.secrets(NS) == []


def test_a_pod_reads_its_secret_volume_and_env_and_succeeds(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    core.create_namespaced_secret(NS, {"metadata": {"name": "creds"}, "stringData": {
        "secret.json": json.dumps({"port": 7077}), "token": "s3cr3t"}})
    script = textwrap.dedent("""
        import os, stat
        path = "/var/run/weir/secret.json"
        print("file", open(path).read(), oct(stat.S_IMODE(os.stat(path).st_mode)))
        print("link", os.readlink(path), os.readlink(os.path.join(os.path.dirname(path),
                                                                  "..data"))[:4])
        print("env", os.environ["WEIR_TOKEN"], os.environ["POD_NAME"], os.environ["POD_IP"])
        print("dir", os.path.isfile(os.path.join(os.environ["WEIR_DIR"], "secret.json")))
        """)
    core.create_namespaced_pod(NS, pod_body(
        "reader", script,
        volumes=[{"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400,
                                              "items": [{"key": "secret.json",
                                                         "path": "secret.json"}]}}],
        volumeMounts=[{"name": "creds", "mountPath": "/var/run/weir", "readOnly": True}],
        env=[{"name": "WEIR_TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds",
                                                                     "key": "token"}}},
             {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
             {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
             {"name": "WEIR_DIR", "value": "/var/run/weir"}]))
    pod = phase(core, "reader", "Succeeded")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert pod.spec.node_name == "weir-test-node" and pod.status.pod_ip == "127.0.0.1"
    log = core.read_namespaced_pod_log("reader", NS)
    assert log == kube_api.pod_log(NS, "reader")
    assert ('file {"port": 7077} 0o400\nlink ..data/secret.json ..20\n'
            'env s3cr3t reader 127.0.0.1\ndir True\n') == log
    assert core.read_namespaced_pod_log("reader", NS, tail_lines=1) == "dir True\n"
    assert kube_api.pod_pid(NS, "reader") is None


def test_a_secret_volume_with_the_pods_fs_group_is_group_readable_in_that_group(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    """As the kubelet's SetVolumeOwnership does for a read-only volume: 0400 shows as 0440,
    its group the pod's fsGroup."""
    core.create_namespaced_secret(NS, {"metadata": {"name": "grouped"},
                                       "stringData": {"key": "v"}})
    script = ("import os, stat; s = os.stat('/var/run/weir/key'); "
              "print(oct(stat.S_IMODE(s.st_mode)), s.st_gid)")
    core.create_namespaced_pod(NS, pod_body(
        "grouped", script, fs_group=os.getgid(),
        volumes=[{"name": "g", "secret": {"secretName": "grouped", "defaultMode": 0o400}}],
        volumeMounts=[{"name": "g", "mountPath": "/var/run/weir", "readOnly": True}]))
    phase(core, "grouped", "Succeeded")
    assert core.read_namespaced_pod_log("grouped", NS) == f"0o440 {os.getgid()}\n"


def test_a_watch_sees_a_pod_run_and_fail_and_resumes_from_a_version(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    core.create_namespaced_pod(NS, pod_body("other", "pass", labels={"app": "other"}))
    core.create_namespaced_pod(NS, pod_body("before", "pass", labels={"app": "weir"}))
    phase(core, "before", "Succeeded")
    watch, seen = kubernetes.watch.Watch(), []
    for event in watch.stream(core.list_namespaced_pod, NS, label_selector="app=weir",
                              timeout_seconds=10):
        seen.append(event)
        if len(seen) == 1:  # the watch is open (it begins with the pods there): start one
            core.create_namespaced_pod(NS, pod_body("failing", "import sys; sys.exit(3)",
                                                    labels={"app": "weir"}))
        if event["object"].status.phase == "Failed":
            watch.stop()
    kinds = [(e["type"], e["object"].metadata.name, e["object"].status.phase) for e in seen]
    assert kinds == [("ADDED", "before", "Succeeded"), ("ADDED", "failing", "Pending"),
                     ("MODIFIED", "failing", "Running"), ("MODIFIED", "failing", "Failed")]
    terminated = seen[-1]["object"].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert seen[-1]["object"].status.conditions[0].type == "PodScheduled"
    resumed = [(e["type"], e["object"].status.phase) for e in first_events(
        core.list_namespaced_pod, NS, label_selector="app=weir", count=2,
        resource_version=seen[1]["object"].metadata.resource_version)]
    assert resumed == [("MODIFIED", "Running"), ("MODIFIED", "Failed")]


def test_a_watch_from_a_version_older_than_the_history_is_told_410(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ObjectStore, "history_size", 2)
    with KubernetesTestApi(tmp_path / "kube") as api, \
            kubernetes.client.ApiClient(api.configuration()) as client:
        core = kubernetes.client.CoreV1Api(client)
        for name in ("a", "b", "c", "d"):  # versions 1 to 4: the history keeps 3 and 4
            core.create_namespaced_secret(NS, {"metadata": {"name": name}})
        with pytest.raises(ApiException) as expired:
            list(kubernetes.watch.Watch().stream(core.list_namespaced_secret, NS,
                                                 resource_version="1", timeout_seconds=5))
        assert expired.value.status == 410
        names = [e["object"].metadata.name for e in first_events(
            core.list_namespaced_secret, NS, resource_version="2", count=2)]
        assert names == ["c", "d"]


def test_deleting_a_running_pod_stops_its_processes_then_removes_it(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {SLEEP!r}])
        print(child.pid, flush=True)
        time.sleep(60)
        """)
    core.create_namespaced_pod(NS, pod_body("worker", script))
    pid = started(kube_api, "worker")
    grandchild = next(int(w) for w in kube_api.pod_log(NS, "worker").split() if w.isdigit())
    version = core.read_namespaced_pod("worker", NS).metadata.resource_version
    deleted = core.delete_namespaced_pod("worker", NS)
    assert deleted.metadata.deletion_timestamp is not None
    events = [(e["type"], e["object"].metadata.deletion_timestamp is not None)
              for e in first_events(core.list_namespaced_pod, NS, resource_version=version,
                                    count=2)]
    assert events == [("MODIFIED", True), ("DELETED", True)]
    assert gone(pid) and poll_for(lambda: gone(grandchild), 5, "the grandchild gone")
    assert kube_api.pods(NS) == [] and kube_api.pod_pid(NS, "worker") is None
    assert ("DELETE", f"/api/v1/namespaces/{NS}/pods/worker") in kube_api.requests


def test_a_pod_that_ignores_sigterm_is_killed_after_its_grace(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    script = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEP
    core.create_namespaced_pod(NS, pod_body("stubborn", script))
    pid = started(kube_api, "stubborn")
    core.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
    assert core.read_namespaced_pod("stubborn", NS).metadata.deletion_grace_period_seconds == 1
    assert not gone(pid)  # SIGTERM ignored
    poll_for(lambda: not kube_api.pods(NS), 5, "the pod removed after its grace")
    assert gone(pid)


def test_an_evicted_pod_fails_and_stays(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    core.create_namespaced_pod(NS, pod_body("evicted", SLEEP))
    pid = started(kube_api, "evicted")
    kube_api.evict(NS, "evicted")
    assert gone(pid)
    pod = core.read_namespaced_pod("evicted", NS)
    assert (pod.status.phase, pod.status.reason) == ("Failed", "Evicted")
    assert pod.status.message == "The node was low on resource: memory."
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["evicted"]


def test_a_vanished_pod_is_deleted(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    core.create_namespaced_pod(NS, pod_body("lost", SLEEP))
    pid = started(kube_api, "lost")
    version = core.read_namespaced_pod("lost", NS).metadata.resource_version
    kube_api.vanish(NS, "lost")
    assert gone(pid)
    events = [(e["type"], e["object"].metadata.name) for e in first_events(
        core.list_namespaced_pod, NS, resource_version=version, count=1)]
    assert events == [("DELETED", "lost")]
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("lost", NS)
    assert missing.value.status == 404
    with pytest.raises(KeyError):
        kube_api.evict(NS, "lost")


def test_a_lost_nodes_pod_sends_nothing_and_a_force_delete_leaves_its_process_running(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    """A lost node: the process freezes, the pod stays Running and no event comes; a
    graceful delete leaves it Terminating; a force delete removes the object while the
    process stays; back, the process goes on until the kubelet kills it."""
    core.create_namespaced_pod(NS, pod_body("far", SLEEP))
    pid = started(kube_api, "far")
    version = core.read_namespaced_pod("far", NS).metadata.resource_version
    kube_api.lose_node(NS, "far")
    poll_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10,
             "the lost node's process to freeze")
    assert first_events(core.list_namespaced_pod, NS, resource_version=version, count=1) == []
    core.delete_namespaced_pod("far", NS, grace_period_seconds=30)
    pod = core.read_namespaced_pod("far", NS)
    assert pod.metadata.deletion_timestamp and pod.status.phase == "Running"
    core.delete_namespaced_pod("far", NS, grace_period_seconds=0)  # a force delete
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("far", NS)
    assert missing.value.status == 404
    assert psutil.Process(pid).is_running()  # its node never heard of the delete
    kube_api.restore_node(NS, "far")
    poll_for(lambda: gone(pid), 10, "the returning kubelet to kill the pod's process")


def test_a_pod_that_does_not_fit_waits_for_room(tmp_path: Path) -> None:
    with KubernetesTestApi(tmp_path / "kube", node_memory_mb=1024, node_cores=1) as api, \
            kubernetes.client.ApiClient(api.configuration()) as client:
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespaced_pod(NS, pod_body("big", SLEEP, memory="768Mi"))
        started(api, "big")
        core.create_namespaced_pod(NS, pod_body("next", SLEEP, memory="0.5Gi"))
        condition = core.read_namespaced_pod("next", NS).status.conditions[0]
        assert (condition.type, condition.status, condition.reason) == (
            "PodScheduled", "False", "Unschedulable")
        assert condition.message == "0/1 nodes are available: 1 Insufficient memory."
        core.create_namespaced_pod(NS, pod_body("cpu", SLEEP, resources={
            "limits": {"cpu": "1500m"}}))
        assert "1 Insufficient cpu." in core.read_namespaced_pod(
            "cpu", NS).status.conditions[0].message
        assert core.read_namespaced_pod("next", NS).spec.node_name is None
        core.delete_namespaced_pod("big", NS)
        phase(core, "next", "Running")
        assert core.read_namespaced_pod("cpu", NS).status.phase == "Pending"
        deleted = core.delete_namespaced_pod("cpu", NS)  # never started: it goes at once
        assert deleted.metadata.deletion_timestamp is not None
        assert [p["metadata"]["name"] for p in api.pods(NS)] == ["next"]
        with pytest.raises(ApiException) as missing:
            core.delete_namespaced_pod("cpu", NS)
        assert missing.value.status == 404


def test_a_pod_waits_for_its_secret(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    core.create_namespaced_pod(NS, pod_body(
        "early", "print(open('/etc/weir/key').read())",
        volumes=[{"name": "key", "secret": {"secretName": "late"}}],
        volumeMounts=[{"name": "key", "mountPath": "/etc/weir"}]))
    pod = core.read_namespaced_pod("early", NS)
    assert pod.status.phase == "Pending" and 'secret "late" not found' in pod.status.message
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting.reason == "ContainerCreating"
    core.create_namespaced_secret(NS, {"metadata": {"name": "late"}, "stringData": {
        "key": "opened"}})
    phase(core, "early", "Succeeded")
    assert kube_api.pod_log(NS, "early") == "opened\n"


def test_invalid_objects_and_methods_are_refused(
        core: kubernetes.client.CoreV1Api) -> None:
    def refused(body: dict[str, Any]) -> tuple[int, str]:
        with pytest.raises(ApiException) as error:
            core.create_namespaced_pod(NS, body)
        return error.value.status, json.loads(error.value.body)["reason"]

    assert refused(pod_body("Not_A_Name", "pass")) == (422, "Invalid")
    assert refused(pod_body("bad-label", "pass", labels={"app": "-x"})) == (422, "Invalid")
    two = pod_body("two", "pass")
    two["spec"]["containers"].append({**two["spec"]["containers"][0], "name": "second"})
    assert refused(two) == (422, "Invalid")
    always = pod_body("always", "pass")
    del always["spec"]["restartPolicy"]  # Kubernetes' default: Always
    assert refused(always) == (422, "Invalid")
    assert refused(pod_body("huge", "pass", memory="lots")) == (422, "Invalid")
    assert refused(pod_body("imageless", "pass", image=None)) == (422, "Invalid")
    core.create_namespaced_pod(NS, pod_body("fine", "pass"))
    with pytest.raises(ApiException) as replaced:
        core.replace_namespaced_pod("fine", NS, pod_body("fine", "pass"))
    assert replaced.value.status == 405
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["fine"]


def test_a_command_that_cannot_start_fails_its_pod(
        core: kubernetes.client.CoreV1Api) -> None:
    body = pod_body("", "pass")
    body["metadata"] = {"generateName": "nothing-"}
    body["spec"]["containers"][0]["command"] = ["/nonexistent/weir-test-binary"]
    name = core.create_namespaced_pod(NS, body).metadata.name
    assert name.startswith("nothing-") and len(name) == len("nothing-") + 5
    terminated = phase(core, name, "Failed").status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (128, "StartError")


def test_label_selectors_filter_lists(
        kube_api: KubernetesTestApi, core: kubernetes.client.CoreV1Api) -> None:  # noqa: F811
    for name, labels in (("w1", {"app": "weir", "role": "worker"}), ("m1", {"app": "weir"}),
                         ("x1", {"app": "spark", "role": "worker"})):
        core.create_namespaced_pod(NS, pod_body(name, "pass", labels=labels))

    def names(selector: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(
            NS, label_selector=selector).items]

    assert names("app=weir") == ["w1", "m1"]
    assert names("app!=weir") == ["x1"]
    assert names("role") == ["w1", "x1"]
    assert names("!role") == ["m1"]
    assert names("app==weir,role=worker") == ["w1"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(
        field_selector="metadata.name=m1").items] == ["m1"]
    with pytest.raises(ApiException) as unparsed:
        names("app in (weir)")
    assert unparsed.value.status == 400


def test_a_kubeconfig_reaches_the_server(
        kube_api: KubernetesTestApi, tmp_path: Path) -> None:  # noqa: F811
    path = kube_api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    assert path.stat().st_mode & 0o777 == 0o600
    _, current = kubernetes.config.list_kube_config_contexts(config_file=str(path))
    assert current["context"]["namespace"] == NS
    with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespaced_secret(NS, {"metadata": {"name": "via-kubeconfig"}})
        assert [s.metadata.name for s in core.list_namespaced_secret(NS).items] == [
            "via-kubeconfig"]


def test_stop_kills_every_pod_and_is_idempotent(tmp_path: Path) -> None:
    api = KubernetesTestApi(tmp_path / "kube").start()
    try:
        with kubernetes.client.ApiClient(api.configuration()) as client:
            kubernetes.client.CoreV1Api(client).create_namespaced_pod(NS, pod_body("p", SLEEP))
        pid = started(api, "p")
    finally:
        api.stop()
    assert gone(pid)
    api.stop()


def test_quantities() -> None:
    assert parse_quantity("512Mi") == 512 * 2**20
    assert parse_quantity("1Gi") == 2**30 and parse_quantity("4Ki") == 4096
    assert parse_quantity("1G") == parse_quantity("1000M") == parse_quantity("1e9") == 1e9
    assert parse_quantity("123") == 123
    assert parse_quantity("500m") == parse_quantity("0.5") == 0.5
    assert parse_quantity("2") == 2
    with pytest.raises(ValueError):
        parse_quantity("2 cores")
