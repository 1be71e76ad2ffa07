"""Network namespaces as stand-in hosts: several "machines" on one, for multi-host tests.

``Lab(n)`` makes ``n`` namespaces, each with one address in a private /24, plus an address
for this process's (the root) namespace on the same network. The namespaces are wired to
a bridge that lives in a namespace of its own (the switch), not in the root namespace:
there the host's firewall (Docker's ``FORWARD DROP`` with ``br_netfilter``) would drop
bridged traffic. Deleting the namespaces removes every link, so ``close()`` leaves
nothing behind even after a half-made lab.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence

__all__ = ["Lab", "NetnsUnavailable", "unavailable_reason"]

_IP_TIMEOUT_S = 20.0


class NetnsUnavailable(RuntimeError):
    """This machine does not let the test make network namespaces (the reason says why)."""


def _ip(*args: str) -> None:
    """Runs ``ip ARGS``; raises RuntimeError with ip's own message on failure."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip``, not permitted), or
    None when they can: found by making (and deleting) one."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command"
    probe = f"weir-probe-{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=_IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True,
                   timeout=_IP_TIMEOUT_S, check=False)
    return None


def _used_networks() -> list[ipaddress.IPv4Network]:
    done = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                          timeout=_IP_TIMEOUT_S, check=False)
    networks = []
    for line in done.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            networks.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    return networks


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.200.N.0/24 that no interface of the root namespace is on (random N)."""
    used = _used_networks()
    for third in random.sample(range(1, 255), 254):
        subnet = ipaddress.ip_network(f"10.200.{third}.0/24")
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise NetnsUnavailable("no free 10.200.N.0/24 subnet for the test network")


class Lab:
    """``hosts`` network namespaces on one private network with the root namespace.

    Attributes:
        names: the namespaces, one per stand-in host.
        addresses: their addresses (``addresses[i]`` is in ``names[i]``).
        root_address: this process's address on that network.

    Raises:
        NetnsUnavailable: making a namespace is not permitted (nothing is left behind).
        RuntimeError: another ``ip`` step failed (nothing is left behind).
    """

    def __init__(self, hosts: int) -> None:
        tag = secrets.token_hex(3)
        self.switch = f"weir-{tag}-sw"
        self.names = [f"weir-{tag}-{i}" for i in range(hosts)]
        self._root_link = f"weir{tag}r"  # the only link in the root namespace (<= 15 chars)
        subnet = _free_subnet()
        hosts_iter = subnet.hosts()
        self.addresses = [str(next(hosts_iter)) for _ in range(hosts)]
        self.root_address = str(subnet.broadcast_address - 1)
        self.prefix = subnet.prefixlen
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, name: str) -> None:
        try:
            _ip("netns", "add", name)
        except RuntimeError as exc:
            if "Operation not permitted" in str(exc) or "Permission denied" in str(exc):
                raise NetnsUnavailable(str(exc)) from None
            raise
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            self._add_namespace(name)
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", name)
            self._plug(port)
            _ip("-n", name, "addr", "add", f"{address}/{self.prefix}", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
        _ip("link", "add", self._root_link, "type", "veth", "peer", "name", "proot", "netns",
            self.switch)
        self._plug("proot")
        _ip("addr", "add", f"{self.root_address}/{self.prefix}", "dev", self._root_link)
        _ip("link", "set", self._root_link, "up")

    def _plug(self, port: str) -> None:
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``host`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.names[host], *argv]

    def wait_reachable(self, address: str, port: int, timeout_s: float) -> None:
        """Waits until this namespace can open TCP connections to ``address:port``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((address, port), timeout=1.0).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{address}:{port} not reachable from the root "
                                         f"namespace within {timeout_s} s: {exc}") from None
                time.sleep(0.1)

    def close(self) -> None:
        """Deletes every namespace made (their links go with them) and the root's link."""
        subprocess.run(["ip", "link", "delete", self._root_link], capture_output=True,
                       timeout=_IP_TIMEOUT_S, check=False)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True,
                           timeout=_IP_TIMEOUT_S, check=False)
        self._made.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
