"""What must survive a crash: checksummed record logs, per-window source logs, commit steps,
and the fence that keeps a replaced deployment from writing into them.

Operators keep these in their durable folder (``OperatorContext.durable_dir``).
"""

from weir.storage.commit_steps import (
    AdvanceWatermark,
    CommitError,
    CommitStep,
    CommitStepStore,
    PublishFile,
    register_step,
)
from weir.storage.fence import FENCE_FILE, Fence, Fenced
from weir.storage.records import CorruptLog, RecordLog, sync_folder
from weir.storage.window_log import WindowLog

__all__ = [
    "AdvanceWatermark",
    "CommitError",
    "CommitStep",
    "CommitStepStore",
    "CorruptLog",
    "FENCE_FILE",
    "Fence",
    "Fenced",
    "PublishFile",
    "RecordLog",
    "WindowLog",
    "register_step",
    "sync_folder",
]
