"""Derivations shared by the derive tests, computed once per session."""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from derive import Regularizer, derive_map, gini, shannon, tsallis

#: name -> (factory, parameter values for evaluate)
FACTORIES = {
    "softmax": (shannon, {}),
    "sparsemax": (gini, {}),
    "entmax15": (lambda: tsallis(sp.Rational(3, 2)), {}),
    "tsallis2": (lambda: tsallis(2), {}),
    "tsallis3": (lambda: tsallis(3), {}),
    "tsallis_half": (lambda: tsallis(sp.Rational(1, 2)), {}),
    "entmax_alpha": (tsallis, {"alpha": sp.Rational(13, 10)}),
    # user regularizers: dense with a LambertW link, sparse, a cubic link with a square term (Cardano's, refused)
    "lambertw": (lambda: Regularizer.from_string("p*log(p) + p**2/2", name="lambertw"), {}),
    "cube": (lambda: Regularizer.from_string("p**3", name="cube"), {}),
    "quartic": (lambda: Regularizer.from_string("p**2/2 + p**3/3 + p**4/4", name="quartic"), {}),
}

BUILTINS = ["softmax", "sparsemax", "entmax15", "entmax_alpha"]
USERS = ["lambertw", "cube", "quartic"]
ALL = list(FACTORIES)


@lru_cache(maxsize=None)
def derivation(name: str):
    return derive_map(FACTORIES[name][0]())


def params(name: str) -> dict:
    return FACTORIES[name][1]
