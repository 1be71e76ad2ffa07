"""What master, containers and clients agree on outside the messages: how a call proves
the secret and how a peer is checked (names both sides import, so neither copies them).

Every connection is TLS. A peer is trusted when it proves the key of the certificate the
client pins (``WEIR_TLS_CA``: the master's certificate, or the CA that issued it); only
then does the client send the secret, as ``authorization: Bearer <secret>``. A
certificate the master made for itself names :data:`PINNED_SERVER_NAME`, which peers
check instead of the host, because the certificate is pinned (nobody else holds its key)
and containers' addresses are not known when it is made: a client that trusts such a
certificate checks that name (:func:`pinned_server_name`).

>>> bearer_metadata("s3cret")
(('authorization', 'Bearer s3cret'),)
>>> grpc_tls_options(None)
[]
"""

from __future__ import annotations

import functools

__all__ = [
    "AUTH_HEADER",
    "BEARER",
    "CONTAINER_ID_ENV",
    "MASTER_FILE_ENV",
    "PARENT_PID_ENV",
    "PINNED_SERVER_NAME",
    "SECRET_ENV",
    "TLS_CA_ENV",
    "bearer_metadata",
    "grpc_tls_options",
    "pinned_server_name",
]

AUTH_HEADER = "authorization"
BEARER = "Bearer "

SECRET_ENV = "WEIR_SECRET"
"""The master's secret (containers, clients, or ``weir master`` instead of a fresh one)."""

TLS_CA_ENV = "WEIR_TLS_CA"
"""PEM file: the certificates a container or client trusts (the master's own, when the
master made it)."""

CONTAINER_ID_ENV = "WEIR_CONTAINER_ID"
"""Set in every launched container's environment: its container id (what a restarted
master checks before it adopts a process)."""

PARENT_PID_ENV = "WEIR_PARENT_PID"
"""Set by a launcher whose process holds the container (a Ray actor): the container dies
with that process (``container.parent_death``)."""

MASTER_FILE_ENV = "WEIR_MASTER_FILE"
"""Set in launched containers when the master has a state folder: its ``master.json``,
re-read by a container that lost the master (it may come back on another port)."""

PINNED_SERVER_NAME = "weir"
"""The one name in a certificate the master makes for itself."""


def bearer_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries ``secret`` (none without a secret)."""
    return ((AUTH_HEADER, BEARER + secret),) if secret else ()


def grpc_tls_options(server_name: str | None) -> list[tuple[str, str]]:
    """gRPC channel options that check ``server_name`` instead of the host (if given)."""
    return [("grpc.ssl_target_name_override", server_name)] if server_name else []


@functools.lru_cache(maxsize=16)
def pinned_server_name(roots: bytes) -> str | None:
    """:data:`PINNED_SERVER_NAME` if ``roots`` is one certificate naming only it (one the
    master made), else None (check the peer's host as usual).

    Raises:
        ValueError: ``roots`` holds no PEM certificate.
    """
    from cryptography import x509

    certificates = x509.load_pem_x509_certificates(roots)
    if len(certificates) != 1:
        return None
    try:
        names = certificates[0].extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        return None
    return PINNED_SERVER_NAME if names == [PINNED_SERVER_NAME] else None
