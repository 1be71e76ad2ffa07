"""``python -m weir.container``: the container process."""

import sys

from weir.container.main import main

sys.exit(main())
