"""``python -m container``: the container process."""

import sys

from container.main import main

sys.exit(main())
