"""The master's secret and TLS: who may call the master, and how clients find the secret.

Operators travel as pickled code, so whoever can call the master (or a container's
buffer server) can run code as the master's user. Every master therefore has a secret,
generated at start unless one is given, and every gRPC call must carry it as
``authorization: Bearer <secret>`` (the wire format containers use too; ``container``
repeats these constants because it never imports ``master``).

Clients on the master's machine need no setup: the master writes its address and secret
to ``$WEIR_HOME/master-<port>.secret`` (``~/.weir`` by default), readable by its owner
only, and removes it when it stops. Elsewhere, ``WEIR_SECRET`` or ``--secret-file``.

>>> bearer_metadata("s3cret")
(('authorization', 'Bearer s3cret'),)
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "AUTH_HEADER",
    "HOME_ENV",
    "SECRET_ENV",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "AuthInterceptor",
    "ClientCredentials",
    "TlsFiles",
    "bearer_metadata",
    "client_credentials",
    "container_env",
    "new_secret",
    "open_channel",
    "read_secret_file",
    "remove_secret_file",
    "secret_path",
    "weir_home",
    "write_secret_file",
]

_LOGGER = logging.getLogger(__name__)

AUTH_HEADER = "authorization"
_BEARER = "Bearer "

SECRET_ENV = "WEIR_SECRET"
"""The master's secret, for ``weir master`` (instead of generating one), clients and
containers."""

TLS_CERT_ENV = "WEIR_TLS_CERT"
TLS_KEY_ENV = "WEIR_TLS_KEY"
TLS_CA_ENV = "WEIR_TLS_CA"
"""PEM files: a server's certificate and key (master, buffer servers), and the
certificates a client trusts (the master's own certificate when it is self-signed)."""

HOME_ENV = "WEIR_HOME"
"""Where masters write their secret files (``~/.weir`` by default)."""

_HOW = (f"set {SECRET_ENV} or pass --secret-file (a master writes its secret to "
        "~/.weir/master-<port>.secret on its machine, readable by its owner only)")


def new_secret() -> str:
    """A fresh random secret (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def bearer_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata that carries ``secret`` (none without a secret)."""
    return ((AUTH_HEADER, _BEARER + secret),) if secret else ()


# -- TLS --------------------------------------------------------------------------------
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
        return grpc.ssl_server_credentials([(_read(self.key), _read(self.cert))])

    @classmethod
    def from_options(cls, cert: str | None, key: str | None, ca: str | None = None
                     ) -> TlsFiles | None:
        """TLS from command-line values (or the environment); None if neither is set.

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


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read {path}: {exc.strerror or exc}") from None


def container_env(secret: str, tls: TlsFiles | None) -> dict[str, str]:
    """What a container the master launches needs in its environment to call back.

    The environment, not the command line: ``ps`` shows command lines to every user,
    while ``/proc/<pid>/environ`` is readable by the owner only. Containers serve their
    buffer servers with the master's certificate when TLS is on.
    """
    env = {SECRET_ENV: secret}
    if tls is not None:
        env.update({TLS_CERT_ENV: str(tls.cert), TLS_KEY_ENV: str(tls.key),
                    TLS_CA_ENV: str(tls.trusted)})
    return env


# -- the server side --------------------------------------------------------------------
class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call that lacks the master's secret.

    A refused request is never deserialised (its handler takes raw bytes), so nothing
    in it is looked at. The comparison takes constant time.
    """

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the master's secret must not be empty")
        self._expected = (_BEARER + secret).encode()
        self._deny = grpc.unary_unary_rpc_method_handler(self._refuse)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTH_HEADER and isinstance(value, str) and hmac.compare_digest(
                    value.encode(), self._expected):
                return continuation(handler_call_details)
        return self._deny

    @staticmethod
    def _refuse(request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"this master needs its secret on every call: {_HOW}")


# -- the secret file --------------------------------------------------------------------
def weir_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".weir")


def secret_path(port: int) -> Path:
    """Where the master on ``port`` of this machine writes its secret."""
    return weir_home() / f"master-{port}.secret"


def write_secret_file(path: Path, address: str, secret: str, tls_ca: Path | None,
                      extra: Mapping[str, str] | None = None) -> None:
    """Writes the secret file atomically, readable by its owner only (0600, folder 0700).

    The file is created 0600 before anything is written to it, then renamed into place,
    so the secret is never readable by others, not even for a moment. ``extra``: more
    fields (the dashboard's URL).
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = json.dumps({"address": address, "secret": secret,
                       "tls_ca": str(tls_ca) if tls_ca else None, **(extra or {})})
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(text + "\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def remove_secret_file(path: Path, secret: str) -> None:
    """Removes the file if it still holds ``secret`` (a later master may have replaced it)."""
    try:
        if read_secret_file(path)[0] == secret:
            path.unlink()
    except (OSError, ValueError):
        pass


def read_secret_file(path: str | Path) -> tuple[str, dict[str, Any]]:
    """The secret in ``path`` and the file's other fields.

    A master's secret file (JSON with ``secret``, ``address``, ``tls_ca``) or a file
    holding just the secret.

    Raises:
        OSError: unreadable. ValueError: empty.
    """
    path = Path(path)
    try:
        with open(path) as file:
            mode = os.fstat(file.fileno()).st_mode
            text = file.read().strip()
    except OSError as exc:
        raise OSError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _LOGGER.warning("secret file %s is readable by others (mode %o); chmod 600 it",
                        path, stat.S_IMODE(mode))
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
    """What a client sends the master: the secret (None: no secret found) and, for TLS,
    the certificates it trusts; ``source`` says where the secret came from."""

    secret: str | None
    tls_ca: Path | None = None
    source: str = ""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else 0


def client_credentials(address: str, *, secret: str | None = None,
                       secret_file: str | Path | None = None,
                       tls_ca: str | Path | None = None) -> ClientCredentials:
    """The credentials for the master at ``address``, first found wins.

    The secret: ``secret``, ``secret_file``, ``$WEIR_SECRET``, then the secret file a
    master on this machine wrote for that port, used only if the file names the same host
    (loopback names count as one) so a local secret never goes to another machine. TLS
    roots: ``tls_ca``, ``$WEIR_TLS_CA``, then the one in the secret file.

    Raises:
        OSError, ValueError: an explicit ``secret_file`` cannot be read.
    """
    fields: dict[str, Any] = {}
    source = ""
    if secret:
        source = "argument"
    elif secret_file:
        secret, fields = read_secret_file(secret_file)
        source = str(secret_file)
    elif os.environ.get(SECRET_ENV):
        secret, source = os.environ[SECRET_ENV], SECRET_ENV
    else:
        host, port = _split(address)
        path = secret_path(port)
        try:
            found, found_fields = read_secret_file(path)
        except (OSError, ValueError):
            found, found_fields = None, {}
        their_host = _split(str(found_fields.get("address", "")))[0]
        if found and (host == their_host or (_loopback(host) and _loopback(their_host))):
            secret, fields, source = found, found_fields, str(path)
    ca = tls_ca or os.environ.get(TLS_CA_ENV) or fields.get("tls_ca") or None
    return ClientCredentials(secret or None, Path(ca) if ca else None, source)


def open_channel(address: str, tls_ca: Path | None, options: list[tuple[str, Any]]
                 ) -> grpc.Channel:
    """A channel to ``address``: TLS trusting ``tls_ca`` if given, else plaintext."""
    if tls_ca is None:
        return grpc.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca))
    return grpc.secure_channel(address, credentials, options=options)
