"""A thin stand-in for the entmax package's API, served by :mod:`numeric.torch`: the entmax package's own test
suite runs against regattn through it (tests/peers/test_entmax_suite.py).  Not installed with regattn."""

from .activations import Entmax15, Sparsemax, entmax15, sparsemax
from .losses import (Entmax15Loss, EntmaxBisectLoss, NormmaxBisectLoss, SparsemaxBisectLoss, SparsemaxLoss,
                     entmax15_loss, entmax_bisect_loss, normmax_bisect_loss, sparsemax_bisect_loss, sparsemax_loss)
from .root_finding import (BudgetBisect, EntmaxBisect, NormmaxBisect, SparsemaxBisect, budget_bisect, entmax_bisect,
                           normmax_bisect, sparsemax_bisect)

__all__ = ["Entmax15", "Sparsemax", "entmax15", "sparsemax", "Entmax15Loss", "EntmaxBisectLoss", "NormmaxBisectLoss",
           "SparsemaxBisectLoss", "SparsemaxLoss", "entmax15_loss", "entmax_bisect_loss", "normmax_bisect_loss",
           "sparsemax_bisect_loss", "sparsemax_loss", "BudgetBisect", "EntmaxBisect", "NormmaxBisect",
           "SparsemaxBisect", "budget_bisect", "entmax_bisect", "normmax_bisect", "sparsemax_bisect"]
