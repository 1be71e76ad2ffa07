"""Files and folders only this user controls: checked before they are trusted, written so
that nobody else can read them or redirect the write.

What Weir keeps on disk is code or keys: checkpoints and savepoint parts are unpickled,
the master's state folder holds its secret, its TLS key and its journal (unpickled too).
So a folder or file another local user could have made, or could write into, is refused
before anything in it is read, and everything Weir writes is owner-only and goes through
a fresh, randomly named temporary file renamed into place: a link planted at the final or
a temporary name is never followed.

Every check looks at the path itself (``lstat``: a symbolic link is refused, never
followed) and asks three things: is it what it should be (a folder, a regular file), is it
this user's, and could another user write it (mode bits for group or others). A file
that holds a secret must not even be readable by others.

>>> import tempfile, os
>>> root = tempfile.mkdtemp()
>>> write_private_file(os.path.join(root, "key"), b"k")
>>> read_private_file(os.path.join(root, "key"), "the key", secret=True)
b'k'
>>> oct(os.stat(os.path.join(root, "key")).st_mode & 0o777)
'0o600'
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable

from weir.storage.records import sync_folder

__all__ = ["UntrustedPath", "check_private_dir", "check_private_file", "check_private_tree",
           "make_private_dir", "read_checked_file", "read_private_file", "write_private_file"]

_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MAX_READ = 64 << 20  # nothing Weir reads this way is larger; a bigger file is not ours


class UntrustedPath(PermissionError):
    """A file or folder that another user could have made or changed; the message names
    it, says what is wrong and what to do."""


def _problem(info: os.stat_result, kind: str, secret: bool) -> str | None:
    """What makes ``info`` untrustworthy as a ``kind`` ("folder" or "file"), or None."""
    wanted = stat.S_ISDIR if kind == "folder" else stat.S_ISREG
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link (never followed)"
    if not wanted(info.st_mode):
        return f"is not a {'folder' if kind == 'folder' else 'regular file'}"
    if info.st_uid != os.getuid():
        return f"belongs to user {info.st_uid}, not to this user ({os.getuid()})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return f"has mode {mode:o}: other users may write in it"
    if secret and mode & 0o077:
        return f"has mode {mode:o}: other users may read it"
    return None


def _refuse(path: str, what: str, problem: str, advice: str) -> UntrustedPath:
    return UntrustedPath(errno.EPERM, f"{what} {path} {problem}; {advice}")


def check_private_dir(path: str, what: str = "the folder", *, close: bool = False,
                      advice: str = "remove it, or give a folder of your own") -> None:
    """Raises ``UntrustedPath`` unless ``path`` is a real folder of this user that nobody
    else can write into. ``close``: one that others could only read or enter is closed to
    mode 0700 (older Weir versions made folders 0755) rather than refused."""
    info = os.lstat(path)
    problem = _problem(info, "folder", secret=False)
    if problem is None and close and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    elif problem is not None:
        raise _refuse(path, what, problem, advice)


def make_private_dir(path: str, what: str = "the folder", *,
                     advice: str = "remove it, or give a folder of your own") -> None:
    """Creates ``path`` (and missing parents) owner-only, or checks the one that is there
    (``check_private_dir`` with ``close``): the folder is this user's alone afterwards."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    check_private_dir(path, what, close=True, advice=advice)


def check_private_file(path: str, what: str = "the file", *, secret: bool = False,
                       advice: str = "remove it, or give a file of your own") -> None:
    """Raises ``UntrustedPath`` unless ``path`` is a regular file of this user that nobody
    else can write (nor read, with ``secret``)."""
    problem = _problem(os.lstat(path), "file", secret)
    if problem is not None:
        raise _refuse(path, what, problem, advice)


def check_private_tree(path: str, what: str = "the folder", *,
                       advice: str = "remove it, or give a folder of your own") -> None:
    """``check_private_dir`` on ``path`` and every folder under it, ``check_private_file``
    on every file: nothing in the tree is a link, another user's, or writable by others."""
    check_private_dir(path, what, advice=advice)
    for folder, dirs, files in os.walk(path):
        for name in dirs:
            check_private_dir(os.path.join(folder, name), f"a folder of {what}", advice=advice)
        for name in files:
            check_private_file(os.path.join(folder, name), f"a file of {what}", advice=advice)


def read_private_file(path: str, what: str = "the file", *, secret: bool = False,
                      advice: str = "remove it, or give a file of your own") -> bytes:
    """The content of ``path``, checked on the open descriptor (no race with a swap): a
    link is not followed, a FIFO or device does not block the caller, and a file another
    user owns or can write is refused (``UntrustedPath``)."""
    return read_checked_file(path, lambda info: _problem(info, "file", secret),
                             lambda problem: _refuse(path, what, problem, advice))


def read_checked_file(path: str, problem_of: Callable[[os.stat_result], str | None],
                      refusal: Callable[[str], Exception], max_bytes: int = _MAX_READ
                      ) -> bytes:
    """The content of ``path``, opened without following a link or blocking on a FIFO,
    once ``problem_of`` finds nothing wrong with the open descriptor's status (no race
    with a swap); else ``refusal(problem)`` is raised, as it is for a file over
    ``max_bytes``."""
    fd = os.open(path, os.O_RDONLY | _NO_FOLLOW | os.O_NONBLOCK)  # ELOOP on a link
    try:
        problem = problem_of(os.fstat(fd))
        if problem is not None:
            raise refusal(problem)
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise refusal(f"is larger than {max_bytes >> 20} MB")
    return data


def write_private_file(path: str, data: bytes, *, sync: bool = True) -> None:
    """Writes ``data`` to ``path`` atomically, mode 0600: through a new file of a random
    name (``O_EXCL``: never a planted link or file) that is synced, then renamed over
    ``path`` (a rename replaces a link at ``path``; it does not write through it)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(data)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    if sync:
        sync_folder(folder)
