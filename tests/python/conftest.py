"""Shared fixtures. Also makes python/tinyloop importable from a source checkout."""

import os
import sys

import pytest

_PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
if _PYTHON_DIR not in sys.path:
    sys.path.insert(0, _PYTHON_DIR)
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def test_models(model_dir):
    """Every engine_models.VARIANTS entry, written once."""
    import engine_models

    return {name: engine_models.build(model_dir, name) for name in engine_models.VARIANTS}


# CI runs must not depend on luck: there hypothesis derives its examples from each test's
# name (derandomize) and keeps no example database between runs.
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    _hyp_settings.load_profile("ci")
