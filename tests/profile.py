"""The hypothesis profile a run was started with (``pytest --hypothesis-profile=NAME``, loaded before the test
modules are collected), for the tests whose parametrisation it sizes: the ``ci`` profile keeps CI fast and the
``thorough`` one runs every case."""

import pytest
from hypothesis import settings

#: whether this run is the thorough one
THOROUGH = settings._current_profile == "thorough"


def crossed(rows, columns, per=1, start=0):
    """The pairs of a two-way parametrisation: every (row, column) in the thorough profile; in the others each row
    with ``per`` of the columns, dealt in turn from column ``start``, so that every column is taken (where ``per *
    len(rows) >= len(columns)``) and none twice before each has been once.  For grids whose code paths are each a
    row's or a column's, not a pair's (a map's functions; a layout's masking), which the thorough profile crosses in
    full.  Two tests of one property dealt from different starts take complementary pairs."""
    rows, columns = list(rows), list(columns)
    if THOROUGH:
        return [(r, c) for r in rows for c in columns]
    return [(r, columns[(start + i * per + j) % len(columns)]) for i, r in enumerate(rows)
            for j in range(min(per, len(columns)))]


def backend_grid(pairs):
    """``crossed`` pairs of ``((id, (name, params)), backend parameter)`` as parameters of ``(backend, name,
    params)``, the backend indirect, with the backend's marks."""
    return [pytest.param(b.values[0], *m, id=f"{b.id}-{i}", marks=b.marks) for (i, m), b in pairs]
