"""The Kubernetes launcher: one pod per container, made, watched and deleted through the
API server with the official client, as Flink's and Spark's drivers make their workers.

The master's secret and the certificate its containers check it by reach the pods as a
Kubernetes Secret the launcher creates (and deletes at ``stop_all``), mounted read-only
as a file: never in an argument or an environment variable, which the pod spec shows to
anyone who may read pods. A pod that failed, was evicted or vanished is a container that
ended, told to the master at once (``on_exit``) rather than at its heartbeat timeout; a
pod the scheduler cannot place yet is reported by ``waiting`` with the scheduler's words.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from weir.master.kubernetes_pods import (
    LABEL_CONTAINER,
    LABEL_MASTER,
    PodView,
    load_pod_template,
    pod_manifest,
    secret_manifest,
)
from weir.master.launcher import (
    LOG_KEPT_BYTES,
    NO_REQUEST,
    Launcher,
    Resources,
    credentials_document,
    master_tag,
)

__all__ = ["KubernetesLauncher"]

_LOGGER = logging.getLogger("weir.master.launcher")

_WATCH_TIMEOUT_S = 60
"""A watch is re-opened this often (from the resourceVersion reached), as clients do."""

_RETRY_S = 1.0



class KubernetesLauncher(Launcher):
    """Runs each container as a pod ``weir-<master tag>-<container id>``.

    Args:
        master_address: the master's ``host:port`` the pods call (start the master with
            ``--advertise-host`` set to its Service's name).
        image: the container image (it must hold Weir and Java; see ``deploy/``).
        namespace: where pods and the Secret go; default: the kubeconfig context's, in a
            pod its own, else ``default``.
        kubeconfig: a kubeconfig file; default: in a pod its service account, else
            ``~/.kube/config``.
        service_account: the pods' service account (they need no API access).
        pod_template: a Pod manifest (YAML or JSON) the pods start from: node selectors,
            tolerations, security context, extra volumes; its first container (or the one
            named ``weir``) gets the command, resources and credentials.
        command: the program before ``--master`` in the image; ``python -m
            weir.container`` by default.
        api_client: a ready ``kubernetes.client.ApiClient`` instead of a kubeconfig.
    """

    spans_hosts = True

    def __init__(self, master_address: str, *, image: str, namespace: str | None = None,
                 kubeconfig: str | None = None, service_account: str = "",
                 pod_template: str | None = None, command: Sequence[str] | None = None,
                 api_client: Any = None) -> None:
        from kubernetes import client  # noqa: PLC0415 - an extra: loaded when it is named

        if not image:
            raise ValueError("the kubernetes launcher needs an image (--k8s-image): one "
                             "with Weir and Java in it, e.g. built from deploy/Dockerfile")
        self.master_address = master_address
        self.image = image
        self.command = list(command or ["python", "-m", "weir.container"])
        self.service_account = service_account
        self.template = load_pod_template(pod_template) if pod_template else None
        api_client, default_namespace = api_client_and_namespace(api_client, kubeconfig)
        self.namespace = namespace or default_namespace
        self.api = client.CoreV1Api(api_client)
        self.tag = master_tag({})  # this master's pods and Secret (set_credentials: kept)
        self._pods: dict[str, PodView] = {}  # container id -> what the API server said
        self._deleting: set[str] = set()
        self._lock = threading.Lock()
        self._secret_made = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def secret_name(self) -> str:
        return f"weir-{self.tag}-credentials"

    def set_credentials(self, env: Mapping[str, str]) -> None:
        super().set_credentials(env)
        self.tag = master_tag(env)  # the same after a restart: its pods are found again

    def adopt(self, container_id: str, pid: int, host: str) -> None:
        """Takes charge of a pod an earlier master process (same secret: same tag)
        created; one that is gone by then is told as ended once the pods are listed."""
        with self._lock:
            if container_id in self._pods:
                return
            self._pods[container_id] = PodView(self.pod_name(container_id), waiting="",
                                               adopted=True)
        self._ensure_watch()

    def pod_name(self, container_id: str) -> str:
        return f"weir-{self.tag}-{container_id}".lower()

    # -- launching ----------------------------------------------------------------------
    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        self._ensure_secret()
        self._ensure_watch()
        body = pod_manifest(
            copy.deepcopy(self.template), name=self.pod_name(container_id),
            container_id=container_id, master_tag=self.tag, image=self.image,
            command=self.command,
            args=["--master", self.master_address, "--id", container_id],
            secret_name=self.secret_name, resources=resources,
            service_account=self.service_account)
        with self._lock:
            self._pods[container_id] = PodView(body["metadata"]["name"])
        self._call(f"create pod for {container_id}", self.api.create_namespaced_pod,
                   self.namespace, body)
        with self._lock:
            self._pods[container_id].created_s = time.monotonic()
        _LOGGER.info("container=%s pod %s/%s created", container_id, self.namespace,
                     body["metadata"]["name"])

    def _ensure_secret(self) -> None:
        with self._lock:
            if self._secret_made:
                return
            self._secret_made = True
        self._call("create the credentials Secret", self.api.create_namespaced_secret,
                   self.namespace, secret_manifest(self.secret_name, self.tag,
                                                   credentials_document(self.credential_env)),
                   exists_ok=True)  # an earlier master's, with the same secret

    def _call(self, what: str, method: Any, *args: Any, exists_ok: bool = False) -> Any:
        """An API call; its failure as a RuntimeError that says what was refused and why
        (a launch that fails fails the application with this message)."""
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        try:
            return method(*args)
        except ApiException as exc:
            if exists_ok and exc.status == 409:
                return None
            hint = (" (the master's service account needs pods and secrets rights in "
                    f"namespace {self.namespace}: see deploy/kubernetes/rbac.yaml)"
                    if exc.status == 403 else "")
            raise RuntimeError(f"Kubernetes refused to {what}: {exc.status} {exc.reason}: "
                               f"{_message(exc)}{hint}") from None

    # -- what the master asks -------------------------------------------------------------
    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            view = self._pods.get(container_id)
            return None if view is None else view.exit_code

    def exit_reason(self, container_id: str) -> str:
        with self._lock:
            view = self._pods.get(container_id)
            return "" if view is None or view.exit_code is None else view.ending

    def waiting(self, container_id: str) -> str:
        with self._lock:
            view = self._pods.get(container_id)
            return "" if view is None else view.waiting

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        with self._lock:
            view = self._pods.get(container_id)
            if view is None or view.gone:
                return
            self._deleting.add(container_id)
        self._delete_pod(view.name, grace_s=0)

    def stop_all(self, grace_s: float = 5.0) -> None:
        with self._lock:
            live = [(cid, v.name) for cid, v in self._pods.items() if not v.gone]
            self._deleting.update(cid for cid, _ in live)
            secret_made = self._secret_made
        for _, name in live:
            self._delete_pod(name, grace_s=int(grace_s))
        deadline = time.monotonic() + grace_s + 5.0  # the watch sees the pods go
        while time.monotonic() < deadline and not self._all_gone(cid for cid, _ in live):
            time.sleep(0.1)
        self._stop.set()
        if secret_made:
            self._delete(self.api.delete_namespaced_secret, self.secret_name)

    def _all_gone(self, container_ids: Iterable[str]) -> bool:
        with self._lock:
            return all(self._pods[cid].gone for cid in container_ids)

    def _delete_pod(self, name: str, grace_s: int) -> None:
        self._delete(self.api.delete_namespaced_pod, name, grace_period_seconds=grace_s)

    def _delete(self, method: Any, name: str, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        try:
            method(name, self.namespace, **kwargs)
        except ApiException as exc:
            if exc.status != 404:  # already gone is what was wanted
                _LOGGER.error("could not delete %s/%s: %s %s", self.namespace, name,
                              exc.status, _message(exc))
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: say what is left
            _LOGGER.error("could not reach the API server to delete %s/%s (%s: %s); it is "
                          "left: delete it with kubectl -n %s delete", self.namespace, name,
                          type(exc).__name__, " ".join(str(exc).split())[:200],
                          self.namespace)

    # -- watching ------------------------------------------------------------------------
    def _ensure_watch(self) -> None:
        with self._lock:
            if self._watcher is not None:
                return
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name=f"weir-k8s-watch-{self.tag}")
        self._watcher.start()

    def _watch(self) -> None:
        """Lists this master's pods, then follows their changes from that list's
        resourceVersion; on an expired version or a broken stream, lists again."""
        from kubernetes import watch  # noqa: PLC0415

        selector = f"{LABEL_MASTER}={self.tag}"
        while not self._stop.is_set():
            try:
                asked_s = time.monotonic()
                listed = self.api.list_namespaced_pod(self.namespace, label_selector=selector)
                for pod in listed.items:
                    self._seen("MODIFIED", pod.to_dict())
                self._missing({pod.metadata.name for pod in listed.items}, asked_s)
                self._watch_ok()
                version = listed.metadata.resource_version
                stream = watch.Watch().stream(
                    self.api.list_namespaced_pod, self.namespace, label_selector=selector,
                    resource_version=version, timeout_seconds=_WATCH_TIMEOUT_S)
                for event in stream:
                    if self._stop.is_set():
                        break
                    if event["type"] == "ERROR":
                        break  # 410: too old a version; list again
                    self._seen(event["type"], event["object"].to_dict())
            except Exception as exc:  # noqa: BLE001 - the watch must outlive API hiccups
                self._watch_failed(f"watching pods in namespace {self.namespace}", exc)
                _LOGGER.warning("watching pods in %s failed (%s: %s); again in %.0f s",
                                self.namespace, type(exc).__name__, exc, _RETRY_S)
                self._stop.wait(_RETRY_S)

    def _missing(self, listed: set[str], asked_s: float) -> None:
        """Pods the list lacks are gone, if they existed when it was asked for: adopted
        ones (deleted while no master watched), and those created before (deleted while
        the watch was broken, or before it first listed: no event will tell)."""
        with self._lock:
            gone = [cid for cid, view in self._pods.items()
                    if view.exit_code is None and view.name not in listed
                    and (view.adopted or 0 < view.created_s < asked_s)]
        for container_id in gone:
            self._seen("DELETED", {"metadata": {"labels": {LABEL_CONTAINER: container_id}}})

    def _seen(self, kind: str, pod: dict[str, Any]) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        container_id = labels.get(LABEL_CONTAINER)
        if not container_id:
            return
        with self._lock:
            view = self._pods.get(container_id)
            if view is None:  # not launched by this launcher object
                return
            was_ended = view.exit_code is not None
            view.update(kind, pod, deleting=container_id in self._deleting)
            ended = view.exit_code is not None and not was_ended
        if ended:
            if container_id not in self._deleting:
                _LOGGER.warning("container=%s pod %s ended: %s", container_id, view.name,
                                view.ending)
            self._exited(container_id)
            if not view.gone:  # an ended pod is released, its log kept for `weir logs`
                view.last_log = self._read_log(view.name)[-LOG_KEPT_BYTES:]
                with self._lock:
                    self._deleting.add(container_id)
                self._delete_pod(view.name, grace_s=0)

    def log(self, container_id: str, max_bytes: int) -> tuple[bytes, bool, str]:
        with self._lock:
            view = self._pods[container_id]  # KeyError: not launched here
        data = view.last_log if view.last_log is not None else (
            b"" if view.gone else self._read_log(view.name))
        return data[-max_bytes:], len(data) > max_bytes, f"pod {self.namespace}/{view.name}"

    def _read_log(self, name: str) -> bytes:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        try:
            response = self.api.read_namespaced_pod_log(name, self.namespace,
                                                        _preload_content=False)
            return bytes(response.data)
        except ApiException as exc:
            return f"(the log of pod {name} could not be read: {exc.status} {exc.reason})\n" \
                .encode()


def api_client_and_namespace(api_client: Any, kubeconfig: str | None) -> tuple[Any, str]:
    """The API client to use and the namespace it defaults to: the given client; else in a
    pod its service account's (and namespace); else the kubeconfig's current context."""
    from kubernetes import config  # noqa: PLC0415

    if api_client is not None:
        return api_client, "default"
    in_cluster = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        from kubernetes import client  # noqa: PLC0415

        return client.ApiClient(), Path(in_cluster).read_text().strip() or "default"
    try:
        _, context = config.list_kube_config_contexts(config_file=kubeconfig)
    except config.ConfigException as exc:
        raise ValueError(f"no Kubernetes cluster to launch containers in: {exc}; pass "
                         "--kubeconfig FILE, or run the master in a pod") from None
    namespace = (context or {}).get("context", {}).get("namespace") or "default"
    return config.new_client_from_config(config_file=kubeconfig), namespace


def _message(exc: Any) -> str:
    """The API server's own message from an ApiException's Status body, if it has one."""
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.body or "")
    except (ValueError, AttributeError):
        return str(exc.body or "")
