"""What a map family is: the protocol every member of :mod:`numeric.families` follows.

A family is a map whose ``p`` is not a generated module's but follows from one: ``p = output(r)`` with ``r`` a
generated map's ``p`` at the scores ``s * scale`` (normmax: the entmax family at ``a = (2 alpha - 1) / alpha`` on
``s alpha / (alpha - 1)``, then ``p = r^(1/alpha)`` normalised).  A family says, in one module:

* **its parameters**: their names and defaults (:attr:`~Family.parameters`, the order of every hook's ``values``)
  and domains (:attr:`~Family.domains`, each an open interval), checked by :meth:`~Family.check` before anything
  reads them, with messages that name the family;
* **its solve**: the generated map that solves its threshold (:attr:`~Family.inner`), that map's parameters
  (:meth:`~Family.inner_params`) and the factor on the scores (:meth:`~Family.scale`), and ``p`` from that map's
  output (:meth:`~Family.output`) on the row operations of :mod:`numeric.core` (NumPy, CuPy, torch, JAX);
* **its derivatives**: the Jacobian's product from ``p`` (:meth:`~Family.vjp`; the Jacobian of a regularized
  argmax is the Hessian of ``Omega*``, symmetric, so one product serves the JVP and the VJP), and whether it has
  any in its parameters (:attr:`~Family.param_gradients`; without: :attr:`~Family.no_gradient` is the error);
* **its Fenchel-Young loss** per row (:meth:`~Family.loss`), whose gradient in the scores is ``p - y``;
* **what it runs on**: the constraint sets a call may select (:attr:`~Family.sets`, :meth:`~Family.check_set`),
  whether it is sparse (:attr:`~Family.sparse`), and the fused attention's hook (:attr:`~Family.fused`, ``None``
  where the fused kernels do not run it).

Each front end (:class:`numeric.Map`, :class:`numeric.torch.TorchMap`, :class:`numeric.jax.JaxMap`) holds an
optional family and calls these hooks; none of them names a family.  A family is found by name in
:data:`numeric.families.table.FAMILIES`, where its module registers it (:func:`numeric.families.table.register`).
"""

from __future__ import annotations

import math

import numpy as np

from ..constraints import choose
from ..front import check_param, is_number

__all__ = ["Family"]


class Family:
    """A map family (see the module's docstring); subclasses set the attributes and define the hooks.

    ``values`` in the hooks are the family's parameters in the order of :attr:`parameters`: numbers, or arrays
    broadcasting against the scores they go with (one value per row: ``(rows, 1)`` on rows of scores).
    """

    #: the family's name: :func:`numeric.get_map`'s, and the maps' ``name``
    name: str = ""
    #: the generated map that solves the threshold (a built-in's name, or an importable generated module's)
    inner: str = ""
    #: ``{parameter: default value}``, in the order of the hooks' ``values``
    parameters: dict = {}
    #: ``{parameter: (lo, hi)}``: each parameter's open interval of values
    domains: dict = {}
    #: a line on what the map is, which the front ends' functions of the family (``nm.NAME``) begin with
    summary: str = ""
    #: whether the map is sparse
    sparse: bool | None = None
    #: the names of the constraint sets a call may select (:mod:`numeric.constraints`)
    sets: tuple = ("simplex",)
    #: whether the map has gradients in its parameters (the front ends run families without: ``False``)
    param_gradients: bool = False
    #: the fused Triton attention's hook for this family (``None``: the fused kernels do not run it)
    fused: str | None = None

    # ------------------------------------------------- the parameters' declaration, as a generated module's
    @property
    def NAME(self) -> str:  # (upper case: the names numeric.front reads from a generated module)
        return self.name

    @property
    def PARAMETERS(self) -> tuple:
        return tuple(self.parameters)

    @property
    def PARAMETER_DOMAINS(self) -> dict:
        return self.domains

    # ------------------------------------------------------------------------------------------- checks
    def check(self, name: str, value, arrays):
        """A value of the parameter ``name`` checked (:func:`numeric.front.check_param` on :attr:`domains`) as
        ``arrays`` (a front end's :class:`numeric.front.Arrays`) keeps it, a value outside the domain refused with
        a message naming the family first (the inner map's own check would name that map).  Values of an array a
        trace holds are checked where the front end can check them (:meth:`numeric.front.Arrays.check_traced`)."""
        lo, hi = self.domains[name]
        if is_number(value):
            if not lo < float(value) < hi:
                raise ValueError(self._outside(name, float(value)))
        elif arrays.is_array(value) and not isinstance(value, (bool, np.bool_)) and arrays.kind(value) in "iuf":
            v = arrays.readable(value)
            if v is not None:
                bad = ~((lo < v) & (v < hi))  # (NaN is outside too)
                if bool(bad.any()):
                    raise ValueError(self._outside(name, float(v[bad].reshape(-1)[0])))
        return check_param(self, name, value, arrays)

    def _outside(self, name: str, value: float) -> str:
        lo, hi = self.domains[name]
        if math.isinf(hi):
            return f"{self.name} needs {name} > {lo:g} (finite), got {value!r}"
        return f"{self.name} needs {lo:g} < {name} < {hi:g}, got {value!r}"

    def check_set(self, constraints: dict) -> None:
        """Refuses a call's constraint keywords that select a set outside :attr:`sets` (:class:`ValueError`); checks
        them first (:func:`numeric.constraints.choose`)."""
        cset, _ = choose(constraints)
        if cset.name not in self.sets:
            raise ValueError(f"{self.name} takes no {cset.name} constraints ({', '.join(constraints)}=): it runs on "
                             f"the {', '.join(self.sets)} only")

    @property
    def no_gradient(self) -> str:
        """The error of a call differentiated in the parameters of a family without :attr:`param_gradients`."""
        return f"{self.name} has no gradient in {' or '.join(self.parameters)} (only in the scores)"

    # -------------------------------------------------------------------------------------------- solve
    def inner_params(self, *values) -> dict:
        """The parameters of :attr:`inner`, ``{name: value}``, from the family's (arithmetic alone: numbers and
        arrays of every front end)."""
        return {}

    def scale(self, *values):
        """The factor on the scores that :attr:`inner` solves (a number or an array broadcasting like ``values``)."""
        return 1

    def output(self, ops, r, *values):
        """``p`` for the rows ``r`` (2-D) of :attr:`inner`'s map at the scaled scores, ``values`` numbers or
        ``(rows, 1)``, on the row operations ``ops`` (:class:`numeric.core.ops.TensorOps`)."""
        raise NotImplementedError

    # -------------------------------------------------------------------------------------- derivatives
    def vjp(self, ops, p, v, *values):
        """``J v`` at ``p`` (rows, 2-D), ``J`` the map's Jacobian in the scores (symmetric: also ``J^T v``)."""
        raise NotImplementedError

    def loss(self, ops, x, p, y, *values):
        """The Fenchel-Young loss of each row of the scores ``x`` against the target ``y`` at ``p`` (the map's),
        ``(rows, 1)``: masked scores left out, ``+inf`` for a target with mass on one, NaN for a row with a NaN."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<map family {self.name!r}>"
