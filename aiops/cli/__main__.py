"""`python -m aiops.cli`: the `aiops` command."""

import sys

from aiops.cli import main

sys.exit(main())
