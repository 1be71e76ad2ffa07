"""Whether an application's STATE_DIR is reachable from every node its containers may run
on: a container replaced on another node must find the checkpoints its predecessor wrote.

A launcher whose containers run on other machines (``Launcher.spans_hosts``: Kubernetes,
Ray) needs a store every node reaches: a ``pyarrow.fs`` URI of a shared filesystem
(``s3://``, ``gs://``, ``hdfs://``, ``abfs://``...), or a folder every node mounts at the
same path (NFS, a shared volume), which only the user can know, and says with
``STATE_DIR_SHARED=true``. Anything else (no STATE_DIR: a temporary folder on each node;
a local path not declared shared) is refused at submit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir.master.state_owner import is_default_state_dir

__all__ = ["SHARED_SCHEMES", "unshared_state_problem"]

SHARED_SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "az")
"""URI schemes of ``pyarrow.fs`` filesystems that every node reaches alike."""

_DOCS = "docs/operations/several-hosts.md"


def unshared_state_problem(attributes: Mapping[str, Any], launcher: str) -> str | None:
    """Why the application's STATE_DIR cannot serve containers on several nodes of the
    ``launcher``, naming what to set, or None."""
    state_dir = str(attributes.get("STATE_DIR") or "").strip()
    if is_default_state_dir(state_dir):  # the master's own temporary folder for it
        state_dir = ""
    scheme = state_dir.split("://", 1)[0].lower() if "://" in state_dir else ""
    if scheme in SHARED_SCHEMES:
        return None
    shared = bool(attributes.get("STATE_DIR_SHARED"))
    if state_dir and scheme in ("", "file") and shared:
        return None
    where = (f"STATE_DIR={state_dir!r} is a folder of each node" if state_dir
             else "STATE_DIR is not set (a temporary folder on each node)")
    fix = ("set STATE_DIR to a store every node reaches (s3://bucket/path, gs://..., "
           "hdfs://...), or to a folder every node mounts at the same path and "
           "STATE_DIR_SHARED=true")
    if state_dir and scheme not in ("", "file"):
        where = f"STATE_DIR={state_dir!r} is not a store Weir knows to be shared ({scheme}://)"
    return (f"{where}, but the {launcher} launcher runs containers on several nodes and a "
            f"replacement on another node must find the checkpoints: {fix}; see {_DOCS}")
