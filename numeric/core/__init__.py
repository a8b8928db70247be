"""The shared core of :mod:`numeric`: what every backend runs, written once on the row operations.

* :mod:`numeric.core.ops`: the row operations interface (:class:`~numeric.core.ops.TensorOps`) each backend
  implements, and a map's routines bound to its parameter values (:class:`~numeric.core.ops.Routines`);
* :mod:`numeric.core.rules`: the threshold rules on the simplex (:func:`~numeric.core.rules.solve`);
* :mod:`numeric.core.kkt`: the KKT solve of a link with no closed form;
* :mod:`numeric.core.halley`: the bracketed threshold solves (safeguarded Halley and its rounds);
* :mod:`numeric.core.derivatives`: the Jacobian's products and the Fenchel-Young loss's terms.

Constraint sets beyond the simplex are in :mod:`numeric.constraints`, the rules of map families that are not
separable generated maps in :mod:`numeric.families`.
"""
