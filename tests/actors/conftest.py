"""Actor tests: each test's unhandled-failure reports are printed within the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from viceroy.runtime.actors import supervision


@pytest.fixture(autouse=True)
def _reports_printed_within_the_test() -> Iterator[None]:
    """Unhandled failures are printed a moment after they come (to gather their ranks): one
    still waiting when a test ends must not land in a later test's captured stderr."""
    supervision.reports.flush()
    yield
    supervision.reports.flush()
