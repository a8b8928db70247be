"""The maps' tests: the user maps of tests/numeric generated and importable (``shannon_gini``, ``cube``,
``gini_log1p``)."""

from tests.numeric.conftest import user_modules  # noqa: F401 (a session fixture, used automatically)
