"""`weir master` whose journal cannot be written stops serving and exits 1, naming why.

The journal's disk is made to fail for real: the master process runs under a file-size
limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write past it fails with EFBIG), and
applications are submitted until the journal outgrows it.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import poll_for, tagged_env
from tests.master.fakes import chain_descriptor
from weir.master.client import WeirClient, WeirClientError

pytestmark = pytest.mark.timeout(120)

_FILE_LIMIT_BYTES = 256 * 1024
_SUBMITS = 2_000  # far more than the journal takes to pass the limit


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_LIMIT_BYTES, _FILE_LIMIT_BYTES))


def _address(log: Path, proc: subprocess.Popen[bytes]) -> str | None:
    text = log.read_text(errors="replace")
    lines = text.splitlines()
    if "{" in lines and "}" in lines[lines.index("{"):]:
        start = lines.index("{")
        return json.loads("\n".join(lines[start:lines.index("}", start) + 1]))["address"]
    if proc.poll() is not None:
        raise AssertionError(f"the master exited:\n{text}")
    return None


def test_master_whose_journal_fails_refuses_the_change_and_exits_1(tmp_path):
    env, _ = tagged_env(WEIR_HOME=str(tmp_path / "home"))
    state = tmp_path / "master-state"
    log = tmp_path / "master.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "weir", "master", "--port", "0", "--json",
             "--launcher", "recording", "--state-dir", str(state)],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_limit_file_size)
    try:
        address = poll_for(lambda: _address(log, proc), 60, "the master to start")
        secret = (state / "secret").read_text().strip()
        accepted = []
        refusal = None
        with WeirClient(address, secret=secret, tls_ca=state / "tls" / "cert.pem",
                        timeout_s=10) as client:
            for _ in range(_SUBMITS):
                try:
                    accepted.append(client.submit(chain_descriptor(3)))
                except WeirClientError as exc:
                    refusal = str(exc)
                    break
        assert refusal is not None, f"{len(accepted)} submits, the journal never failed"
        assert accepted, "the first submits fit the journal"
        assert "cannot write its journal" in refusal
        assert proc.wait(30) == 1
        output = log.read_text(errors="replace")
        assert "weir: error: the master stopped: it cannot write its journal" in output
        assert "--state-dir" in output.splitlines()[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
