"""Typed maps for the benchmark scripts: user regularizers whose link has no closed form, generated as
``regattn generate --expr`` would and imported."""

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path

#: user regularizers whose link has no closed form (typed maps): one dense, one sparse
TYPED = {"plogp_cube": "p*log(p) + p**3", "gini_log1p": "p**2/2 + p*log(1 + p)"}


def typed_modules() -> dict:
    """The :data:`TYPED` maps generated into a temporary folder (removed at exit) and imported: ``{name: module}``."""
    from derive import Regularizer, derive_map, generate_module

    folder = tempfile.mkdtemp(prefix="regattn-typed-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # (maps check their module's file when made)
    for name, expr in TYPED.items():
        Path(folder, f"{name}.py").write_text(generate_module(derive_map(Regularizer.from_string(expr, name=name)), name))
    sys.path.insert(0, folder)
    try:
        return {name: importlib.import_module(name) for name in TYPED}
    finally:
        sys.path.remove(folder)
