import sys

from fleetgate.cli import main

sys.exit(main())
