"""Where windows are handed to Spark by default: /dev/shm only when it has room (a
Kubernetes pod's is 64 MiB), else the temporary folder (the pod's emptyDir)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from weir.runtime.spark import handoff


def test_a_small_dev_shm_is_passed_over_for_the_temporary_folder(monkeypatch, tmp_path):
    real = os.statvfs

    def statvfs(path, free_bytes):
        got = real(tmp_path)
        fields = list(got)
        fields[4] = free_bytes // got.f_frsize  # f_bavail
        return os.statvfs_result(fields)

    monkeypatch.setattr(handoff.os.path, "isdir", lambda path: True)
    monkeypatch.setattr(handoff.os, "access", lambda path, mode: True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(handoff.os, "statvfs", lambda path: statvfs(path, 64 << 20))
    assert handoff.default_scratch_parent() == Path(tmp_path)  # a pod's 64 MiB
    monkeypatch.setattr(handoff.os, "statvfs", lambda path: statvfs(path, 8 << 30))
    assert handoff.default_scratch_parent() == Path("/dev/shm")
