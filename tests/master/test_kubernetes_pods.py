"""The Kubernetes launcher's manifests and its reading of pod states, without a cluster;
and `weir master`'s launcher options (a kubernetes option without that launcher is
refused, since it would do nothing)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from weir.master.cli_processes import launcher_options
from weir.master.kubernetes_pods import (
    CREDENTIALS_MOUNT,
    LABEL_CONTAINER,
    LABEL_MASTER,
    PodView,
    load_pod_template,
    pod_manifest,
    secret_manifest,
)
from weir.master.launcher import NO_REQUEST, Resources, launcher_factory

pytestmark = pytest.mark.timeout(30)


def _pod(template=None, resources=NO_REQUEST):
    return pod_manifest(template, name="weir-ab12-app-0001-c0", container_id="app-0001-c0",
                        master_tag="ab12", image="weir:dev", command=["python", "-m",
                                                                      "weir.container"],
                        args=["--master", "m:5151", "--id", "app-0001-c0"],
                        secret_name="weir-ab12-credentials", resources=resources,
                        service_account="weir-containers")


def test_a_pod_carries_the_container_the_credentials_and_the_request():
    pod = _pod(resources=Resources(memory_mb=2048, cores=1.5))
    assert pod["metadata"]["labels"][LABEL_CONTAINER] == "app-0001-c0"
    assert pod["metadata"]["labels"][LABEL_MASTER] == "ab12"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == "weir-containers"
    [main] = spec["containers"]
    assert main["image"] == "weir:dev" and main["command"] == ["python", "-m", "weir.container"]
    assert main["args"][-2:] == ["--secret-file", f"{CREDENTIALS_MOUNT}/credentials.json"]
    assert main["resources"] == {"requests": {"memory": "2048Mi", "cpu": "1500m"},
                                 "limits": {"memory": "2048Mi"}}
    # the secret is a file from a read-only Secret volume: not in an argument or the env
    text = json.dumps(pod)
    assert "WEIR_SECRET" not in text and "tls_ca_pem" not in text
    volume, scratch = spec["volumes"]
    assert volume["secret"] == {"secretName": "weir-ab12-credentials", "defaultMode": 0o400}
    # its temporary folder is an emptyDir: Spark's scratch, not a pod's 64 MiB /dev/shm
    assert scratch == {"name": "weir-scratch", "emptyDir": {}}
    assert main["volumeMounts"] == [
        {"name": volume["name"], "mountPath": CREDENTIALS_MOUNT, "readOnly": True},
        {"name": "weir-scratch", "mountPath": "/var/tmp/weir"}]
    assert {"name": "TMPDIR", "value": "/var/tmp/weir"} in main["env"]


def test_a_pod_runs_as_a_non_root_user_without_privileges_unless_its_template_says():
    """Pod Security ``restricted``: a non-root user whose group (fsGroup) reads the
    credentials, the runtime's seccomp profile, no privilege escalation, no capability."""
    spec = _pod()["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"}}
    [main] = spec["containers"]
    assert main["securityContext"] == {"allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"]}}
    template = {"spec": {"securityContext": {"runAsUser": 2000, "fsGroup": 2000},
                         "containers": [{"name": "weir", "securityContext": {
                             "readOnlyRootFilesystem": True}}]}}
    spec = _pod(template)["spec"]
    assert spec["securityContext"] == {"runAsUser": 2000, "fsGroup": 2000}
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True}


def test_no_request_leaves_the_resources_alone():
    [main] = _pod()["spec"]["containers"]
    assert "resources" not in main


def test_the_template_keeps_what_weir_does_not_set(tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text("""
apiVersion: v1
kind: Pod
metadata:
  labels: {team: streams}
spec:
  nodeSelector: {disk: ssd}
  tolerations: [{key: dedicated, operator: Equal, value: weir, effect: NoSchedule}]
  containers:
    - name: sidecar
      image: busybox
    - name: weir
      image: ignored
      env: [{name: TZ, value: UTC}]
      volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {}}]
""")
    pod = _pod(load_pod_template(str(path)))
    assert pod["metadata"]["labels"]["team"] == "streams"
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    sidecar, main = pod["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert main["image"] == "weir:dev"
    assert {"name": "TZ", "value": "UTC"} in main["env"]
    assert [m["mountPath"] for m in main["volumeMounts"]] == [
        "/scratch", CREDENTIALS_MOUNT, "/var/tmp/weir"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == [
        "scratch", "weir-credentials", "weir-scratch"]


@pytest.mark.parametrize(("text", "error"), [
    ("kind: Deployment\nspec: {}\n", "one Pod manifest"),
    ("kind: Pod\nspec: {}\n", "no spec.containers"),
    ("kind: [Pod\n", "not YAML or JSON"),
])
def test_a_bad_template_is_refused_saying_why(tmp_path, text, error):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_pod_template(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        load_pod_template(str(tmp_path / "missing.yaml"))


def test_the_secret_holds_the_masters_secret_file():
    secret = secret_manifest("weir-ab12-credentials", "ab12", '{"secret": "s"}')
    assert secret["stringData"] == {"credentials.json": '{"secret": "s"}'}
    assert secret["metadata"]["labels"][LABEL_MASTER] == "ab12"


def test_pod_states_as_the_master_needs_them():
    view = PodView("p")
    assert view.waiting  # created, not yet running
    view.update("MODIFIED", {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient memory."}]}}, deleting=False)
    assert view.waiting == "Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
    view.update("MODIFIED", {"status": {"phase": "Pending", "container_statuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}},
        deleting=False)
    assert view.waiting == "ImagePullBackOff: no such image"
    view.update("MODIFIED", {"status": {"phase": "Running"}}, deleting=False)
    assert view.waiting == "" and view.exit_code is None
    view.update("MODIFIED", {"status": {"phase": "Failed", "container_statuses": [
        {"state": {"terminated": {"exit_code": 137, "reason": "OOMKilled"}}}]}},
        deleting=False)
    assert view.exit_code == 137 and "OOMKilled" in view.ending
    view.update("DELETED", {}, deleting=False)
    assert view.gone and view.exit_code == 137  # the first ending counts


def test_an_evicted_or_vanished_pod_has_ended():
    evicted = PodView("p")
    evicted.update("MODIFIED", {"status": {"phase": "Failed", "reason": "Evicted",
                                           "message": "low on memory"}}, deleting=False)
    assert evicted.exit_code == -9 and evicted.ending.startswith("Evicted, low on memory")
    vanished = PodView("q")
    vanished.update("MODIFIED", {"status": {"phase": "Running"}}, deleting=False)
    vanished.update("DELETED", {"status": {"phase": "Running"}}, deleting=False)
    assert vanished.exit_code == -9 and "node lost" in vanished.ending


def _args(launcher="local", **given):
    options = {"launcher": launcher, "log_dir": None, "k8s_image": None,
               "k8s_namespace": None, "kubeconfig": None, "k8s_service_account": "",
               "k8s_pod_template": None, "ray_address": None}
    return argparse.Namespace(**{**options, **given})


def test_a_launchers_options_go_to_it_and_no_other():
    assert launcher_options(_args("kubernetes", k8s_image="weir:1", k8s_namespace="s")) == {
        "image": "weir:1", "namespace": "s"}
    assert launcher_options(_args("ray", ray_address="10.0.0.1:6379")) == {
        "address": "10.0.0.1:6379"}
    assert launcher_options(_args("ray")) == {}
    assert launcher_options(_args(log_dir="/tmp/x")) == {"log_dir": "/tmp/x"}
    with pytest.raises(ValueError, match="needs --k8s-image"):
        launcher_options(_args("kubernetes"))
    with pytest.raises(ValueError, match="--k8s-image do not apply to --launcher local"):
        launcher_options(_args(k8s_image="weir:1"))
    with pytest.raises(ValueError, match="--ray-address do not apply to --launcher kube"):
        launcher_options(_args("kubernetes", k8s_image="weir:1", ray_address="x:1"))


@pytest.mark.parametrize(("name", "options"), [("kubernetes", {"image": "weir:1"}),
                                               ("ray", {})])
def test_a_missing_client_library_is_named_with_how_to_install_it(monkeypatch, name, options):
    monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(ValueError, match=rf"needs the {name} package: pip install "
                                         rf"'weir-streams\[{name}\]'"):
        launcher_factory(name, **options)("127.0.0.1:1")
