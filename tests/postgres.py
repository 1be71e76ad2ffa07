"""A real PostgreSQL server for tests: ``$WEIR_TEST_POSTGRES_DSN``, or a private one.

The private server lives in a temporary folder (``initdb``), listens on a free port of
127.0.0.1 and a Unix socket in that folder only, trusts local connections, and is stopped
with ``pg_ctl stop -m immediate`` when the session ends. PostgreSQL refuses to run as
root, so as root the server runs as the ``postgres`` user (Debian's package makes it).
Without server binaries the tests skip, unless ``WEIR_REQUIRE_POSTGRES=1`` (CI) makes
that a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from tests.harness import free_port

__all__ = ["PrivatePostgres", "find_server_binaries", "postgres_dsn_for_session"]

DSN_VARIABLE = "WEIR_TEST_POSTGRES_DSN"
REQUIRE_VARIABLE = "WEIR_REQUIRE_POSTGRES"
DATABASE = "weir_test"
SUPERUSER = "weir"
_COMMAND_TIMEOUT_SECONDS = 120


def find_server_binaries() -> str | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: PATH first, then Debian's."""
    found = shutil.which("initdb")
    candidates = [os.path.dirname(os.path.realpath(found))] if found else []

    def version(folder: str) -> tuple[int, ...]:
        match = re.search(r"/postgresql/([0-9.]+)/bin$", folder)
        return tuple(int(p) for p in match.group(1).split(".") if p) if match else ()

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for folder in candidates:
        if all(os.access(os.path.join(folder, b), os.X_OK)
               for b in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


class PrivatePostgres:
    """A throwaway PostgreSQL server in a temporary folder; ``start()`` then ``stop()``."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir
        self.root = tempfile.mkdtemp(prefix="weir-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = 0
        self.run_as: str | None = None
        if os.geteuid() == 0:  # postgres will not run as root
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, and there is no 'postgres' user to run "
                                   "the test server as (install Debian's postgresql package, "
                                   f"or set {DSN_VARIABLE})") from None
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.run_as = "postgres"

    @property
    def dsn(self) -> str:
        return (f"host=127.0.0.1 port={self.port} dbname={DATABASE} user={SUPERUSER} "
                "connect_timeout=10")

    def _run(self, *args: str, timeout: float = _COMMAND_TIMEOUT_SECONDS) -> None:
        command = [os.path.join(self.bin_dir, args[0]), *args[1:]]
        if self.run_as is not None:
            if shutil.which("runuser"):
                command = ["runuser", "-u", self.run_as, "--", *command]
            else:
                command = ["su", self.run_as, "-s", "/bin/sh", "-c", shlex.join(command)]
        done = subprocess.run(command, cwd=self.root, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as log:
                return "\nserver log:\n" + "".join(log.readlines()[-20:])
        except OSError:
            return ""

    def start(self) -> str:
        """initdb, start on a free port, create the test database; returns the DSN."""
        self._run("initdb", "-D", self.data, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        for attempt in range(3):  # the port may be taken between probe and bind
            self.port = free_port()
            options = (f"-p {self.port} -k {shlex.quote(self.root)} "
                       "-c listen_addresses=127.0.0.1 -c fsync=off "
                       "-c full_page_writes=off -c max_connections=50")
            try:
                self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60",
                          "-o", options, "start", timeout=90)
                break
            except RuntimeError:
                self._kill()
                if attempt == 2:
                    raise
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} dbname=postgres "
                             f"user={SUPERUSER} connect_timeout=10", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        return self.dsn

    def stop(self) -> None:
        """Stops the server at once (bounded), kills it if that fails, removes the folder."""
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "30", "stop",
                      timeout=45)
        except (RuntimeError, subprocess.TimeoutExpired):
            self._kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill(self) -> None:
        """SIGKILLs the postmaster named in ``postmaster.pid``, if any."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(os.path.join(self.data, "postmaster.pid")) as pid_file:
                os.kill(int(pid_file.readline().strip()), signal.SIGKILL)


def postgres_dsn_for_session() -> Iterator[str]:
    """Yields a DSN to a real server for the whole session; see the module docs."""
    given = os.environ.get(DSN_VARIABLE)
    if given:
        yield given
        return
    bin_dir = find_server_binaries()
    if bin_dir is None:
        reason = ("no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PATH or "
                  "/usr/lib/postgresql/*/bin: install Debian's postgresql package, or set "
                  f"{DSN_VARIABLE} to a server's DSN")
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{REQUIRE_VARIABLE}=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    server: PrivatePostgres | None = None
    try:
        server = PrivatePostgres(bin_dir)
        dsn = server.start()
    except Exception as exc:
        if server is not None:
            server.stop()
        pytest.fail(f"could not start a private PostgreSQL server from {bin_dir}: {exc}",
                    pytrace=False)
    try:
        yield dsn
    finally:
        server.stop()
