"""Installed as the package ``sstore._schemas`` (see pyproject.toml): read these files with
``sstore.base.resources.read_schema``, never by a path relative to the source tree."""
