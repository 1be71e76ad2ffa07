"""A key of a Kubernetes Secret volume, read through the kubelet's layout and checked.

The kubelet writes a Secret volume atomically (its AtomicWriter): the keys are files in a
timestamped folder (``..2026_12_08_01_30_00.123456789``), a link ``..data`` points at that
folder, and each key is a link ``<key> -> ..data/<key>``; an update writes a new folder and
swaps ``..data``. The volume's own folder is a tmpfs of mode 1777 (sticky: nobody may
replace an entry another user owns). With the pod's ``fsGroup`` set, each file's group is
that group and its mode gains group read (``defaultMode: 0400`` shows as 0440).

A plain secret file must be this user's and readable by nobody else
(``private_files.read_private_file``); a key of a Secret volume is read by resolving its
links once, within the volume, and checking what they lead to:

- the key and ``..data`` are links owned by this user or root, of the kubelet's shape;
- the timestamped folder is a real folder of this user or root that nobody else can write;
- the file, opened without following a link, is a regular file of this user or root that
  nobody else can write or read, except its group if that group is one of this
  process's (the pod's ``fsGroup``: only the pod's processes are in it).

An update swapping ``..data`` between the look and the open is read again.
"""

from __future__ import annotations

import errno
import os
import stat

from weir.storage.private_files import UntrustedPath, read_checked_file

__all__ = ["is_secret_volume_key", "read_secret_volume_key"]

_DATA = "..data"
_MAX_READ = 1 << 20
_ADVICE = ("mount the Secret with defaultMode 0400 (the kubelet shows 0440 with the pod's "
           "fsGroup) and run the container as the user that owns it or in its fsGroup")


def is_secret_volume_key(path: str) -> bool:
    """Whether ``path`` is a key of a Secret volume as the kubelet lays it out: a link
    ``<key> -> ..data/<key>`` beside a link ``..data``."""
    try:
        link = os.readlink(path)
        os.readlink(os.path.join(os.path.dirname(os.path.abspath(path)), _DATA))
    except OSError:
        return False
    return link == f"{_DATA}/{os.path.basename(path)}"


def _owner_problem(info: os.stat_result) -> str | None:
    if info.st_uid not in (os.getuid(), 0):
        return f"belongs to user {info.st_uid}, neither this user ({os.getuid()}) nor root"
    return None


def _refuse(path: str, what: str, problem: str) -> UntrustedPath:
    return UntrustedPath(errno.EPERM, f"{what} {path} (a Secret volume's key) {problem}; "
                                      f"{_ADVICE}")


def _check_links(folder: str, key_path: str, what: str) -> str:
    """The timestamped folder ``..data`` leads to, once the links are found the kubelet's."""
    info = os.lstat(folder)
    mode = stat.S_IMODE(info.st_mode)
    problem = _owner_problem(info) or (
        f"has mode {mode:o}: other users may replace its links (it is not sticky)"
        if mode & 0o022 and not mode & stat.S_ISVTX else None)
    if problem is not None:
        raise _refuse(folder, what, f"is in a folder that {problem}")
    for link in (key_path, os.path.join(folder, _DATA)):
        info = os.lstat(link)
        problem = _owner_problem(info)
        if problem is not None:
            raise _refuse(link, what, f"is a link that {problem}")
    target = os.readlink(os.path.join(folder, _DATA))
    if "/" in target or not target.startswith("..") or target in ("..", _DATA):
        raise _refuse(key_path, what, f"leads through ..data -> {target!r}, not to a "
                                      "timestamped folder of the volume")
    data_dir = os.path.join(folder, target)
    info = os.lstat(data_dir)
    problem = _owner_problem(info) or (
        "is not a folder" if not stat.S_ISDIR(info.st_mode) else None) or (
        f"has mode {stat.S_IMODE(info.st_mode):o}: other users may write in it"
        if stat.S_IMODE(info.st_mode) & 0o022 else None)
    if problem is not None:
        raise _refuse(data_dir, what, problem)
    return data_dir


def _file_problem(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    problem = _owner_problem(info)
    if problem is not None:
        return problem
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return f"has mode {mode:o}: other users may write it"
    if mode & 0o004:
        return f"has mode {mode:o}: every user may read it"
    if mode & 0o040 and info.st_gid not in {os.getgid(), *os.getgroups()}:
        return (f"has mode {mode:o}: group {info.st_gid} may read it, and this process is "
                "not in that group (the pod's fsGroup)")
    return None


def read_secret_volume_key(path: str, what: str = "the secret file") -> bytes:
    """The content of the Secret volume's key at ``path`` (see the module's checks).

    Raises:
        UntrustedPath: a link, folder or the file fails the checks (named, with what to
            change).
        OSError: it cannot be read (missing, or swapped by updates three times running).
    """
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    if not is_secret_volume_key(path):
        raise _refuse(path, what, "is not a link <key> -> ..data/<key> beside a link ..data")
    for attempt in range(3):
        data_dir = _check_links(folder, path, what)
        target = os.path.join(data_dir, name)
        try:
            return read_checked_file(target, _file_problem,
                                     lambda problem, t=target: _refuse(t, what, problem),
                                     _MAX_READ)
        except FileNotFoundError:
            if attempt == 2:
                raise
            # the kubelet swapped ..data meanwhile: look again
    raise FileNotFoundError(errno.ENOENT, "no file", path)  # pragma: no cover - loop returns
