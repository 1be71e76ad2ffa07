"""The master's TLS identity: every master serves TLS, with a certificate it makes at start
unless it is given one, and hands that identity to its containers for their buffer servers.

Why by default: a client that talks to whoever holds a port (a master that died, a buffer
server that closed) would hand a stranger the secret and unpickle what it answers. With
TLS, a peer must prove the key of a certificate the client pins before the client sends
anything; a stranger's handshake fails and it learns nothing.

A certificate the master makes is self-signed, names only
:data:`proto.contract.PINNED_SERVER_NAME` (peers check that name, not the host, so one
certificate fits containers on any host) and is kept in the master's state folder, so
containers that outlive a master restart still trust the master that comes back.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import grpc

from weir.proto import umbilical_pb2
from weir.proto.contract import PINNED_SERVER_NAME, TLS_CA_ENV, grpc_tls_options, pinned_server_name
from weir.storage.orphans import remove_orphans
from weir.storage.private_files import (
    check_private_file,
    make_private_dir,
    write_private_file,
)

__all__ = ["TemporaryIdentity", "TlsFiles", "identity_for", "make_self_signed",
           "open_channel", "read_pem"]

_CERT, _KEY = "cert.pem", "key.pem"
_TEMP_PREFIX = "weir-tls-"
_VALID_DAYS = 3650  # a pinned certificate is replaced with its master, not by expiry
_FOLDER = "the master's TLS folder"

TLS_CERT_ENV = "WEIR_TLS_CERT"
TLS_KEY_ENV = "WEIR_TLS_KEY"


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """A server's TLS certificate and key (PEM files), and what its clients should trust.

    ``ca`` defaults to the certificate itself: right for a self-signed certificate; pass
    the issuing CA's certificate otherwise.
    """

    cert: Path
    key: Path
    ca: Path | None = None

    @property
    def trusted(self) -> Path:
        return self.ca or self.cert

    def server_credentials(self) -> grpc.ServerCredentials:
        """Raises OSError (unreadable file) with the file named."""
        return grpc.ssl_server_credentials([(read_pem(self.key), read_pem(self.cert))])

    def identity(self) -> umbilical_pb2.TlsIdentity:
        """What containers serve their buffer servers with: this very certificate."""
        return umbilical_pb2.TlsIdentity(certificate_pem=read_pem(self.cert),
                                         private_key_pem=read_pem(self.key))

    def client_env(self) -> dict[str, str]:
        """What a launched container needs to check its master (and buffer servers)."""
        return {TLS_CA_ENV: str(self.trusted)}

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, ca: str | None = None
                     ) -> TlsFiles | None:
        """The user's own certificate (options or environment); None if neither is set.

        Raises:
            ValueError: only one of certificate and key.
        """
        cert = cert or os.environ.get(TLS_CERT_ENV) or None
        key = key or os.environ.get(TLS_KEY_ENV) or None
        ca = ca or os.environ.get(TLS_CA_ENV) or None
        if not cert and not key:
            return None
        if not cert or not key:
            raise ValueError("TLS needs both --tls-cert and --tls-key "
                             f"(or {TLS_CERT_ENV} and {TLS_KEY_ENV})")
        return cls(Path(cert).resolve(), Path(key).resolve(),
                   Path(ca).resolve() if ca else None)


def read_pem(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read {path}: {exc.strerror or exc}") from None


def make_self_signed(folder: Path) -> TlsFiles:
    """A fresh self-signed certificate and key in ``folder`` (made or checked owner-only;
    files 0600, written through fresh random names, never through a planted link).

    An EC P-256 key; the certificate names :data:`PINNED_SERVER_NAME` only.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PINNED_SERVER_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(PINNED_SERVER_NAME)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    make_private_dir(str(folder), _FOLDER)
    write_private_file(str(folder / _KEY), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    write_private_file(str(folder / _CERT), cert.public_bytes(serialization.Encoding.PEM))
    return TlsFiles(folder / _CERT, folder / _KEY)


def identity_for(folder: Path) -> TlsFiles:
    """The certificate kept in ``folder`` by an earlier run, else a fresh one kept there.

    A kept pair is pinned by every container and its key proves the master, so it is
    taken only from an owner-only folder of this user, as regular files of this user
    (never links), the key readable by nobody else.

    Raises:
        UntrustedPath: the folder, certificate or key fails those checks (named).
    """
    make_private_dir(str(folder), _FOLDER)
    cert, key = folder / _CERT, folder / _KEY
    try:
        check_private_file(str(cert), "the master's kept certificate")
        check_private_file(str(key), "the master's kept TLS key", secret=True)
    except FileNotFoundError:
        return make_self_signed(folder)
    return TlsFiles(cert, key)


class TemporaryIdentity:
    """A self-signed identity in a private temporary folder, removed by ``cleanup``
    (a master without a state folder: nothing of it survives a stop)."""

    def __init__(self) -> None:
        parent = Path(tempfile.gettempdir())
        remove_orphans(parent, _TEMP_PREFIX)  # a killed master's key goes too
        folder = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=parent))
        self._remove = weakref.finalize(self, shutil.rmtree, folder, True)
        self.files = make_self_signed(folder)

    def cleanup(self) -> None:
        self._remove()


def open_channel(address: str, roots: bytes, options: list[tuple[str, Any]]
                 ) -> grpc.Channel:
    """A TLS channel to ``address`` that trusts only ``roots`` (PEM); a pinned master
    certificate's name is checked instead of the host."""
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    return grpc.secure_channel(address, credentials,
                               options=[*options, *grpc_tls_options(pinned_server_name(roots))])
