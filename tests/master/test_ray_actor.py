"""The Ray actor's container process, started here without Ray: the master's credentials
reach it through a pipe, never its environment (where ``/proc/<pid>/environ`` would show
them to any task of the same user on the node)."""

from __future__ import annotations

import json
import sys
import textwrap

from weir.master.ray_actor import ContainerProcess

PROBE = textwrap.dedent("""
    import os, sys
    environ = open(f"/proc/{os.getpid()}/environ", "rb").read()
    print("secret in environ:", b"s3cr3t" in environ, "WEIR_SECRET" in os.environ)
    print("argv:", sys.argv[-1])
    print("stdin:", sys.stdin.read())
""")


def test_the_credentials_reach_the_container_through_a_pipe_not_its_environment(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("WEIR_SECRET", "s3cr3t")  # the Ray worker's own: not inherited
    credentials = json.dumps({"secret": "s3cr3t", "tls_ca_pem": "PEM"})
    process = ContainerProcess("127.0.0.1:1", "app-0001-c0", {"WEIR_MASTER_FILE": "x"},
                               [sys.executable, "-c", PROBE], "weir-ray-test", credentials)
    assert process.wait() == 0
    log = process.log_path.read_text()
    assert "secret in environ: False False" in log
    assert "argv: --secret-stdin" in log
    assert f"stdin: {credentials}" in log
