"""``python -m weir.master ...`` is the ``weir`` command too (``python -m weir``)."""

import sys

from weir.master.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
