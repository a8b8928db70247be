"""The generated-module contract (numeric.contract): written once, met by every map module, read by Map."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import types

import pytest

import numeric as nm
from numeric import backend, contract

from .conftest import derivation

#: the maps of one derivation each, and every committed map module (the family entmax: the cases' routines)
DERIVED = ["softmax", "sparsemax", "entmax15", "entmax_sparse", "entmax_dense"]
MAPS = DERIVED + ["entmax"]


def _module(name):
    return importlib.import_module(f"numeric._generated.{name}")


@pytest.mark.parametrize("name", MAPS)
def test_committed_maps_meet_the_contract(name):
    module = _module(name)
    contract.check_map_module(module)
    assert module.FORMAT_VERSION == contract.FORMAT_VERSION and module.CUDA_THREADS == backend.CUDA_THREADS
    for routine in contract.ROUTINES:
        fn = getattr(module, routine.name)
        if fn is None:
            continue
        args = list(inspect.signature(fn).parameters)
        assert args == list(routine.args) + list(module.PARAMETERS), routine.name


@pytest.mark.parametrize("name", DERIVED)
def test_present_routines_follow_the_derivation(name):
    """A routine is present exactly when its condition holds for the derivation."""
    module, dv = _module(name), derivation(name)
    holds = {
        "always": True,
        "closed link": dv.inversion.method == "closed",
        "power link": dv.inversion.form.form == "power",
        "closed threshold": dv.threshold.kind == "closed",
        "sort threshold": dv.threshold.kind == "sort",
        "quadratic sort threshold": dv.threshold.discriminant is not None,
    }
    for routine in contract.ROUTINES:
        assert (getattr(module, routine.name) is not None) == holds[routine.present], routine.name


@pytest.mark.parametrize("name", DERIVED)
def test_verify_judges_the_contracts_routines(name):
    """verify.functions comes from the emitter's list: every present routine with a finite value is judged."""
    from derive.codegen import verify as V

    module, dv = _module(name), derivation(name)
    judged = set(V.functions(dv))
    per = {contract.PER_PARAMETER.name.format(q) for q in module.PARAMETERS}
    present = {r.name for r in contract.ROUTINES if getattr(module, r.name) is not None} | per
    # (constants that are infinite for every parameter value: a dense map's clip, with or without parameters)
    infinite = {n for n in ("clip", "omega_zero") if getattr(dv, n).is_infinite}
    assert judged == present - infinite


def _stripped(name, drop=(), **changes):
    module = _module(name)
    fake = types.ModuleType(f"fake_{name}")
    fake.__dict__.update({k: v for k, v in vars(module).items() if k not in drop and not k.startswith("__")})
    fake.__dict__.update(changes)
    return fake


def test_map_refuses_a_module_of_another_format():
    with pytest.raises(TypeError, match="missing FORMAT_VERSION.*run `regattn generate` again"):
        contract.check_map_module(_stripped("softmax", drop=("FORMAT_VERSION",)))
    with pytest.raises(TypeError, match="generated for format 1"):
        contract.check_map_module(_stripped("softmax", FORMAT_VERSION=1))
    with pytest.raises(TypeError, match="missing link_scale"):
        contract.check_map_module(_stripped("entmax", drop=("link_scale",)))
    with pytest.raises(TypeError, match="missing omega_prime_d_alpha"):
        contract.check_map_module(_stripped("entmax", drop=("omega_prime_d_alpha",)))
    with pytest.raises(TypeError, match="512 threads per block"):
        contract.check_map_module(_stripped("softmax", CUDA_THREADS=512))


def test_map_requires_the_contract():
    assert nm.maps.REQUIRED == contract.required_names()
    with pytest.raises(TypeError, match="not a generated map: missing"):
        nm.Map(_stripped("softmax", drop=("LINK_FORM",)))


def _old_format(tmp_path, name, edit):
    """The committed module ``name`` as an older regattn wrote it (``edit`` applied to its body), with a header
    that matches (a trusted file of the old format), loaded from ``tmp_path``."""
    from derive.codegen.emit import HEADER_MARK, content_hash
    from derive.codegen.files import load_module
    from numeric import trust

    text = (importlib.resources.files("numeric._generated") / f"{name}.py").read_text(encoding="utf-8")
    header, body = trust.split_header(text)
    body = edit(body)
    assert body != trust.split_header(text)[1]
    path = tmp_path / f"{name}.py"
    path.write_text("\n".join([HEADER_MARK, *header[1:-1], f"# content-hash: {content_hash(body)}"]) + "\n" + body)
    return load_module(path, prefix="old_")


def test_modules_of_an_older_format_say_to_generate_again(tmp_path):
    """A module written for format 5 (the CUDA kernels pasted into the module) or 7 and a continuous module of the
    formats before 6 (which had no FORMAT_VERSION) are refused with the message to run `regattn generate` again."""
    for version in (5, 7):  # 7: the torch and JAX routines printed into the module, the Newton link traced into it
        old = _old_format(tmp_path, "sparsemax", lambda b: b.replace(f"FORMAT_VERSION = {contract.FORMAT_VERSION}\n",
                                                                      f"FORMAT_VERSION = {version}\n"))
        with pytest.raises(TypeError, match=f"generated for format {version}.*run `regattn generate` again"):
            nm.get_map(old)
    old = _old_format(tmp_path, "continuous_sparsemax",
                      lambda b: b.replace(f"FORMAT_VERSION = {contract.FORMAT_VERSION}\n", ""))
    with pytest.raises(TypeError, match="missing FORMAT_VERSION.*run `regattn generate` again"):
        nm.continuous.ContinuousMap(old)
    old = _old_format(tmp_path, "continuous_sparsemax", lambda b: b.replace(
        f"FORMAT_VERSION = {contract.FORMAT_VERSION}\n", "FORMAT_VERSION = 5\n"))
    with pytest.raises(TypeError, match="generated for format 5.*run `regattn generate` again"):
        nm.continuous.ContinuousMap(old)
    contract.check_continuous_module(importlib.import_module("numeric._generated.continuous_sparsemax"))
