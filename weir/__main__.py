"""``python -m weir ...`` is the ``weir`` command."""

import sys

from weir.master.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
