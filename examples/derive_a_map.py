"""Derive a map from a user regularizer written as text, and evaluate it.

Run: python examples/derive_a_map.py
"""

from derive import Regularizer, derive_map, shannon

mixed = Regularizer.from_string("p*log(p) + p**2/2", name="shannon+gini")
dv = derive_map(mixed)
print(dv.pretty())
scores = [-2, 0, 0.5]
print("p*(s) for s =", scores)
print("  mixed   :", [f"{float(v):.6f}" for v in dv.evaluate(scores)])
print("  softmax :", [f"{float(v):.6f}" for v in derive_map(shannon()).evaluate(scores)])
