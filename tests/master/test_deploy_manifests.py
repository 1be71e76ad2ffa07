"""What a user deploys to Kubernetes (deploy/): every manifest valid against the
Kubernetes API schema, the master's arguments ones `weir master` accepts, its Role
granting what the Kubernetes launcher calls (and no more), the example application
valid, the Dockerfile installing the package with its Kubernetes extra."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from weir.master.cli import build_parser
from weir.operators.app import load_app
from weir.operators.attributes import resolve

pytestmark = pytest.mark.timeout(60)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.30"


def _documents() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_every_manifest_is_valid_kubernetes():
    documents = _documents()
    assert {doc["kind"] for _, doc in documents} >= {
        "Namespace", "ServiceAccount", "Role", "RoleBinding", "Service", "Deployment",
        "PersistentVolumeClaim"}
    for name, doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "weir", name


def _one(kind: str) -> dict:
    [doc] = [doc for _, doc in _documents() if doc["kind"] == kind]
    return doc


def test_the_master_runs_with_arguments_weir_accepts():
    [container] = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.launcher == "kubernetes" and args.k8s_image
    assert args.host == "0.0.0.0" and args.state_dir
    service = _one("Service")
    assert args.advertise_host == f"{service['metadata']['name']}.weir.svc"
    assert args.port in {p["port"] for p in service["spec"]["ports"]}
    accounts = {doc["metadata"]["name"] for _, doc in _documents()
                if doc["kind"] == "ServiceAccount"}
    assert args.k8s_service_account in accounts
    assert _one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] in accounts


def launcher_calls() -> set[tuple[str, str]]:
    """(resource, verb) of every API call the Kubernetes launcher's code makes: its
    ``api.<verb>_namespaced_<resource>`` calls, a list also a watch (it watches)."""
    import re

    source = (DEPLOY.parent / "master" / "kubernetes_launcher.py").read_text()
    calls = set(re.findall(r"api\.(create|read|list|delete)_namespaced_(pod_log|pod|secret)\b",
                           source))
    verbs = {"read": "get"}
    rights = {("pods/log" if kind == "pod_log" else f"{kind}s", verbs.get(verb, verb))
              for verb, kind in calls}
    if ("pods", "list") in rights and "watch.Watch" in source:
        rights.add(("pods", "watch"))
    return rights


def test_the_masters_role_grants_what_the_launcher_calls_and_no_more():
    rules = {(resource, verb) for rule in _one("Role")["rules"]
             for resource in rule["resources"] for verb in rule["verbs"]}
    assert rules == launcher_calls()
    assert rules == {("pods", v) for v in ("create", "list", "watch", "delete")} | {
        ("pods/log", "get")} | {("secrets", v) for v in ("create", "delete")}
    binding = _one("RoleBinding")
    assert binding["roleRef"]["name"] == _one("Role")["metadata"]["name"]


def test_the_namespace_enforces_pod_security_restricted_and_the_master_meets_it():
    labels = _one("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    spec = _one("Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
        assert container[probe]["httpGet"]["port"] in {
            p["containerPort"] for p in container["ports"]}


def test_the_example_application_is_valid_and_asks_for_resources():
    dag = load_app(DEPLOY / "kubernetes" / "wordcount.py")
    assert resolve("CONTAINER_MEMORY_MB", dag.attributes) == 2048
    assert resolve("CONTAINER_CORES", dag.attributes) == 1.0


def test_the_image_installs_weir_with_its_kubernetes_extra():
    """No builder runs here (no Docker daemon, no podman or buildah): the Dockerfile is
    checked for what a build needs (a base whose Debian has Java 17, the non-root user the
    pods run as) rather than built."""
    from weir.master.kubernetes_pods import POD_SECURITY

    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "[kubernetes]" in dockerfile and "openjdk-17" in dockerfile
    assert "FROM python:3.11-slim-bookworm" in dockerfile  # Debian 12 has openjdk-17
    uid = POD_SECURITY["runAsUser"]
    assert f"--uid {uid}" in dockerfile and f"USER {uid}:{uid}" in dockerfile
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)
    assert "/opt/weir/pydoc-topics.txt" in dockerfile  # what the example reads
    assert "/opt/weir/pydoc-topics.txt" in (DEPLOY / "kubernetes" / "wordcount.py").read_text()
