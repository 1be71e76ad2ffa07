"""The container's lease: operators act only while the master cannot have given up on it."""

from __future__ import annotations

import threading

import pytest

from weir.container.lease import Lease, LeaseRevoked


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_accepted_heartbeat_holds_the_lease_for_most_of_the_timeout():
    clock = Clock()
    lease = Lease(3000, clock)  # 2.4 s: 80 % of the timeout
    assert lease.valid
    clock.now += 2.3
    assert lease.valid
    clock.now += 0.2
    assert not lease.valid  # frozen past the lease: the master may have given up
    lease.renew(clock.now - 0.1)  # a heartbeat sent 0.1 s ago was answered
    assert lease.valid
    lease.renew(clock.now - 10)  # an old answer never shortens it
    clock.now += 2.2
    assert lease.valid


def test_an_operator_waits_while_the_lease_has_lapsed_and_goes_on_once_renewed():
    clock, stopped = Clock(), threading.Event()
    lease = Lease(1000, clock)
    clock.now += 1.0
    passed = threading.Event()

    def operator() -> None:
        lease.wait(stopped, poll_s=0.01)
        passed.set()

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    assert not passed.wait(0.2), "an operator acted on a lapsed lease"
    lease.renew(clock.now)
    assert passed.wait(5)
    thread.join(5)


def test_an_abort_revokes_the_lease_and_wakes_every_waiting_operator():
    clock, stopped = Clock(), threading.Event()
    lease = Lease(1000, clock)
    clock.now += 5
    errors: list[BaseException] = []

    def operator() -> None:
        try:
            lease.wait(stopped, poll_s=0.01)
        except LeaseRevoked as exc:
            errors.append(exc)

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    lease.revoke()
    thread.join(5)
    assert errors and "gave up on this container" in str(errors[0])
    lease.renew(clock.now)
    with pytest.raises(LeaseRevoked):
        lease.wait(stopped)  # revoked for good
