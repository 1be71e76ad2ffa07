"""What the Kubernetes launcher sends and reads: a container's pod and the credentials
Secret as manifests (plain dicts, the API's camelCase), and a pod's state as the master
needs it (still waiting to be placed, and why; ended, with which exit code)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from weir.master.launcher import Resources
from weir.proto.contract import CONTAINER_ID_ENV

__all__ = [
    "CREDENTIALS_FILE",
    "CREDENTIALS_MOUNT",
    "LABEL_CONTAINER",
    "LABEL_MASTER",
    "PodView",
    "load_pod_template",
    "pod_manifest",
    "secret_manifest",
]

LABEL_NAME = "app.kubernetes.io/name"
LABEL_MASTER = "weir.dev/master"
LABEL_APPLICATION = "weir.dev/application"
LABEL_CONTAINER = "weir.dev/container"
WEIR_UID = 10001
"""The image's user (``deploy/Dockerfile``) and the pods' fsGroup: the Secret volume's key
is the container's to read (0440, group 10001), no one else's."""
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": WEIR_UID, "runAsGroup": WEIR_UID,
                "fsGroup": WEIR_UID, "seccompProfile": {"type": "RuntimeDefault"}}
"""A pod's securityContext unless its template sets one (Pod Security ``restricted``)."""
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
"""Weir's container's securityContext, under what its template sets."""
SCRATCH_MOUNT = "/var/tmp/weir"
"""An emptyDir every pod gets as its temporary folder (``TMPDIR``): Spark's scratch and the
windows handed to it, which a pod's 64 MiB ``/dev/shm`` cannot hold, on the node's disk
and counted against the pod's ephemeral storage, not its root filesystem."""
_SCRATCH = "weir-scratch"
CREDENTIALS_MOUNT = "/var/run/weir"
CREDENTIALS_FILE = "credentials.json"
_VOLUME = "weir-credentials"


def load_pod_template(path: str) -> dict[str, Any]:
    """A Pod manifest from a YAML or JSON file, checked to be one.

    Raises:
        ValueError: unreadable, not a Pod, or without containers.
    """
    import yaml  # noqa: PLC0415 - comes with the kubernetes client

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the pod template {path}: {exc.strerror}") from None
    try:
        template = yaml.safe_load(text) if not text.lstrip().startswith("{") else json.loads(
            text)
    except (yaml.YAMLError, ValueError) as exc:
        raise ValueError(f"the pod template {path} is not YAML or JSON: {exc}") from None
    if not isinstance(template, dict) or template.get("kind", "Pod") != "Pod":
        raise ValueError(f"the pod template {path} must be one Pod manifest (kind: Pod)")
    if not (template.get("spec") or {}).get("containers"):
        raise ValueError(f"the pod template {path} has no spec.containers: give it one "
                         "container (its image and command are Weir's)")
    return template


def pod_manifest(template: dict[str, Any] | None, *, name: str, container_id: str,
                 master_tag: str, image: str, command: list[str], args: list[str],
                 secret_name: str, resources: Resources, service_account: str
                 ) -> dict[str, Any]:
    """The pod of one container: the template's (if any) with Weir's container filled in.

    The credentials are a read-only Secret volume (mode 0400; 0440 with the pod's
    fsGroup) the container reads with ``--secret-file``; the pod runs as the image's
    non-root user (``POD_SECURITY``, unless the template sets a securityContext), without
    privilege escalation or capabilities; requests are the application's
    CONTAINER_MEMORY_MB (also the limit: a container over it is killed, not the node) and
    CONTAINER_CORES (no limit: a CPU limit throttles a container's Spark without need).
    """
    pod = template or {"spec": {"containers": [{}]}}
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    metadata = pod.setdefault("metadata", {})
    metadata["name"] = name
    metadata.pop("namespace", None)  # the launcher's
    metadata.setdefault("labels", {}).update({
        LABEL_NAME: "weir-container", LABEL_MASTER: master_tag,
        LABEL_APPLICATION: container_id.rsplit("-", 1)[0], LABEL_CONTAINER: container_id})
    spec = pod["spec"]
    spec["restartPolicy"] = "Never"  # the master decides recovery, never the kubelet
    spec.setdefault("securityContext", copy.deepcopy(POD_SECURITY))
    if service_account:
        spec["serviceAccountName"] = service_account
    containers = spec["containers"]
    main = next((c for c in containers if c.get("name") == "weir"), containers[0])
    main.update(name=main.get("name") or "weir", image=image, command=command,
                args=[*args, "--secret-file", f"{CREDENTIALS_MOUNT}/{CREDENTIALS_FILE}"])
    main["securityContext"] = {**CONTAINER_SECURITY, **(main.get("securityContext") or {})}
    env = [e for e in main.get("env") or [] if e.get("name") != CONTAINER_ID_ENV]
    main["env"] = [*env, {"name": CONTAINER_ID_ENV, "value": container_id},
                   {"name": "PYTHONUNBUFFERED", "value": "1"},
                   *([] if any(e.get("name") == "TMPDIR" for e in env)
                     else [{"name": "TMPDIR", "value": SCRATCH_MOUNT}])]
    requests, limits = _resources(resources)
    if requests:
        wanted = main.setdefault("resources", {})
        wanted.setdefault("requests", {}).update(requests)
        wanted.setdefault("limits", {}).update(limits)
    main["volumeMounts"] = [*(m for m in main.get("volumeMounts") or []
                              if m.get("name") not in (_VOLUME, _SCRATCH)),
                            {"name": _VOLUME, "mountPath": CREDENTIALS_MOUNT, "readOnly": True},
                            {"name": _SCRATCH, "mountPath": SCRATCH_MOUNT}]
    spec["volumes"] = [*(v for v in spec.get("volumes") or []
                         if v.get("name") not in (_VOLUME, _SCRATCH)),
                       {"name": _VOLUME, "secret": {"secretName": secret_name,
                                                    "defaultMode": 0o400}},
                       {"name": _SCRATCH, "emptyDir": {}}]
    return pod


def _resources(resources: Resources) -> tuple[dict[str, str], dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if resources.memory_mb:
        requests["memory"] = limits["memory"] = f"{resources.memory_mb}Mi"
    if resources.cores:
        requests["cpu"] = f"{round(resources.cores * 1000)}m"
    return requests, limits


def secret_manifest(name: str, master_tag: str, credentials_json: str) -> dict[str, Any]:
    """The Secret the pods mount: the master's secret file (secret and certificate)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "labels": {LABEL_NAME: "weir-credentials",
                                                  LABEL_MASTER: master_tag}},
            "stringData": {CREDENTIALS_FILE: credentials_json}}


@dataclasses.dataclass
class PodView:
    """A pod as the master needs it, updated from the API server's objects (the client's
    ``to_dict()``: snake_case keys)."""

    name: str
    waiting: str = "the pod is being created"
    exit_code: int | None = None
    gone: bool = False
    ending: str = ""
    last_log: bytes | None = None  # its log's end, read before an ended pod is deleted
    adopted: bool = False  # created by an earlier master process
    created_s: float = 0.0  # when its create returned (monotonic); 0 = not yet, or adopted

    def update(self, kind: str, pod: dict[str, Any], *, deleting: bool) -> None:
        status = pod.get("status") or {}
        if kind == "DELETED":
            self.gone, self.waiting = True, ""
            if self.exit_code is None:
                self.exit_code = -9  # as a SIGKILLed process: it ended without a code
                self.ending = ("deleted by the master" if deleting else
                               "its pod was deleted (its node lost, or deleted by hand)")
            return
        phase = status.get("phase") or "Pending"
        if phase == "Pending":
            self.waiting = _pending_reason(status)
        elif phase == "Running":
            self.waiting = ""
        elif phase in ("Succeeded", "Failed") and self.exit_code is None:
            self.waiting = ""
            terminated = _terminated(status)
            code = terminated.get("exit_code")
            self.exit_code = int(code) if code is not None else -9
            self.ending = ", ".join(str(x) for x in (
                status.get("reason"), status.get("message"), terminated.get("reason"),
                f"exit code {self.exit_code}") if x)


def _terminated(status: dict[str, Any]) -> dict[str, Any]:
    for container in status.get("container_statuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return {}


def _pending_reason(status: dict[str, Any]) -> str:
    """The scheduler's or kubelet's words for why a pod is not running yet."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return ": ".join(str(x) for x in (condition.get("reason"),
                                              condition.get("message")) if x)
    for container in status.get("container_statuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            return ": ".join(str(x) for x in (waiting.get("reason"),
                                              waiting.get("message")) if x)
    return str(status.get("message") or "the pod is starting")
