"""The entmax package's bisection maps under their names, from :mod:`numeric.torch`: alpha-entmax for any
alpha > 0, normmax, and budget sparsemax as sparsemax over the box ``0 <= p <= 1``, ``sum p = budget``."""

from torch import nn

import numeric.torch as rt


def entmax_bisect(X, alpha=1.5, dim=-1, n_iter=50, ensure_sum_one=True):
    return rt.entmax(X, alpha, dim=dim)


def sparsemax_bisect(X, dim=-1, n_iter=50, ensure_sum_one=True):
    return rt.sparsemax(X, dim=dim)


def normmax_bisect(X, alpha=2, dim=-1, n_iter=50):
    return rt.normmax(X, alpha, dim=dim)


def budget_bisect(X, budget=2, dim=-1, n_iter=50):
    return rt.sparsemax(X, dim=dim, upper=1.0, total=budget)


class SparsemaxBisect(nn.Module):
    def __init__(self, dim=-1, n_iter=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return sparsemax_bisect(X, dim=self.dim)


class EntmaxBisect(nn.Module):
    def __init__(self, alpha=1.5, dim=-1, n_iter=50):
        super().__init__()
        self.alpha, self.dim = alpha, dim

    def forward(self, X):
        return entmax_bisect(X, self.alpha, dim=self.dim)


class NormmaxBisect(nn.Module):
    def __init__(self, alpha=2, dim=-1, n_iter=50):
        super().__init__()
        self.alpha, self.dim = alpha, dim

    def forward(self, X):
        return normmax_bisect(X, self.alpha, dim=self.dim)


class BudgetBisect(nn.Module):
    def __init__(self, budget=2, dim=-1, n_iter=50):
        super().__init__()
        self.budget, self.dim = budget, dim

    def forward(self, X):
        return budget_bisect(X, self.budget, dim=self.dim)
