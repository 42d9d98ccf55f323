"""``python -m treadle.cli ...``: the same as ``treadle ...``."""

import sys

from treadle.cli import main

sys.exit(main())
