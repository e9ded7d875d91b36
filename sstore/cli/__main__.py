"""``python -m sstore.cli``: the same command line as the ``sstore`` script."""

from sstore.cli import run

run()
