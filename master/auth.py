"""The master's secret: who may call the master, and how clients find the secret and the
certificate that proves the master is the one they mean.

Operators travel as pickled code, so whoever can call the master (or a container's
buffer server) can run code as the master's user. Every master therefore has a secret,
generated at start unless one is given, and every gRPC call must carry it as
``authorization: Bearer <secret>`` (``proto.contract``), always inside TLS
(``master.tls``): a client sends it only to a peer that proved the pinned certificate.

Clients on the master's machine need no setup: the master writes its address, secret
and certificate to ``$WEIR_HOME/master-<port>.secret`` (``~/.weir`` by default),
readable by its owner only, and removes it when it stops. Elsewhere, a copy of that
file (``--secret-file``), or ``WEIR_SECRET`` with ``WEIR_TLS_CA``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from weir.master.tls import TlsFiles, read_pem
from weir.proto.contract import AUTH_HEADER, BEARER, SECRET_ENV, TLS_CA_ENV
from weir.storage.private_files import (
    UntrustedPath,
    make_private_dir,
    read_private_file,
    write_private_file,
)

__all__ = [
    "HOME_ENV",
    "kept_secret",
    "AuthInterceptor",
    "ClientCredentials",
    "client_credentials",
    "container_env",
    "http_token",
    "new_secret",
    "read_secret_file",
    "remove_secret_file",
    "secret_path",
    "weir_home",
    "write_secret_file",
]

_LOGGER = logging.getLogger(__name__)

HOME_ENV = "WEIR_HOME"
"""Where masters write their secret files (``~/.weir`` by default)."""

_HOW = (f"set {SECRET_ENV} or pass --secret-file (a master writes its secret to "
        "~/.weir/master-<port>.secret on its machine, readable by its owner only)")


def new_secret() -> str:
    """A fresh random secret (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def kept_secret(folder: Path, what: str, advice: str) -> str:
    """The secret an earlier run kept in ``folder/secret``, or a new one kept there (a
    master's, a dispatcher's). The kept one is read only from a regular file of this user
    that nobody else can read or write (never through a link).

    Raises:
        OSError: it cannot be read or written (``UntrustedPath`` names the check).
    """
    path = folder / "secret"
    try:
        kept = read_private_file(str(path), what, secret=True, advice=advice).decode().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    secret = new_secret()
    write_private_file(str(path), (secret + "\n").encode())
    return secret


def http_token(secret: str) -> str:
    """The token the HTTP port wants: derived from the secret, good for reading only.

    The HTTP API and dashboard are read-only, and a browser sends whatever it was given
    to whoever holds the port (a dashboard tab keeps polling a master that died), so
    they never see the secret itself: whoever learns this token can read figures, not
    submit, deploy or call a container. It is the same for as long as the secret is.
    """
    digest = hmac.new(secret.encode(), b"weir http read-only token v1", hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def container_env(secret: str, tls: TlsFiles) -> dict[str, str]:
    """What a container the master launches needs in its environment to call back: the
    secret and the certificate it checks the master (and other buffer servers) by.

    The environment, not the command line: ``ps`` shows command lines to every user,
    while ``/proc/<pid>/environ`` is readable by the owner only. The key of the
    certificate comes later, over TLS, in the container's init context.
    """
    return {SECRET_ENV: secret, **tls.client_env()}


# -- the server side --------------------------------------------------------------------
class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call that lacks the master's secret.

    A refused request is never read: its handler takes the request as a stream it never
    iterates, so gRPC's flow control stops the caller after the first window (64 kB) and
    a stranger's 60 MB body costs the master nothing; nothing in it is looked at. The
    comparison takes constant time.
    """

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the master's secret must not be empty")
        self._expected = (BEARER + secret).encode()
        self._deny = grpc.stream_unary_rpc_method_handler(self._refuse)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTH_HEADER and isinstance(value, str) and hmac.compare_digest(
                    value.encode(), self._expected):
                return continuation(handler_call_details)
        return self._deny

    @staticmethod
    def _refuse(requests: Any, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"this master needs its secret on every call: {_HOW}")


# -- the secret file --------------------------------------------------------------------
def weir_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".weir")


def secret_path(port: int) -> Path:
    """Where the master on ``port`` of this machine writes its secret."""
    return weir_home() / f"master-{port}.secret"


def local_master_addresses() -> list[str]:
    """The addresses named by the master secret files in ``weir_home()``, newest first:
    the masters of this machine and user (``weir master``, and ``weir run``'s embedded
    one on whatever port it got). Only owner-only regular files of this user count (a
    file planted by someone else, or a link, is skipped): the caller will send the secret
    there."""
    found = []
    for path in weir_home().glob("master-*.secret"):
        try:
            address = str(read_secret_file(path, found=True)[1].get("address") or "")
            mtime = path.lstat().st_mtime
        except (OSError, ValueError):
            continue
        if address:
            found.append((mtime, address))
    return [address for _, address in sorted(found, reverse=True)]


def write_secret_file(path: Path, address: str, secret: str, tls_roots: bytes,
                      extra: Mapping[str, str] | None = None) -> None:
    """Writes the secret file atomically, readable by its owner only (0600, folder 0700).

    The file holds the certificates that prove the master (``tls_ca_pem``), so a copy of
    it is all a client or container elsewhere needs. It is written through a fresh file
    of a random name, 0600 before anything is in it, then renamed into place, so the
    secret is never readable by others, not even for a moment, and a link planted at its
    name is replaced, not written through. The folder is made owner-only, or closed to
    0700 if others could only read it; one others could write into is refused
    (``UntrustedPath``). ``extra``: more fields (the dashboard's URL).
    """
    make_private_dir(str(path.parent), f"the folder of secret files (${HOME_ENV})",
                     advice=f"remove it, or set ${HOME_ENV} to a folder of your own")
    text = json.dumps({"address": address, "secret": secret,
                       "tls_ca_pem": tls_roots.decode("ascii"), **(extra or {})})
    write_private_file(str(path), (text + "\n").encode())


def remove_secret_file(path: Path, secret: str) -> None:
    """Removes the file if it still holds ``secret`` (a later master may have replaced it)."""
    try:
        if read_secret_file(path, found=True)[0] == secret:
            path.unlink()
    except (OSError, ValueError):
        pass


def read_secret_file(path: str | Path, *, found: bool = False) -> tuple[str, dict[str, Any]]:
    """The secret in ``path`` and the file's other fields.

    A master's secret file (JSON with ``secret``, ``address``, ``tls_ca_pem``) or a file
    holding just the secret. ``found``: a file found in ``weir_home()`` rather than given
    by the user, whose address gets the secret and whose certificate is trusted: it must
    be a regular file of this user that nobody else can read or write, not a link
    (``read_private_file``), else ``UntrustedPath``. A given file readable by others is
    only warned about.

    Raises:
        OSError: unreadable (or, ``found``, untrusted). ValueError: empty.
    """
    path = Path(path)
    try:
        if found:
            text = read_private_file(str(path), "the master's secret file", secret=True,
                                     advice="remove it").decode()
        else:
            text = _read_given(path)
    except UntrustedPath:
        raise
    except OSError as exc:
        raise OSError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    return _parse_secret(path, text.strip())


def _read_given(path: Path) -> str:
    with open(path) as file:
        mode = os.fstat(file.fileno()).st_mode
        text = file.read()
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _LOGGER.warning("secret file %s is readable by others (mode %o); chmod 600 it",
                        path, stat.S_IMODE(mode))
    return text


def _parse_secret(path: Path, text: str) -> tuple[str, dict[str, Any]]:
    fields: dict[str, Any] = {}
    if text.startswith("{"):
        try:
            fields = json.loads(text)
            text = str(fields.get("secret") or "")
        except ValueError:
            pass
    if not text:
        raise ValueError(f"secret file {path} holds no secret")
    return text, fields


# -- the client side --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ClientCredentials:
    """What a client needs for the master: the secret it sends (None: none found), the
    certificates the master must prove before it is sent (PEM; None: none found), and
    where the secret came from (``source``)."""

    secret: str | None
    tls_roots: bytes | None = None
    source: str = ""

    def require_roots(self, address: str) -> bytes:
        """The trusted certificates, or a ValueError saying how to give them."""
        if self.tls_roots is None:
            raise ValueError(
                f"no certificate to check the master at {address} by, so its secret stays "
                f"here: pass --secret-file with a copy of the master's secret file "
                f"(~/.weir/master-<port>.secret on its machine; it holds the certificate), "
                f"or --tls-ca PEM (or ${TLS_CA_ENV})")
        return self.tls_roots


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdecimal() else 0


def _local_secret_file(address: str) -> tuple[str | None, dict[str, Any], Path]:
    """The secret and fields a master on this machine published for ``address``'s port,
    if that file names the same host (loopback names count as one)."""
    host, port = _split(address)
    path = secret_path(port)
    try:
        found, fields = read_secret_file(path, found=True)
    except UntrustedPath as exc:
        _LOGGER.warning("ignoring %s", exc.strerror)
        return None, {}, path
    except (OSError, ValueError):
        return None, {}, path
    their_host = _split(str(fields.get("address", "")))[0]
    if host == their_host or (_loopback(host) and _loopback(their_host)):
        return found, fields, path
    return None, {}, path


def client_credentials(address: str, *, secret: str | None = None,
                       secret_file: str | Path | None = None,
                       tls_ca: str | Path | None = None) -> ClientCredentials:
    """The credentials for the master at ``address``, first found wins.

    The secret: ``secret``, ``secret_file``, ``$WEIR_SECRET``, then the secret file a
    master on this machine wrote for that port, used only if the file names the same host
    (loopback names count as one) so a local secret never goes to another machine. The
    certificates: ``tls_ca``, ``$WEIR_TLS_CA``, the ones in ``secret_file``, then the ones
    in that local secret file.

    Raises:
        OSError, ValueError: an explicit ``secret_file`` or ``tls_ca`` cannot be read.
    """
    fields: dict[str, Any] = {}
    source = ""
    if secret_file:
        found, fields = read_secret_file(secret_file)
        secret, source = secret or found, source or str(secret_file)
    if secret:
        source = source or "argument"
    elif os.environ.get(SECRET_ENV):
        secret, source = os.environ[SECRET_ENV], SECRET_ENV
    local, local_fields, local_path = _local_secret_file(address)
    if not secret and local:
        secret, source = local, str(local_path)
    ca = tls_ca or os.environ.get(TLS_CA_ENV)
    if ca:
        roots: bytes | None = read_pem(Path(ca))
    else:
        pem = fields.get("tls_ca_pem") or local_fields.get("tls_ca_pem")
        roots = str(pem).encode("ascii") if pem else None
    return ClientCredentials(secret or None, roots, source)
