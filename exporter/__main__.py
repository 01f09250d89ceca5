"""``python -m exporter``: the node agent, configured by ``FAILSLOW_EXPORTER_*`` variables."""

import sys

from exporter.server import main

sys.exit(main())
