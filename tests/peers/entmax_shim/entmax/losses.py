"""The entmax package's Fenchel-Young losses under their names, from :func:`numeric.torch.fenchel_young_loss`
(labels along dim 1), with the package's ``ignore_index`` and ``reduction`` conventions."""

from torch import nn

import numeric.torch as rt


def _loss(X, target, mapping):
    return rt.fenchel_young_loss(X, target, mapping, reduction="none", dim=1)


def sparsemax_loss(X, target, k=None):
    return _loss(X, target, "sparsemax")


def sparsemax_bisect_loss(X, target, n_iter=50):
    return _loss(X, target, "sparsemax")


def entmax15_loss(X, target, k=None):
    return _loss(X, target, "entmax15")


def entmax_bisect_loss(X, target, alpha=1.5, n_iter=50):
    return _loss(X, target, rt.get_map("entmax", alpha=alpha))


def normmax_bisect_loss(X, target, alpha=2, n_iter=50):
    return _loss(X, target, rt.get_map("normmax", alpha=alpha))


class _Loss(nn.Module):
    def __init__(self, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__()
        if reduction not in ("elementwise_mean", "sum", "none"):
            raise ValueError(f"reduction must be 'elementwise_mean', 'sum' or 'none', got {reduction!r}")
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, X, target):
        loss = self.loss(X, target)
        size = target.shape[0]
        if self.ignore_index >= 0:  # (the package's convention: ignored rows count 0 and leave the mean)
            ignored = target == self.ignore_index
            size -= int(ignored.sum())
            loss = loss.masked_fill(ignored, 0.0)
        if self.reduction == "sum":
            return loss.sum()
        if self.reduction == "elementwise_mean":
            return loss.sum() / size
        return loss


class SparsemaxLoss(_Loss):
    def __init__(self, k=None, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)

    def loss(self, X, target):
        return sparsemax_loss(X, target)


class SparsemaxBisectLoss(_Loss):
    def __init__(self, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)

    def loss(self, X, target):
        return sparsemax_bisect_loss(X, target)


class Entmax15Loss(_Loss):
    def __init__(self, k=100, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)

    def loss(self, X, target):
        return entmax15_loss(X, target)


class EntmaxBisectLoss(_Loss):
    def __init__(self, alpha=1.5, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)
        self.alpha = alpha

    def loss(self, X, target):
        return entmax_bisect_loss(X, target, self.alpha)


class NormmaxBisectLoss(_Loss):
    def __init__(self, alpha=2, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(ignore_index, reduction)
        self.alpha = alpha

    def loss(self, X, target):
        return normmax_bisect_loss(X, target, self.alpha)
