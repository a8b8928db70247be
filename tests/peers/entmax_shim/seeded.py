"""A pytest plugin for the entmax package's suite run through the shim: torch's generator seeded before each test
(the suite draws its data unseeded), so that a run's outcome is repeatable."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    import torch

    torch.manual_seed(0)



def pytest_collection_finish(session):
    """Prints where ``entmax`` was imported from: the shim, not the package."""
    import sys

    print("\nentmax imported from", getattr(sys.modules.get("entmax"), "__file__", None))
