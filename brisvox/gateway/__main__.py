"""``python -m brisvox.gateway``: the standalone gateway (see standalone.py)."""

import sys

from brisvox.gateway.standalone import main

sys.exit(main())
