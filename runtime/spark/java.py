"""Whether the Java that Spark would start is there and new enough, asked before anything
waits on it.

Without it, a Spark operator's container found out only as its JVM failed to start
(``JAVA_GATEWAY_EXITED``, with "JAVA_HOME is not set" once in pages of log), and the
master restarted it until ``MAX_RESTARTS``: a retry cannot install Java. So the master
asks at submit, for containers it starts on its own machine, and a container asks before
it starts Spark (a pod or a Ray node has its own Java): either way one sentence says what
to install, and the application fails at once.

>>> major_version('openjdk version "17.0.9" 2023-10-17')
17
>>> major_version('java version "1.8.0_392"')
8
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

__all__ = ["MIN_JAVA", "JavaMissing", "java_problem", "major_version"]

MIN_JAVA = 17
"""The oldest Java this PySpark runs on."""
_INSTALL = (f"install Java {MIN_JAVA} or newer (for example `apt install "
            f"openjdk-{MIN_JAVA}-jre-headless`) or set JAVA_HOME to one")
_ASKED: dict[tuple[str, str], str | None] = {}  # (JAVA_HOME, PATH) -> the answer


class JavaMissing(RuntimeError):
    """Spark cannot start here: no Java, or one too old (its message says what to do)."""


def major_version(text: str) -> int | None:
    """The major version in ``java -version``'s output (``1.8`` is 8), or None."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def java_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why Spark could not start its JVM with ``env`` (default: this process's), in one
    sentence saying what to install; None when a Java of ``MIN_JAVA`` or newer is there.

    The Java is the one PySpark starts: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set,
    else ``java`` on the PATH. Asked once per (JAVA_HOME, PATH) in a process."""
    env = os.environ if env is None else env
    home, path = env.get("JAVA_HOME", ""), env.get("PATH", "")
    if (home, path) not in _ASKED:
        _ASKED[(home, path)] = _ask(home, path)
    return _ASKED[(home, path)]


def _ask(home: str, path: str) -> str | None:
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            return f"Spark needs Java, and JAVA_HOME={home} has no bin/java; {_INSTALL}"
        where = f"JAVA_HOME={home}"
    else:
        found = shutil.which("java", path=path)
        if found is None:
            return ("Spark needs Java: JAVA_HOME is not set and there is no java on the "
                    f"PATH; {_INSTALL}")
        java, where = found, found
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Spark needs Java, and {where} does not run ({exc}); {_INSTALL}"
    version = major_version(done.stderr + done.stdout)
    if done.returncode != 0 or version is None:
        said = (done.stderr or done.stdout).strip().splitlines()[:1]
        return (f"Spark needs Java, and {where} did not say its version "
                f"({said[0] if said else f'exit code {done.returncode}'}); {_INSTALL}")
    if version < MIN_JAVA:
        return f"Spark needs Java {MIN_JAVA} or newer, and {where} is Java {version}; {_INSTALL}"
    return None
