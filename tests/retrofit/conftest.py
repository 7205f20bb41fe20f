"""Fixtures of the retrofit tests: one small retrofit run, made once per session and only read by the tests."""

from __future__ import annotations

import pytest
from retrofit_helpers import small_retrofit_run


@pytest.fixture(scope="session")
def retrofit_run(tmp_path_factory):
    """(store, run) of `small_retrofit_run`: read it, write elsewhere."""
    return small_retrofit_run(tmp_path_factory.mktemp("retrofit"))
