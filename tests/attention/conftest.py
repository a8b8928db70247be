"""Attention's tests: the user maps of tests/numeric generated and importable."""

from tests.numeric.conftest import user_modules  # noqa: F401 (a session fixture, used automatically)
