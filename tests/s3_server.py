"""An S3-protocol server for tests: moto's server mode (``moto[server]`` from PyPI, a
test dependency), on a free port of 127.0.0.1, spoken to by pyarrow's own S3 client.

It stands for a real object store in what Weir asks of one (buckets, objects written
whole, listed, read, deleted); what it cannot show is a real store's latency, its
eventual listings of old, or its throttling. ``STATE_DIR`` on it is a URI that names the
endpoint (``s3://bucket/path?endpoint_override=...&scheme=http``); the credentials are the
``AWS_*`` variables every process of the test inherits.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["S3Server", "s3_server_for_session"]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "weir-test", "AWS_SECRET_ACCESS_KEY": "weir-test",
               "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # host:port

    def uri(self, bucket: str, path: str) -> str:
        """A pyarrow.fs URI of ``path`` in ``bucket`` on this server (made if missing)."""
        return (f"s3://{bucket}/{path}?endpoint_override=http://{self.endpoint}&scheme=http"
                "&region=us-east-1&allow_bucket_creation=true")


def s3_server_for_session() -> Iterator[S3Server]:
    """Starts the server and sets the credentials in this process's environment (child
    processes inherit them) for the session; stops it and restores them after."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        host, port = server.get_host_and_port()
        yield S3Server(f"{host}:{port}")
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
