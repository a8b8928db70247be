"""What a constraint set is: the protocol every member of :mod:`numeric.constraints` follows.

A map is ``p*(s) = argmax_{p in C} <p, s> - Omega(p)``: its regularizer ``Omega`` comes from a generated module,
its set ``C`` from a :class:`ConstraintSet`.  A set says, in one module:

* **its keywords**: the keyword arguments a call passes it (:attr:`~ConstraintSet.keywords`, with the values
  that leave it out), the values that select it (:meth:`~ConstraintSet.asks`), and how they are checked and
  laid out as rows of the scores (:meth:`~ConstraintSet.rows`: arrays of shape ``(rows, n)``, one value per
  score, or ``(rows, 1)``, one per row, in the keywords' order);
* **its solve** on the row operations of :mod:`numeric.core` (:meth:`~ConstraintSet.solve`: ``(p, tau)``), so
  that it runs on every backend: NumPy, CuPy (:class:`numeric.core.array_ops.ArrayOps`), torch and JAX, eager or
  traced;
* **its derivatives**, in the scores and in each of its arrays: :meth:`~ConstraintSet.vjp` (reverse) and
  :meth:`~ConstraintSet.jvp` (forward), and where the map's parameters move ``p``
  (:meth:`~ConstraintSet.moving`: the weights a parameter's tangent enters with;
  :meth:`~ConstraintSet.param_directions`: how it moves the set's arrays);
* **its Fenchel-Young loss**: the loss's terms per row (:meth:`~ConstraintSet.loss_terms`), the gradients in its
  arrays (:meth:`~ConstraintSet.loss_gradients`) and the check that a target lies in it
  (:meth:`~ConstraintSet.check_target`);
* **the fused attention's hook**: the name of the Triton functions the fused kernels call for it
  (:attr:`~ConstraintSet.fused`), or ``None`` where the fused kernels do not run it.

Front ends, losses, attention and layers take the keywords as ``**constraints`` and find the set by
:func:`numeric.constraints.choose`; none of them names a set's keywords.
"""

from __future__ import annotations

import math

from ..core import derivatives
from ..front import is_number, param_shape

__all__ = ["ConstraintSet", "left_out", "lay_out"]


def left_out(value, default) -> bool:
    """Whether a keyword's ``value`` is the one that leaves its set out: ``None`` for a default ``None``, else the
    default as a number (an array never is, whatever it holds)."""
    return value is None if default is None else is_number(value) and float(value) == default


def lay_out(xp, arrays, x, value, name: str, along: bool, axis: int, word: str = "axis"):
    """A set's keyword ``value`` as rows of the scores ``x`` flattened with ``axis`` last, in ``x``'s dtype:
    ``(rows, n)`` where ``along`` (a number or an array broadcasting to the scores: one value per score), else
    ``(rows, 1)`` (a number or an array broadcasting to the scores with size 1 along ``axis``, which a message calls
    ``word``: one value per row).  ``arrays``: the front end's :class:`numeric.front.Arrays`."""
    shape, n = tuple(x.shape), x.shape[axis]
    rows = math.prod(shape) // n
    if is_number(value):
        return arrays.full((rows, n if along else 1), float(value), x)
    if not arrays.is_array(value) or arrays.kind(value) not in "fiub":
        raise TypeError(f"{name} must be a real number or a real array, got {type(value).__name__}")
    value = arrays.astype(value, x.dtype)
    if along:
        if len(value.shape) > len(shape) or any(v not in (1, m) for v, m in
                                                   zip((1,) * (len(shape) - len(value.shape)) + tuple(value.shape), shape)):
            raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to the scores {shape}")
        full = xp.broadcast_to(value.reshape((1,) * (len(shape) - len(value.shape)) + tuple(value.shape)), shape)
        return xp.moveaxis(full, axis, -1).reshape(rows, n)
    padded = param_shape(name, value.shape, shape, axis, word)
    each = tuple(shape[:axis]) + (1,) + tuple(shape[axis + 1:])
    return xp.moveaxis(xp.broadcast_to(value.reshape(padded), each), axis, -1).reshape(rows, 1)


class ConstraintSet:
    """A set a map's ``p`` lies in (see the module's docstring); subclasses define the methods."""

    #: the set's name (``"simplex"``, ``"box"``)
    name: str = ""
    #: ``{keyword: value that leaves the set out}``, in the order of :meth:`rows`' arrays
    keywords: dict = {}
    #: the keywords laid out one value per score, ``(rows, n)`` (the others one per row, ``(rows, 1)``)
    per_score: frozenset = frozenset()
    #: ``{keyword: value}`` for each keyword of :attr:`per_score`: the value that leaves a key free (a key a layer
    #: adds, such as a bias key)
    free: dict = {}
    #: ``{keyword: value}``: keywords whose value selects the set and carries no array (the sum left out:
    #: ``total=None``); not among :attr:`keywords`
    marks: dict = {}
    #: whether :meth:`vjp` needs the scores for the derivatives in the set's arrays (one-sided ones)
    needs_scores: bool = False
    #: whether :meth:`vjp` and :meth:`jvp` need the scores for the derivatives in the scores themselves (front ends
    #: then always pass them)
    jacobian_scores: bool = False
    #: whether the set fixes ``sum p`` (a threshold ``tau`` moves with the scores, and the map and its loss are
    #: invariant to a shift of a row's scores); ``False``: no threshold (``tau = 0``), no shift
    summed: bool = True
    #: the keyword whose values the set appends to each row as one more score, the map then solved on the simplex
    #: over the longer rows and that column dropped (a sink), or ``None``: a backend may run such a set as its plain
    #: map on the longer rows (its own fast paths, and with automatic differentiation its own derivatives)
    appends: str | None = None
    #: the fused Triton attention's hook for this set, a name its kernels know (``None``: the fused kernels
    #: do not run this set)
    fused: str | None = None

    def fused_arguments(self, values: dict) -> dict:
        """The fused kernels' keyword arguments for a call's ``values`` of this set's keywords
        (:func:`numeric.torch.fused.fused_attention`'s, for the hook :attr:`fused`): none by default."""
        return {}

    def asks(self, values: dict) -> bool:
        """Whether a call's constraint keywords ``values`` (every keyword of :data:`numeric.constraints.KEYWORDS`,
        defaults filled in) select this set."""
        raise NotImplementedError

    def rows(self, xp, arrays, x, values: dict, axis: int, word: str = "axis") -> tuple:
        """The set's arrays for the scores ``x`` (the map along ``axis``, which a message calls ``word``),
        checked and laid out as rows of ``x`` flattened with ``axis`` last, in ``x``'s dtype."""
        return ()

    def solve(self, ops, r, x, *rows):
        """``(p, tau)`` for the 2-D scores ``x``: ``p`` in the set, ``tau`` the threshold per row, ``(rows, 1)``."""
        raise NotImplementedError

    def vjp(self, ops, r, p, v, *rows, at_zero=None, x=None):
        """``(J^T v, (dp/da^T v for each array a of rows))`` at ``p`` (``at_zero``: the weight at 0 where it is
        finite, else ``None``; ``x``: the scores, ``None`` where not given)."""
        raise NotImplementedError

    def jvp(self, ops, r, p, dx, tangents: tuple, *rows, at_zero=None, x=None):
        """``J dx + sum_a dp/da da`` at ``p``; ``tangents`` holds one per array of ``rows``, ``0`` for none."""
        raise NotImplementedError

    def appended(self, rows: tuple):
        """The column :attr:`appends` adds to each row: its keyword's array among ``rows`` (:meth:`rows`' layout)."""
        return rows[list(self.keywords).index(self.appends)]

    def param_directions(self, ops, r, p, name: str, *rows, x=None) -> tuple:
        """How the map's parameter ``name`` moves the set's arrays: one array per array of ``rows`` (or ``()`` for
        none), ``c_a`` such that a tangent ``dq`` enters as ``-c_a dq`` in that array's tangent, as it enters as
        ``-c dq`` in the scores' (``c = omega'_q(p)`` on the support).  A parameter's VJP is then ``-(J^T u) . c -
        sum_a (dp/da^T u) . c_a``."""
        return ()

    def moving(self, ops, p, *rows):
        """Where ``p`` moves with the scores (a boolean array): a map parameter's tangent ``dq`` enters as
        ``dx = -dq omega'_q(p)`` there."""
        return p > 0

    def loss_terms(self, ops, r, x, p, y, *rows):
        """The Fenchel-Young loss per row, ``(rows, 1)``, of the map's ``p`` at the scores ``x`` against the target
        ``y`` (:func:`numeric.core.derivatives.omega_terms`; its scores shifted where the set is :attr:`summed`)."""
        return derivatives.omega_terms(ops, r, x, p, y, shift=self.summed)

    def loss_gradients(self, ops, r, x, tau, *rows, p=None, y=None) -> tuple:
        """The gradients of the Fenchel-Young loss in each array of ``rows`` at the scores ``x`` and the
        threshold ``tau`` (``(rows, 1)``, unshifted), the map's ``p`` and the target ``y``."""
        return ()

    def check_target(self, xp, target, rows: tuple, slack: float, word: str, axis: int) -> str | None:
        """The error message for a loss's ``target`` outside the set by more than ``slack`` (its values laid out as
        rows; ``rows``: the set's arrays, readable, or ``None`` where they cannot be read), ``None`` for one in it."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<constraint set {self.name!r}>"
