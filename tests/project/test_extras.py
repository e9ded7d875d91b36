"""The optional-dependency hint: only a missing module of the named extra becomes the hint.

The hint itself, for a really missing PySpark and matplotlib, is exercised end to end in a
fresh virtual environment by tests/project/test_wheel.py.
"""

from __future__ import annotations

import importlib

import pytest

from sstore.base.errors import SStoreError, TerminalError
from sstore.base.extras import MissingExtraError, needs, require


def test_a_missing_module_that_is_not_the_extras_passes_through() -> None:
    with pytest.raises(ModuleNotFoundError) as caught, needs("spark"):
        importlib.import_module("sstore_no_such_module")
    assert not isinstance(caught.value, SStoreError)
    assert caught.value.name == "sstore_no_such_module"


def test_the_hint_is_a_terminal_error_and_an_import_error() -> None:
    with pytest.raises(ImportError) as caught:
        raise MissingExtraError("pyspark")
    assert isinstance(caught.value, TerminalError)
    assert str(caught.value) == "this needs PySpark: pip install 'sstore[spark]'"
    assert (caught.value.name, caught.value.extra) == ("pyspark", "spark")


def test_require_knows_the_extras() -> None:
    require("spark")  # installed in the test environment: nothing to say
    with pytest.raises(ValueError, match="unknown extra 'sparks'"):
        require("sparks")
