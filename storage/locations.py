"""Where state lives, said safely: a local path or a ``pyarrow.fs`` URI, whose user info
(``s3://KEY:SECRET@bucket/…``) is a credential and never shown or logged.

>>> redact_location("s3://AKIA:hunter2@bucket/state?region=eu")
's3://***@bucket/state?region=eu'
>>> redact_location("/var/weir/state")
'/var/weir/state'
>>> redact_location("hdfs://namenode:8020/weir")
'hdfs://namenode:8020/weir'
"""

from __future__ import annotations

import re

__all__ = ["redact_location"]

_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def redact_location(location: str) -> str:
    """``location`` with the user info of a URI (keys, passwords) replaced by ``***``."""
    return _USER_INFO.sub(r"\1***@", location)
