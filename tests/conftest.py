"""Shared fixtures: Spark kept small, every process started by a test stopped by it."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest

# Spark's Python workers must run this interpreter (it has pyarrow); tests keep Spark small.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

# Masters write their secret files here, not in ~/.weir; `weir` subprocesses and WeirClient
# find them there. A secret or TLS setting of the shell must not leak into the tests.
_WEIR_HOME = tempfile.mkdtemp(prefix="weir-test-home-")
os.environ["WEIR_HOME"] = _WEIR_HOME
atexit.register(shutil.rmtree, _WEIR_HOME, ignore_errors=True)
for _name in ("WEIR_SECRET", "WEIR_TLS_CERT", "WEIR_TLS_KEY", "WEIR_TLS_CA"):
    os.environ.pop(_name, None)


@pytest.fixture
def state_dir(tmp_path):
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def bridge():
    """One small Spark session (``local[1]``, one shuffle partition) for all unit tests."""
    from container.spark_bridge import SparkSessionBridge

    bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1)
    yield bridge
    bridge.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    """A real Spark standalone master and worker on loopback (``tests/spark_cluster.py``):
    1 core, 1 GB for executors, shared by a module's tests (starting one takes seconds);
    stopped, with nothing left, after them."""
    from tests.spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_dsn():
    """A DSN to a real PostgreSQL server for the session (``tests/postgres.py``)."""
    from tests.postgres import postgres_dsn_for_session

    yield from postgres_dsn_for_session()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM paths).

    Made with the ``openssl`` command (the project needs no crypto library); skips without it.
    """
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("TLS tests need the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key
