"""The node side of the Kubernetes API server for tests (``tests/kubernetes_api.py``): the
object store its handlers and its kubelet share, and a kubelet that binds pods to one node
and runs each pod's one container as a local process.

A test fixture only: nothing here isolates anything (no container, no image, no cgroup).
"""

from __future__ import annotations

import base64
import collections
import copy
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["FIELD_PATHS", "NODE_NAME", "Kubelet", "ObjectStore", "now", "parse_quantity"]

NODE_NAME = "weir-test-node"
POD_IP = "127.0.0.1"
WAIT_S = 10.0  # evict, vanish and stop wait this long for a killed process to be reaped

_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")
_SCALE = {None: 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9,
          "T": 1e12, "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30,
          "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
FIELD_PATHS = {"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
           "status.podIP", "status.hostIP"}  # the fieldRef paths a pod's env may name


def now() -> str:
    """RFC 3339 UTC, seconds, as the API server writes timestamps."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_quantity(value: object) -> float:
    """A Kubernetes quantity (``512Mi``, ``1G``, ``1e9``, ``500m``, ``0.5``) in base units
    (bytes, cores); ValueError if it is not one."""
    match = _QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"quantities must match the regular expression of Kubernetes: {value!r}")
    return float(match.group(1)) * _SCALE[match.group(2)]


def kill_group(pgid: int, sig: int) -> None:
    """Signals a pod's process group; never group 0 or 1 or this process's own."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Change(NamedTuple):
    version: int
    kind: str
    type: str
    object: dict[str, Any]


class ObjectStore:
    """Pods and secrets by (namespace, name), one resourceVersion counter bumped by every
    change, and the recent changes, which watches replay. ``cond`` is the one lock; it also
    wakes the watches."""

    history_size = 2000  # a watch from an older resourceVersion gets 410 Expired

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "pods": {}, "secrets": {}}
        self.version = 0
        self.history: collections.deque[Change] = collections.deque()
        self.oldest = 0  # every change after this version is in ``history``
        self.closed = False

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects[kind].get((namespace, name))

    def items(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        """The objects of a namespace (of all if None), oldest first."""
        return [obj for (ns, _), obj in self.objects[kind].items()
                if namespace is None or ns == namespace]

    def record(self, kind: str, obj: dict[str, Any], change: str) -> None:
        """Stores (ADDED, MODIFIED) or removes (DELETED) ``obj`` under a new version."""
        with self.cond:
            self.version += 1
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.version)
            key = (meta["namespace"], meta["name"])
            if change == "DELETED":
                self.objects[kind].pop(key, None)
            else:
                self.objects[kind][key] = obj
            self.history.append(Change(self.version, kind, change, copy.deepcopy(obj)))
            while len(self.history) > self.history_size:
                self.oldest = self.history.popleft().version
            self.cond.notify_all()

    def since(self, version: int) -> list[Change]:
        """The changes after ``version``, oldest first."""
        newer: list[Change] = []
        for change in reversed(self.history):
            if change.version <= version:
                break
            newer.append(change)
        return newer[::-1]


class _Missing(Exception):
    """A secret (or key) the pod needs is not there yet: it stays Pending and is retried."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Container:
    uid: str
    namespace: str
    name: str
    proc: subprocess.Popen[bytes]
    started: str
    exited: threading.Event = field(default_factory=threading.Event)
    settled: bool = False  # its pod's status is final already (evicted, vanished, stopped)
    deleting: bool = False  # its pod is removed once the process is gone


def requests_of(pod: dict[str, Any]) -> tuple[int, int]:
    """(bytes, millicores) the pod asks for: requests, else limits, as the scheduler counts."""
    resources = pod["spec"]["containers"][0].get("resources") or {}
    asked = [(resources.get("requests") or {}).get(name,
              (resources.get("limits") or {}).get(name, 0)) for name in ("memory", "cpu")]
    return round(parse_quantity(asked[0])), round(parse_quantity(asked[1]) * 1000)


def pod_folder(workdir: Path, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"


def _conditions(scheduled: bool, ready: bool, message: str = "") -> list[dict[str, Any]]:
    at = now()
    if not scheduled:
        return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message, "lastTransitionTime": at}]
    return [{"type": kind, "status": "True" if kind == "PodScheduled" or ready else "False",
             "lastTransitionTime": at} for kind in ("PodScheduled", "Ready")]


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Equal but for transition times (so a retried, unchanged status is not an event)."""
    def strip(status: dict[str, Any]) -> list[Any]:
        return [status.get("phase"), status.get("message"),
                [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                 for c in status.get("conditions", [])]]
    return strip(old) == strip(new)


class Kubelet:
    """One node: binds a pending pod if the requests of the bound, unfinished pods leave room,
    then runs its container's command in a session of its own (so its process group is the
    container), logging to a file under the workdir. A container's other processes are killed
    when its main process exits, as a container runtime does."""

    def __init__(self, store: ObjectStore, workdir: Path, memory_bytes: int,
                 cores: float) -> None:
        self.store = store
        self.workdir = workdir
        self.capacity = (memory_bytes, round(cores * 1000))
        self.stopped = False
        self.containers: dict[str, _Container] = {}  # by pod uid, until the process is reaped

    def sync(self) -> None:
        """Binds the pending pods that fit and starts the bound ones not started: after a pod
        is created, finishes or goes, and after a secret is created."""
        with self.store.cond:
            if self.stopped:
                return
            pods = self.store.items("pods", None)
            free = list(self.capacity)
            for pod in pods:
                if pod["spec"].get("nodeName") and pod["status"]["phase"] in {"Pending",
                                                                                "Running"}:
                    free = [f - n for f, n in zip(free, requests_of(pod), strict=True)]
            for pod in pods:
                if (pod["status"]["phase"] != "Pending" or "deletionTimestamp" in pod["metadata"]
                        or pod["metadata"]["uid"] in self.containers):
                    continue
                if not pod["spec"].get("nodeName"):
                    need = requests_of(pod)
                    short = [f"1 Insufficient {name}" for name, n, f
                             in zip(("cpu", "memory"), need[::-1], free[::-1], strict=True)
                             if n > f]
                    if short:
                        message = f"0/1 nodes are available: {', '.join(short)}."
                        self._update(pod, {"phase": "Pending", "conditions": _conditions(
                            False, False, message)})
                        continue
                    pod["spec"]["nodeName"] = NODE_NAME
                    free = [f - n for f, n in zip(free, need, strict=True)]
                self._start(pod)

    def _update(self, pod: dict[str, Any], status: dict[str, Any], force: bool = False) -> None:
        if force or not _same(pod["status"], status):
            pod["status"] = status
            self.store.record("pods", pod, "MODIFIED")

    def _start(self, pod: dict[str, Any]) -> None:
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        folder = pod_folder(self.workdir, pod)
        folder.mkdir(parents=True, exist_ok=True)
        base = {"phase": "Pending", "conditions": _conditions(True, False)}
        try:
            mounts = self._volumes(pod, folder)
            env = self._environment(pod, mounts)
        except _Missing as exc:
            waiting = {"waiting": {"reason": exc.reason, "message": str(exc)}}
            self._update(pod, {**base, "message": str(exc), "containerStatuses": [
                self._container_status(pod, waiting)]})
            return
        argv = [mounts(str(a)) for a in [*(container.get("command") or []),
                                          *(container.get("args") or [])]]
        workdir = container.get("workingDir")
        started = now()
        try:
            with open(folder / "log", "ab") as log:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=env,
                                        cwd=mounts(workdir) if workdir else None,
                                        start_new_session=True)
        except OSError as exc:
            ended = {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc),
                                    "startedAt": started, "finishedAt": now()}}
            self._update(pod, {**base, "phase": "Failed", "message": str(exc),
                               "containerStatuses": [self._container_status(pod, ended)]}, True)
            return
        running = _Container(meta["uid"], meta["namespace"], meta["name"], proc, started)
        self.containers[running.uid] = running
        self._update(pod, {
            "phase": "Running", "conditions": _conditions(True, True), "hostIP": POD_IP,
            "podIP": POD_IP, "podIPs": [{"ip": POD_IP}], "startTime": started,
            "containerStatuses": [self._container_status(
                pod, {"running": {"startedAt": started}}, proc.pid)]}, True)
        threading.Thread(target=self._reap, args=(running,), daemon=True,
                         name=f"kubelet-{meta['name']}").start()

    @staticmethod
    def _container_status(pod: dict[str, Any], state: dict[str, Any],
                          pid: int | None = None) -> dict[str, Any]:
        container = pod["spec"]["containers"][0]
        status = {"name": container["name"], "image": container.get("image") or "",
                  "imageID": "", "ready": "running" in state, "started": "running" in state,
                  "restartCount": 0, "state": state}
        return {**status, "containerID": f"weir-test://{pid}"} if pid else status

    def _secret(self, ns: str, ref: dict[str, Any], reason: str, key: str | None = None) -> Any:
        """A secret's data (``key``'s value if given); None if it is missing and optional."""
        name = ref.get("secretName") or ref["name"]
        found = self.store.get("secrets", ns, name)
        data = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()} \
            if found else None
        if data is not None and (key is None or key in data):
            return data if key is None else data[key]
        if ref.get("optional"):
            return None
        raise _Missing(reason, f'secret "{name}" not found' if data is None
                       else f"couldn't find key {key} in Secret {ns}/{name}")

    def _volumes(self, pod: dict[str, Any], folder: Path) -> Callable[[str], str]:
        """Writes the pod's volumes into its folder; returns what maps a string's mountPaths
        to their folders (the fixture's one liberty: pods cannot share a real path)."""
        paths: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            path = paths[volume["name"]] = folder / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            source = volume.get("secret")
            data = source and self._secret(pod["metadata"]["namespace"], source,
                                           "ContainerCreating")
            for item in (source or {}).get("items") or [{"key": k, "path": k} for k in data or {}]:
                value = self._secret(pod["metadata"]["namespace"], source, "ContainerCreating",
                                     item["key"])
                if value is None:
                    continue
                target = path / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)  # a retry after a later volume was missing
                mode = item.get("mode", source.get("defaultMode", 0o644))
                with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as out:
                    out.write(value)
                    os.fchmod(out.fileno(), mode)
        mounts = {m["mountPath"].rstrip("/"): str(paths[m["name"]] / m.get("subPath", ""))
                  for m in pod["spec"]["containers"][0].get("volumeMounts") or []}
        if not mounts:
            return lambda text: text
        pattern = re.compile(r"(?<![\w./-])(" + "|".join(
            re.escape(p) for p in sorted(mounts, key=len, reverse=True)) + r")(?![\w.-])")
        return lambda text: pattern.sub(lambda match: mounts[match.group(1)], text)

    def _environment(self, pod: dict[str, Any],
                     mounts: Callable[[str], str]) -> dict[str, str]:
        """This process's environment, then the container's envFrom and env (values with
        their mountPaths mapped)."""
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": NODE_NAME,
                  "status.podIP": POD_IP, "status.hostIP": POD_IP}
        env = {**os.environ, "HOSTNAME": meta["name"]}
        reason = "CreateContainerConfigError"
        for source in container.get("envFrom") or []:
            data = self._secret(meta["namespace"], source["secretRef"], reason) or {}
            env.update({source.get("prefix", "") + k: v.decode(errors="replace")
                        for k, v in data.items()})
        for var in container.get("env") or []:
            source = var.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self._secret(meta["namespace"], ref, reason, ref["key"])
                if value is not None:
                    env[var["name"]] = value.decode(errors="replace")
            elif "fieldRef" in source:
                env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
            else:
                env[var["name"]] = mounts(var.get("value") or "")
        return env

    def _reap(self, running: _Container) -> None:
        """Waits for the container's main process; kills what it left in its group before
        reaping it (so the group id cannot be reused meanwhile); records how it ended."""
        pid = running.proc.pid
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        kill_group(pid, signal.SIGKILL)
        code = running.proc.wait()
        with self.store.cond:
            self.containers.pop(running.uid, None)
            pod = self.store.get("pods", running.namespace, running.name)
            if pod is not None and pod["metadata"]["uid"] == running.uid:
                if not running.settled:
                    terminated: dict[str, Any] = {
                        "exitCode": code if code >= 0 else 128 - code,
                        "reason": "Completed" if code == 0 else "Error",
                        "startedAt": running.started, "finishedAt": now(),
                        "containerID": f"weir-test://{pid}"}
                    if code < 0:
                        terminated["signal"] = -code
                    pod["status"] = {**pod["status"], "phase": "Succeeded" if code == 0 else
                                     "Failed", "conditions": _conditions(True, False),
                                     "containerStatuses": [self._container_status(
                                         pod, {"terminated": terminated}, pid)]}
                if running.deleting:
                    self.store.record("pods", pod, "DELETED")
                elif not running.settled:
                    self.store.record("pods", pod, "MODIFIED")
            self.sync()
        running.exited.set()

    def delete(self, pod: dict[str, Any], grace: int) -> dict[str, Any]:
        """Deletes a pod as the API server and kubelet do: a pod without a running process
        goes at once; else SIGTERM to its group, SIGKILL after ``grace`` s, and the object goes
        once the process is gone. Returns the pod with its deletionTimestamp."""
        with self.store.cond:
            meta = pod["metadata"]
            running = self.containers.get(meta["uid"])
            if running is not None and running.deleting:
                return copy.deepcopy(pod)
            meta["deletionTimestamp"] = now()
            meta["deletionGracePeriodSeconds"] = grace if running else 0
            if running is None:
                self.store.record("pods", pod, "DELETED")
                self.sync()
                return copy.deepcopy(pod)
            running.deleting = True
            self.store.record("pods", pod, "MODIFIED")
            kill_group(running.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            threading.Thread(target=self._kill_after, args=(running, grace), daemon=True,
                             name=f"kubelet-grace-{meta['name']}").start()
            return copy.deepcopy(pod)

    @staticmethod
    def _kill_after(running: _Container, grace: float) -> None:
        if not running.exited.wait(grace) and running.proc.returncode is None:
            kill_group(running.proc.pid, signal.SIGKILL)

    def end(self, pod: dict[str, Any], status: dict[str, Any] | None) -> None:
        """Kills the pod's process group at once; the pod gets ``status`` (an eviction) or
        goes (None: a lost node). Waits for the process to be reaped."""
        with self.store.cond:
            running = self.containers.get(pod["metadata"]["uid"])
            if running is not None:
                running.settled = True
                kill_group(running.proc.pid, signal.SIGKILL)
            if status is None:
                self.store.record("pods", pod, "DELETED")
            else:
                self._update(pod, status, True)
            self.sync()
        if running is not None:
            running.exited.wait(WAIT_S)

    def stop(self) -> None:
        """SIGKILLs every pod's process group and waits for them; no pod starts after this."""
        with self.store.cond:
            self.stopped = True
            running = list(self.containers.values())
            for container in running:
                container.settled = True
                kill_group(container.proc.pid, signal.SIGKILL)
        for container in running:
            container.exited.wait(WAIT_S)
