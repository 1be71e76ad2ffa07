"""The Ray launcher's checks (``ray_launcher_checks.py``) on a real Ray cluster, in a
pytest process of their own: that process becomes a Ray driver, and a driver's shutdown
racing a thread's Ray call took a whole pytest process down once; the suite's own
process never connects to Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_the_ray_launcher_checks_pass_in_a_process_of_their_own():
    checks = Path(__file__).with_name("ray_launcher_checks.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(checks)], capture_output=True, text=True, timeout=280,
                          cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-8000:]}\n{done.stderr[-3000:]}"
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
