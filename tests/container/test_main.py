"""The container's entry point: how long it waits for a master that went away, and how
it takes the master's credentials."""

from __future__ import annotations

import pytest

from weir.container.main import master_retry_window_s


def test_a_container_outlasts_a_slow_master_restart():
    # the heartbeat timeout used to decide alone: 10 s by default, 3 s in tests, while
    # the README promises that containers retry a restarting master for 30 s
    assert master_retry_window_s({}) == 30.0
    assert master_retry_window_s({"HEARTBEAT_TIMEOUT_MILLIS": "3000"}) == 30.0
    assert master_retry_window_s({"HEARTBEAT_TIMEOUT_MILLIS": "60000"}) == 60.0


def test_a_spare_whose_spark_cannot_start_stops_its_loop_with_the_reason():
    """Such a spare would otherwise wait as SPARE_STARTING for good: it exits instead and
    the master, seeing the process end, starts another."""
    from weir.container.main import warm_spare_or_stop

    class BrokenSpark:
        def warm_up(self, *, bounded=True):
            assert not bounded  # a spare warms off every critical path
            raise RuntimeError("Java gateway process exited before sending its port number")

    class Loop:
        stopped = False

        def stop(self):
            self.stopped = True

    loop, failure = Loop(), []
    warm_spare_or_stop(BrokenSpark(), loop, failure, "app-0001-c3")
    assert loop.stopped
    assert failure == ["Spark did not start in this spare: Java gateway process exited "
                       "before sending its port number"]

    class WarmSpark:
        def warm_up(self, *, bounded=True):
            pass

    loop, failure = Loop(), []
    warm_spare_or_stop(WarmSpark(), loop, failure, "app-0001-c4")
    assert not loop.stopped and failure == []


def test_a_secret_file_others_may_read_or_another_user_made_is_refused(tmp_path, shared_dir):
    import json

    from tests.users import as_other_user, other_user_available
    from weir.container.main import _read_secret_file

    mine = tmp_path / "copied.secret"
    mine.write_text(json.dumps({"secret": "s3cr3t", "tls_ca_pem": "PEM"}))
    mine.chmod(0o600)
    assert _read_secret_file(str(mine))["secret"] == "s3cr3t"
    mine.chmod(0o644)
    with pytest.raises(ValueError, match="other users may read it; chmod 600 it"):
        _read_secret_file(str(mine))
    if other_user_available():
        planted = shared_dir / "master.secret"
        as_other_user(lambda: (planted.write_text('{"secret": "theirs"}'), planted.chmod(0o600)))
        with pytest.raises(ValueError, match="belongs to user"):
            _read_secret_file(str(planted))


def test_credentials_come_through_a_pipe_and_nothing_else():
    """``--secret-stdin`` (the Ray actor's way): JSON from a pipe; a file or a terminal
    on standard input, or a pipe without a secret, is refused naming what to do."""
    import json
    import os
    import tempfile

    import pytest

    from weir.container.main import _read_secret_pipe

    read_end, write_end = os.pipe()
    os.write(write_end, json.dumps({"secret": "s3cr3t", "tls_ca_pem": "PEM"}).encode())
    os.close(write_end)
    with os.fdopen(read_end, "rb") as stream:
        assert _read_secret_pipe(stream) == {"secret": "s3cr3t", "tls_ca_pem": "PEM"}
    read_end, write_end = os.pipe()
    os.write(write_end, b'{"tls_ca_pem": "PEM"}')
    os.close(write_end)
    with os.fdopen(read_end, "rb") as stream, pytest.raises(ValueError, match="no secret"):
        _read_secret_pipe(stream)
    with tempfile.TemporaryFile() as file, pytest.raises(ValueError, match="not a pipe"):
        _read_secret_pipe(file)
