"""sparsemax and 1.5-entmax under the entmax package's names, from :mod:`numeric.torch` (exact thresholds: ``k``,
the package's partial-sort size, changes nothing)."""

import torch
from torch import nn

import numeric.torch as rt


def sparsemax(X, dim=-1, k=None):
    return rt.sparsemax(X, dim=dim)


def entmax15(X, dim=-1, k=None):
    return rt.entmax15(X, dim=dim)


def _threshold_and_support(name, X, dim):
    """``(tau, support size)`` of each vector along ``dim`` (size 1 there): regattn's threshold, ``p > 0`` counted."""
    m = rt.get_map(name)
    p, t = m.run(X, dim, {}, keep_tau=True)
    tau = t + X.amax(dim, keepdim=True) if t is not None else None
    return tau, (p > 0).sum(dim, keepdim=True)


def _sparsemax_threshold_and_support(X, dim=-1, k=None):
    return _threshold_and_support("sparsemax", X, dim)


def _entmax_threshold_and_support(X, dim=-1, k=None):
    # (the package's entmax15 threshold is that of X / 2: p = [X / 2 - tau]_+^2)
    return _threshold_and_support("entmax15", X, dim)


class Sparsemax(nn.Module):
    def __init__(self, dim=-1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return sparsemax(X, dim=self.dim)


class Entmax15(nn.Module):
    def __init__(self, dim=-1, k=None):
        super().__init__()
        self.dim = dim

    def forward(self, X):
        return entmax15(X, dim=self.dim)


_ = torch
