import sys

from failslow_cli.main import main

sys.exit(main())
