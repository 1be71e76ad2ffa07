"""Which application run owns a state folder: one folder, one live application, never two.

Containers delete checkpoints older than the committed window and purge what they
consider theirs; two applications writing into one folder would delete each other's
recovery state. So every application run gets its own default folder (the application
id plus a run id), and a folder given explicitly with ``STATE_DIR`` is claimed with an
``OWNER.json`` file at submit: a folder claimed by a live run of another application on
this host is refused, and the claim is released when the application ends.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile

import pyarrow as pa
import pyarrow.fs as pafs

from weir.master.errors import InvalidArgument
from weir.storage.fence import highest_fence
from weir.storage.locations import redact_location
from weir.storage.private_files import UntrustedPath, make_private_dir, write_private_file

__all__ = [
    "OWNER_FILE", "StateClaim", "check_private_root", "claim_state_dir", "default_state_dir",
    "delete_default_state_dir", "is_default_state_dir", "new_run_id", "private_root",
    "release_state_dir",
]

_LOGGER = logging.getLogger(__name__)

OWNER_FILE = "OWNER.json"


def new_run_id() -> str:
    """A run id, readable and unique: ``20261123T104500-1a2b3c``."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{now}-{secrets.token_hex(3)}"


def private_root() -> str:
    """The user's folder of default state folders: ``$TMPDIR/weir-state-<uid>``."""
    return os.path.join(tempfile.gettempdir(), f"weir-state-{os.getuid()}")


def default_state_dir(app_id: str, run_id: str) -> str:
    """Where a run keeps its state when STATE_DIR is empty: private to the user, its own.

    ``$TMPDIR/weir-state-<uid>/<app id>-<run id>``: two masters both numbering their
    applications from ``app-0001`` never meet, nor do two users of one machine.
    """
    return os.path.join(private_root(), f"{app_id}-{run_id}")


def is_default_state_dir(state_dir: str) -> bool:
    """Whether ``state_dir`` is a run's own default folder (the master made it)."""
    return "://" not in state_dir and os.path.dirname(
        os.path.abspath(state_dir)) == private_root()


def delete_default_state_dir(state_dir: str) -> bool:
    """Deletes a run's default folder (never a folder the user named); True if it did.

    Called once the run ended and its containers exited: nothing recovers it any more,
    and left there, every run would leave its checkpoints and logs in $TMPDIR.
    """
    if not is_default_state_dir(state_dir):
        return False
    try:
        shutil.rmtree(state_dir)
    except FileNotFoundError:
        return False
    except OSError as exc:
        _LOGGER.warning("could not delete the state folder %s of an ended run: %s",
                        state_dir, exc)
        return False
    _LOGGER.info("deleted the state folder %s of an ended run", state_dir)
    return True


def check_private_root(path: str) -> None:
    """Creates ``path`` mode 0700 if missing; refuses it unless it is a real folder of this
    user that nobody else could write into (one only others could read, as older Weir
    versions made it, is closed to mode 0700).

    The folder's name is predictable and in a shared place: another user could have made
    it (or a link in its place) first and then plant checkpoints, which are unpickled.

    Raises:
        InvalidArgument: naming the folder, what is wrong and what to do.
    """
    try:
        make_private_dir(path, "the state root", advice="remove it (or chmod 700 it if it is "
                         "yours) or set STATE_DIR to a folder of your own")
    except UntrustedPath as exc:
        raise InvalidArgument(exc.strerror or str(exc)) from None


@dataclasses.dataclass(frozen=True)
class StateClaim:
    """A run's claim on its state folder (the content of ``OWNER.json``)."""

    state_dir: str
    app_id: str
    run_id: str
    host: str
    pid: int

    def record(self) -> dict[str, object]:
        return {"app_id": self.app_id, "run_id": self.run_id, "host": self.host,
                "pid": self.pid}


def claim_state_dir(state_dir: str, app_id: str, run_id: str) -> StateClaim:
    """Creates the folder (owner-only on a local disk) and claims it for this run.

    Raises:
        InvalidArgument: a live run of another application owns the folder, or the
            folder cannot be made or written (a bad path or URI, no permission).
    """
    try:
        return _claim(state_dir, app_id, run_id)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InvalidArgument(f"STATE_DIR {redact_location(state_dir)!r} cannot hold the "
                              "application's state: "
                              f"{type(exc).__name__}: {exc}; give a folder (or pyarrow.fs "
                              "URI) this user can create and write") from None


def _claim(state_dir: str, app_id: str, run_id: str) -> StateClaim:
    fs, root = _filesystem(state_dir)
    if isinstance(fs, pafs.LocalFileSystem):
        if os.path.dirname(os.path.abspath(root)) == private_root():
            check_private_root(private_root())
        os.makedirs(root, mode=0o700, exist_ok=True)
    else:
        fs.create_dir(root, recursive=True)
    claim = StateClaim(state_dir, app_id, run_id, socket.gethostname(), os.getpid())
    owner = _read_owner(fs, f"{root}/{OWNER_FILE}")
    if owner is not None and owner.get("run_id") != run_id and _alive(owner):
        raise InvalidArgument(
            f"STATE_DIR {redact_location(state_dir)} is in use by application "
            f"{owner.get('app_id')} (run {owner.get('run_id')}, master pid {owner.get('pid')} "
            f"on {owner.get('host')}); "
            "two applications must not share a state folder: give this one its own STATE_DIR "
            "(or leave it empty for a fresh private folder), or stop the other one")
    if owner is not None and owner.get("run_id") != run_id:
        _LOGGER.warning("STATE_DIR %s belonged to application %s (run %s), which is no longer "
                        "running; application %s takes it over", redact_location(state_dir),
                        owner.get("app_id"), owner.get("run_id"), app_id)
    _write_owner(fs, f"{root}/{OWNER_FILE}", claim.record())
    return claim


def first_generation(state_dir: str) -> int:
    """The generation a new run on ``state_dir`` deploys its operators with: one above
    every fence an earlier run left there (1 on a fresh folder), so none refuses it.

    Raises:
        InvalidArgument: the folder cannot be read.
    """
    try:
        fs, root = _filesystem(state_dir)
        return highest_fence(fs, root) + 1
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise InvalidArgument(f"STATE_DIR {redact_location(state_dir)!r}: its operators' "
                              f"fences cannot be read: {type(exc).__name__}: {exc}") from None


def release_state_dir(claim: StateClaim) -> None:
    """Removes the claim if it is still this run's (the application ended)."""
    try:
        fs, root = _filesystem(claim.state_dir)
        path = f"{root}/{OWNER_FILE}"
        owner = _read_owner(fs, path)
        if owner is not None and owner.get("run_id") == claim.run_id:
            fs.delete_file(path)
    except OSError as exc:
        _LOGGER.warning("could not release the claim on STATE_DIR %s: %s",
                        redact_location(claim.state_dir), exc)


def _filesystem(state_dir: str) -> tuple[pafs.FileSystem, str]:
    if "://" in state_dir:
        fs, path = pafs.FileSystem.from_uri(state_dir)
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(state_dir)


def _read_owner(fs: pafs.FileSystem, path: str) -> dict[str, object] | None:
    try:
        with fs.open_input_stream(path) as stream:
            owner = json.loads(stream.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _LOGGER.warning("state folder owner file %s is unreadable (%s): treated as unowned",
                        path, exc)
        return None
    return owner if isinstance(owner, dict) else None


def _write_owner(fs: pafs.FileSystem, path: str, record: dict[str, object]) -> None:
    data = json.dumps(record).encode()
    if isinstance(fs, pafs.LocalFileSystem):  # never through a link at a predictable name
        write_private_file(path, data)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def _alive(owner: dict[str, object]) -> bool:
    """Whether the owning master still runs; a master on another host is assumed alive."""
    if owner.get("host") != socket.gethostname():
        return True
    try:
        pid = int(owner.get("pid", 0))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
