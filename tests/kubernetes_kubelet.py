"""The model behind the Kubernetes API server for tests (``tests/kubernetes_api.py``): the
object store its handlers and its kubelet share, the validation of what it accepts, and a
kubelet that binds pods to one node and runs each pod's one container as a local process.

A test fixture only: nothing here isolates anything (no container, no image, no cgroup).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import copy
import itertools
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["FIELD_PATHS", "NODE_NAME", "Kubelet", "ObjectStore", "invalid", "now",
           "parse_quantity", "pod_errors", "write_secret_volume"]

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
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


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
        newer = itertools.takewhile(lambda c: c.version > version, reversed(self.history))
        return list(newer)[::-1]


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def invalid(where: str, value: object, pattern: re.Pattern[str], limit: int) -> list[str]:
    """[why] if ``value`` is not a string of at most ``limit`` characters matching, else []."""
    if isinstance(value, str) and len(value) <= limit and pattern.fullmatch(value):
        return []
    return [f"{where}: Invalid value: {value!r}: must match {pattern.pattern}, at most {limit}"]


def pod_errors(pod: dict[str, Any]) -> list[str]:
    """Why the API server would refuse this pod's spec (422), or this kubelet could not run
    it."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if len(containers) != 1:
        return [f"spec.containers: the test API runs one container, not {len(containers)}"]
    container, policy = containers[0], spec.get("restartPolicy", "Always")
    errors = invalid("spec.containers[0].name", container.get("name"), _DNS_LABEL, 63)

    def check(ok: object, message: str) -> None:
        if not ok:
            errors.append(message)

    check(policy == "Never", f"spec.restartPolicy: Unsupported value: {policy!r}: the test "
          "API models 'Never' only (and Kubernetes' default is 'Always')")
    check(not spec.get("initContainers"), "spec.initContainers: not modelled by the test API")
    check(container.get("image"), "spec.containers[0].image: Required value")
    check(not container.get("envFrom"), "spec.containers[0].envFrom: not modelled by the test API")
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    check(container.get("command") and all(isinstance(a, str) for a in argv),
          "spec.containers[0].command: Required value: the test API runs it (no image)")
    volumes = {volume.get("name"): volume for volume in spec.get("volumes") or []}
    for name, volume in volumes.items():
        errors += invalid("spec.volumes[].name", name, _DNS_LABEL, 63)
        secret = volume.get("secret") or {}
        check((volume.get("emptyDir") is not None or secret.get("secretName")) and all(
            item.get("key") and str(item.get("path") or "/").split("/")[0]
            and ".." not in str(item["path"]).split("/") for item in secret.get("items") or []),
            f"spec.volumes[{name}]: the test API models emptyDir and secret volumes "
            "(a secretName; items with a key and a relative path)")
    for mount in container.get("volumeMounts") or []:
        path = mount.get("mountPath")
        check(mount.get("name") in volumes and isinstance(path, str) and path.startswith("/")
              and path.strip("/"), f"spec.containers[0].volumeMounts[{mount.get('name')}]: "
              "Invalid value: no such volume, or not an absolute path")
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        check(source is None or {"name", "key"} <= set(source.get("secretKeyRef") or {})
              or (source.get("fieldRef") or {}).get("fieldPath") in FIELD_PATHS,
              f"spec.containers[0].env[{var.get('name')}].valueFrom: the test API models "
              f"secretKeyRef and fieldRef ({', '.join(sorted(FIELD_PATHS))})")
    try:
        requests_of(pod)
    except ValueError as exc:
        errors.append(f"spec.containers[0].resources: {exc}")
    return errors


class _Missing(Exception):
    """(reason, message): a secret or key the pod needs is missing; it stays Pending."""


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
    node_lost: bool = False  # its node is unreachable: frozen, and nothing it does is seen


def write_secret_volume(folder: Path, files: dict[str, tuple[bytes, int]],
                        fs_group: int | None = None) -> None:
    """Writes a Secret volume the way the kubelet does (its AtomicWriter): the files, at
    their modes, in a timestamped folder ``..<time>``, a link ``..data`` to it and a link
    ``<key> -> ..data/<key>`` per key, in a folder of mode 1777; with ``fs_group`` (the
    pod's ``securityContext.fsGroup``) every file's group is that group and its mode gains
    group read (0400 -> 0440), folders are set-group-id (the kubelet's
    ``SetVolumeOwnership`` for a read-only volume)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.") + f"{time.time_ns() % 10**9:09d}"
    data_dir = folder / stamp
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    for key, (value, mode) in files.items():
        target = data_dir / key
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                       "wb") as out:
            out.write(value)
            if fs_group is not None:
                os.fchown(out.fileno(), -1, fs_group)
                mode |= 0o440
            os.fchmod(out.fileno(), mode)
    for path, mode in ((data_dir, 0o755), (folder, 0o1777)):
        if fs_group is not None:
            os.chown(path, -1, fs_group)
            mode |= stat.S_ISGID
        os.chmod(path, mode)
    data_link = folder / "..data"
    (folder / "..data_tmp").symlink_to(stamp)
    os.replace(folder / "..data_tmp", data_link)  # the kubelet's atomic swap
    for key in files:
        top = key.split("/", 1)[0]
        if not (folder / top).is_symlink():
            (folder / top).symlink_to(f"..data/{top}")


def requests_of(pod: dict[str, Any]) -> tuple[int, int]:
    """(bytes, millicores) the pod asks for: requests, else limits, as the scheduler counts."""
    resources = pod["spec"]["containers"][0].get("resources") or {}
    asked = [(resources.get("requests") or {}).get(name,
              (resources.get("limits") or {}).get(name, 0)) for name in ("memory", "cpu")]
    return round(parse_quantity(asked[0])), round(parse_quantity(asked[1]) * 1000)


def pod_folder(workdir: Path, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"


def _conditions(ready: bool, unschedulable: str = "") -> list[dict[str, str]]:
    if unschedulable:
        return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": unschedulable}]
    return [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": str(ready)}]


def _container_status(pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    return {"name": container["name"], "image": container.get("image") or "", "imageID": "",
            "ready": "running" in state, "started": "running" in state, "restartCount": 0,
            "state": state}


class Kubelet:
    """One node: binds a pending pod if the requests of the bound, unfinished pods leave room,
    then runs its container's command in a session of its own (its process group is the
    container), logging to a file under the workdir. The container's other processes are
    killed when its main process exits, as a container runtime does."""

    def __init__(self, store: ObjectStore, workdir: Path, memory_bytes: int,
                 cores: float) -> None:
        self.store = store
        self.workdir = workdir
        self.capacity = (memory_bytes, round(cores * 1000))
        self.stopped = False
        self.containers: dict[str, _Container] = {}  # by pod uid, until the process is reaped
        self.logs: dict[tuple[str, str], Path] = {}  # the latest pod's log by (namespace, name)

    def sync(self) -> None:
        """Binds the pending pods that fit and starts the bound ones not started: after a pod
        is created, finishes or goes, and after a secret is created."""
        with self.store.cond:
            pods = [] if self.stopped else self.store.items("pods", None)
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
                        self._update(pod, {"phase": "Pending", "conditions": _conditions(
                            False, f"0/1 nodes are available: {', '.join(short)}.")})
                        continue
                    pod["spec"]["nodeName"] = NODE_NAME
                    free = [f - n for f, n in zip(free, need, strict=True)]
                self._start(pod)

    def _update(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        if pod["status"] != status:
            pod["status"] = status
            self.store.record("pods", pod, "MODIFIED")

    def _start(self, pod: dict[str, Any]) -> None:
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        folder = pod_folder(self.workdir, pod)
        folder.mkdir(parents=True, exist_ok=True)
        base = {"phase": "Pending", "conditions": _conditions(False)}
        try:
            mounts = self._volumes(pod, folder)
            env = self._environment(pod, mounts)
        except _Missing as exc:
            waiting = {"waiting": {"reason": exc.args[0], "message": exc.args[1]}}
            self._update(pod, {**base, "message": exc.args[1],
                               "containerStatuses": [_container_status(pod, waiting)]})
            return
        argv = [mounts(a) for a in [*container["command"], *(container.get("args") or [])]]
        started, workdir = now(), container.get("workingDir")
        self.logs[(meta["namespace"], meta["name"])] = folder / "log"
        try:
            with open(folder / "log", "ab") as log:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=env,
                                        extra_groups=self._fs_groups(pod),
                                        cwd=mounts(workdir) if workdir else None,
                                        start_new_session=True)
        except OSError as exc:
            ended = {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc),
                                    "startedAt": started, "finishedAt": now()}}
            self._update(pod, {**base, "phase": "Failed", "message": str(exc),
                               "containerStatuses": [_container_status(pod, ended)]})
            return
        running = _Container(meta["uid"], meta["namespace"], meta["name"], proc, started)
        self.containers[running.uid] = running
        self._update(pod, {
            "phase": "Running", "conditions": _conditions(True), "hostIP": POD_IP,
            "podIP": POD_IP, "podIPs": [{"ip": POD_IP}], "startTime": started,
            "containerStatuses": [_container_status(pod, {"running": {"startedAt": started}})]})
        threading.Thread(target=self._reap, args=(running,), daemon=True,
                         name=f"kubelet-{meta['name']}").start()

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
            source = volume.get("secret")
            if source is None:
                path.mkdir(parents=True, exist_ok=True)  # an emptyDir
                continue
            if path.exists():  # a retry after a later volume was missing
                shutil.rmtree(path)
            data = self._secret(pod["metadata"]["namespace"], source, "ContainerCreating")
            files = {}
            for item in source.get("items") or [{"key": k, "path": k} for k in data or {}]:
                value = self._secret(pod["metadata"]["namespace"], source, "ContainerCreating",
                                     item["key"])
                if value is not None:
                    files[item["path"]] = (value, item.get("mode",
                                                           source.get("defaultMode", 0o644)))
            fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
            write_secret_volume(path, files, fs_group)
        mounts = {m["mountPath"].rstrip("/"): str(paths[m["name"]] / m.get("subPath", ""))
                  for m in pod["spec"]["containers"][0].get("volumeMounts") or []}
        if not mounts:
            return lambda text: text
        pattern = re.compile(r"(?<![\w./-])(" + "|".join(
            re.escape(p) for p in sorted(mounts, key=len, reverse=True)) + r")(?![\w.-])")
        return lambda text: pattern.sub(lambda match: mounts[match.group(1)], text)

    def _environment(self, pod: dict[str, Any],
                     mounts: Callable[[str], str]) -> dict[str, str]:
        """This process's environment, then the container's env (values with their
        mountPaths mapped)."""
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": NODE_NAME,
                  "status.podIP": POD_IP, "status.hostIP": POD_IP}
        env = {**os.environ, "HOSTNAME": meta["name"]}
        for var in container.get("env") or []:
            source = var.get("valueFrom") or {}
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self._secret(meta["namespace"], ref, "CreateContainerConfigError",
                                     ref["key"])
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
        try:
            os.waitid(os.P_PID, running.proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        kill_group(running.proc.pid, signal.SIGKILL)
        code = running.proc.wait()
        with self.store.cond:
            self.containers.pop(running.uid, None)
            pod = self.store.get("pods", running.namespace, running.name)
            if pod is not None and pod["metadata"]["uid"] == running.uid:
                if not running.settled:
                    ended = {"exitCode": code if code >= 0 else 128 - code,
                             "reason": "Error" if code else "Completed",
                             "startedAt": running.started, "finishedAt": now(),
                             **({"signal": -code} if code < 0 else {})}
                    pod["status"] = {**pod["status"], "phase": "Failed" if code else "Succeeded",
                                     "conditions": _conditions(False), "containerStatuses": [
                                         _container_status(pod, {"terminated": ended})]}
                if running.deleting or not running.settled:
                    self.store.record("pods", pod, "DELETED" if running.deleting else "MODIFIED")
            self.sync()
        running.exited.set()

    def delete(self, pod: dict[str, Any], grace: int) -> dict[str, Any]:
        """Deletes a pod as the API server and kubelet do: a pod without a running process
        goes at once; else SIGTERM to its group, SIGKILL after ``grace`` s (unless it was
        reaped by then), and the object goes once the process is gone. Returns the pod with
        its deletionTimestamp."""
        with self.store.cond:
            meta, running = pod["metadata"], self.containers.get(pod["metadata"]["uid"])
            if running is not None and running.node_lost:
                # nobody can reach the kubelet: a graceful delete leaves the pod Terminating
                # for as long as the node is lost; a force delete (grace 0) removes the
                # object at once while its process runs on there
                meta["deletionTimestamp"] = now()
                meta["deletionGracePeriodSeconds"] = grace
                self.store.record("pods", pod, "DELETED" if grace == 0 else "MODIFIED")
                return copy.deepcopy(pod)
            if running is None or not running.deleting:
                meta["deletionTimestamp"] = now()
                meta["deletionGracePeriodSeconds"] = grace if running else 0
                self.store.record("pods", pod, "MODIFIED" if running else "DELETED")
            if running is None:
                self.sync()
            elif not running.deleting:
                running.deleting = True
                kill_group(running.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
                threading.Thread(target=lambda: running.exited.wait(grace) or kill_group(
                    running.proc.pid, signal.SIGKILL), daemon=True).start()
            return copy.deepcopy(pod)

    def lose_node(self, namespace: str, name: str) -> None:
        """The pod's node becomes unreachable: its processes stop (SIGSTOP: no heartbeat, no
        write), and nothing more is heard from it: no status change, no DELETED (a real
        node is marked NotReady after about 40 s and its pods evicted after 300 s)."""
        with self.store.cond:
            running = self._running(namespace, name)
            running.node_lost = True
            kill_group(running.proc.pid, signal.SIGSTOP)

    def restore_node(self, namespace: str, name: str, kill_after_s: float = 2.0) -> None:
        """The node comes back: the pod's processes go on (SIGCONT) from where they
        stopped; a pod deleted meanwhile has its processes killed by the returning kubelet
        ``kill_after_s`` later (its sync loop), time enough for late writes."""
        with self.store.cond:
            running = self._running(namespace, name)
            running.node_lost = False
            pod = self.store.get("pods", namespace, name)
            gone = pod is None or pod["metadata"]["uid"] != running.uid
            kill_group(running.proc.pid, signal.SIGCONT)
            if gone or "deletionTimestamp" in pod["metadata"]:
                running.settled = running.deleting = not gone
                threading.Timer(kill_after_s, kill_group,
                                (running.proc.pid, signal.SIGKILL)).start()

    @staticmethod
    def _fs_groups(pod: dict[str, Any]) -> list[int] | None:
        """The pod's fsGroup as a supplementary group of its process, as the kubelet adds
        it (where this process may: as root); None = its own groups."""
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        if fs_group is None or (os.getuid() != 0 and fs_group not in os.getgroups()):
            return None
        return sorted({*os.getgroups(), int(fs_group)})

    def _running(self, namespace: str, name: str) -> _Container:
        """The process of the pod ``namespace/name``, whether its object is there or not."""
        for running in self.containers.values():
            if (running.namespace, running.name) == (namespace, name):
                return running
        raise KeyError(f"no process of pod {namespace}/{name}")

    def end(self, namespace: str, name: str, evicted: str | None) -> None:
        """SIGKILLs the pod's process group; the pod stays as Failed, reason Evicted, with
        message ``evicted``, or (None) goes as a lost node's pod does. Returns once the
        process is reaped. KeyError if there is no such pod."""
        with self.store.cond:
            pod = self.store.get("pods", namespace, name)
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            running = self.containers.get(pod["metadata"]["uid"])
            if running is not None:
                running.settled = True
                kill_group(running.proc.pid, signal.SIGKILL)
            if evicted is None:
                self.store.record("pods", pod, "DELETED")
            else:
                killed = {"terminated": {"exitCode": 137, "signal": 9, "reason": "Error",
                                         "finishedAt": now()}}
                self._update(pod, {**pod["status"], "phase": "Failed", "reason": "Evicted",
                                   "message": evicted, "conditions": _conditions(False),
                                   "containerStatuses": [_container_status(pod, killed)]})
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
