"""Fencing by generation: a deployment of an operator that was replaced writes nothing more.

The master numbers every deployment of a physical operator (its generation, or attempt:
1 at the start, one more at each redeploy). A new deployment *claims* its operator's fence
before it restores anything: a small file holding the newest generation. Every durable
write on the operator's behalf (a checkpoint, a log record, a staged file, a commit step)
*checks* the fence just before it becomes visible and is refused (``Fenced``) if a newer
generation claimed it. So a container the master declared lost (frozen past its heartbeat
timeout, or cut off by the network) that wakes up cannot write into the state its
replacement uses: the ZooKeeper/HDFS fencing-token rule, on the state folder itself.

The file is read and written through a ``pyarrow.fs`` filesystem, so the fence works for
local and shared state folders alike. Generation 0 means "not fenced" (unit tests).

>>> import pyarrow.fs as pafs, tempfile
>>> folder = tempfile.mkdtemp()
>>> old, new = Fence(pafs.LocalFileSystem(), folder, 1), Fence(pafs.LocalFileSystem(), folder, 2)
>>> old.claim(); old.check(); new.claim()
>>> try:
...     old.check()
... except Fenced as exc:
...     print(exc)
generation 1 of this operator is fenced off: generation 2 replaced it
"""

from __future__ import annotations

import logging
import uuid

import pyarrow.fs as pafs

__all__ = ["CHECKPOINTS_FOLDER", "FENCE_FILE", "Fence", "Fenced", "highest_fence"]

_LOGGER = logging.getLogger(__name__)

FENCE_FILE = "FENCE"

CHECKPOINTS_FOLDER = "checkpoints"
"""The folder of a state folder with one folder per operator: its checkpoints and FENCE."""


class Fenced(RuntimeError):
    """This deployment of the operator was replaced by a newer one: it must not write.

    Attributes:
        generation: this deployment's generation.
        current: the generation that holds the fence.
    """

    def __init__(self, generation: int, current: int, what: str = "this operator") -> None:
        super().__init__(f"generation {generation} of {what} is fenced off: generation "
                         f"{current} replaced it")
        self.generation = generation
        self.current = current


class Fence:
    """The fence of one operator: ``folder/FENCE`` on ``fs``, seen by ``generation``.

    Args:
        fs: the filesystem of the operator's state.
        folder: the operator's folder (created on claim).
        generation: this deployment's generation; 0 = unfenced (every call passes).
        what: how errors name the operator.
    """

    def __init__(self, fs: pafs.FileSystem, folder: str, generation: int,
                 what: str = "this operator") -> None:
        self.fs = fs
        self.folder = folder.rstrip("/")
        self.generation = generation
        self.what = what

    @property
    def path(self) -> str:
        return f"{self.folder}/{FENCE_FILE}"

    def current(self) -> int:
        """The generation holding the fence; 0 if none claimed it yet.

        A fence file that cannot be read as a number is treated as not written (a claim
        torn by a crash): the claim writes it whole again, atomically.
        """
        try:
            with self.fs.open_input_stream(self.path) as stream:
                text = stream.read(64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return 0
        try:
            return int(text)
        except ValueError:
            _LOGGER.warning("fence %s holds %r, not a generation; taken as unclaimed",
                            self.path, text)
            return 0

    def check(self) -> None:
        """Raises Fenced if a newer generation claimed the fence."""
        if not self.generation:
            return
        current = self.current()
        if current > self.generation:
            raise Fenced(self.generation, current, self.what)

    def claim(self) -> None:
        """Makes this generation the fence's holder (nothing to do if it already is).

        Raises:
            Fenced: a newer generation holds it already (this deployment is stale).
        """
        if not self.generation:
            return
        current = self.current()
        if current > self.generation:
            raise Fenced(self.generation, current, self.what)
        if current == self.generation:
            return
        self.fs.create_dir(self.folder, recursive=True)
        tmp = f"{self.folder}/.{FENCE_FILE}.{uuid.uuid4().hex}.tmp"
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(f"{self.generation}\n".encode("ascii"))
            self.fs.move(tmp, self.path)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except Exception:  # noqa: BLE001 - best effort after a failed claim
                pass
            raise
        _LOGGER.debug("fence %s claimed by generation %d (was %d)", self.path,
                      self.generation, current)


def highest_fence(fs: pafs.FileSystem, state_root: str) -> int:
    """The highest generation any operator's fence in the state folder ``state_root`` holds
    (0: none). A new run starts its generations above it, so no fence an earlier run left
    refuses its deployments, and that run's stragglers are fenced off by the new one."""
    selector = pafs.FileSelector(f"{state_root.rstrip('/')}/{CHECKPOINTS_FOLDER}",
                                 allow_not_found=True)
    highest = 0
    for info in fs.get_file_info(selector):
        if info.type == pafs.FileType.Directory:
            highest = max(highest, Fence(fs, info.path, 0).current())
    return highest
