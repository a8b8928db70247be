"""The hypothesis profile a run was started with (``pytest --hypothesis-profile=NAME``, loaded before the test
modules are collected), for the tests whose parametrisation it sizes: the ``ci`` profile keeps CI fast and the
``thorough`` one runs every case."""

from hypothesis import settings

#: whether this run is the thorough one
THOROUGH = settings._current_profile == "thorough"
