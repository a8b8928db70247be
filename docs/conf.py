"""Sphinx configuration: Markdown pages (MyST), API reference from docstrings, pages generated at build time.

Build: sphinx-build -W -b html docs docs/_build/html   (``make docs``)

At build time this file writes ``docs/_generated/``: one page of derivations
printed by regattn itself, and one page per example with the text it printed
and the pictures it drew (the examples run here, in a temporary folder).
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "regattn"
author = "the regattn developers"
copyright = "2026, the regattn developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["dollarmath", "amsmath"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
suppress_warnings = ["myst.header"]

GENERATED = Path(__file__).resolve().parent / "_generated"


def _derivations():
    from derive import Regularizer, derive_map, gini, shannon, tsallis

    maps = [
        ("Softmax: Shannon negentropy", shannon()),
        ("Sparsemax: Gini", gini()),
        ("1.5-entmax: Tsallis alpha = 3/2", tsallis(1.5)),
        ("alpha-entmax: Tsallis with symbolic alpha", tsallis()),
        ("A user map: p log p + p^2/2 (LambertW link)", Regularizer.from_string("p*log(p) + p**2/2", name="shannon_gini")),
    ]
    lines = ["# Derivations printed by regattn", "",
             "Each section is `Derivation.markdown()` of the map, as `regattn derive ... --latex` prints it in LaTeX.", ""]
    for title, reg in maps:
        lines += [f"## {title}", "", derive_map(reg).markdown(), ""]
    from derive.continuous import derive_continuous

    lines += ["# Continuous maps", "",
              "`derive_continuous(reg).markdown()` for the scores `theta_1 t + theta_2 t^2` on the real line "
              "(`regattn derive ... --continuous` prints them).", ""]
    for title, reg in [("Continuous softmax: a Gaussian", shannon()), ("Continuous sparsemax: a truncated parabola", gini()),
                       ("Continuous 1.5-entmax: a biweight", tsallis(1.5))]:
        lines += [f"## {title}", "", derive_continuous(reg).markdown(), ""]
    (GENERATED / "derivations.md").write_text("\n".join(lines))


EXAMPLES = [
    ("birds_sometimes_walk", "The worked example: Birds sometimes walk"),
    ("attention_exploration", "Attention exploration: copying, averaging, key variance, two heads"),
    ("simplex_geometry", "The geometry of regularized argmax"),
    ("derive_a_new_map", "Deriving a new map and using it in attention"),
    ("train_flag_retrieval", "Training a causal attention model end to end"),
    ("continuous_attention", "Continuous attention: compact densities and a layer on a toy signal"),
]


def _examples():
    folder = GENERATED / "examples"
    folder.mkdir(parents=True, exist_ok=True)
    index = ["# Examples", "", "Each page shows what the script printed and drew when these docs were built.", "",
             "```{toctree}", ":maxdepth: 1", ""]
    for name, title in EXAMPLES:
        script = ROOT / "examples" / f"{name}.py"
        work = folder / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        proc = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=600, check=True)
        doc = (script.read_text().split('"""')[1]).strip()
        page = [f"# {title}", "", f"`examples/{name}.py`", "", "```text", doc, "```", "", "## Output", "", "```text",
                proc.stdout.strip(), "```", ""]
        for png in sorted(work.glob("*.png")):
            page += [f"![{png.stem}]({name}/{png.name})", ""]
        (folder / f"{name}.md").write_text("\n".join(page))
        index.append(name)
    index += ["```", ""]
    (folder / "index.md").write_text("\n".join(index))


GENERATED.mkdir(exist_ok=True)
_derivations()
_examples()
