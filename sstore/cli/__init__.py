"""The ``sstore`` command line, one package: ``main`` is the click group (``sstore.cli:main``,
the console script); ``python -m sstore.cli`` runs it too."""

from sstore.cli.app import main

__all__ = ["main"]
