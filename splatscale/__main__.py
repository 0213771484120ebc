import sys

from splatscale.cli import main

sys.exit(main())
