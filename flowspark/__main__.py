"""`python -m flowspark`: the `flowspark` command line (see `flowspark.cli`)."""

import sys

from flowspark.cli import main

if __name__ == "__main__":
    sys.exit(main())
