"""`python -m aiops.cli`: the `aiops` command."""

from aiops.cli import run

run()
