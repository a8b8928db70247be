"""Sphinx configuration: Markdown pages (MyST), API reference from docstrings, pages generated at build time.

Build: sphinx-build -W -b html docs docs/_build/html   (``make docs``)

At build time this file writes ``docs/_generated/``: one page of derivations
printed by regattn itself, and one page per example with the text it printed
and the pictures it drew (the examples run here, in a temporary folder, unless
the environment variable ``REGATTN_EXAMPLE_RUNS`` names a folder where the tests
of the same run kept each example's output: ``.ci/run`` runs them once).
``sphinx-build -t no_generated ...`` leaves ``docs/_generated/`` as it is: a quick
build of the hand-written pages (a full build spends most of its time running
the examples).

The built pages read the same offline: MathJax comes from a pip package
(``sphinx-mathjax-offline``, copied into ``_static/mathjax``), and after the
build :func:`_check_offline` warns (an error under ``-W``) about any script,
stylesheet or picture a page would fetch from the network or that is missing
from the build.
"""

import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

from sphinx.util import logging

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "regattn"
author = "the regattn developers"
copyright = "2026, the regattn developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax",
              # MathJax 3 from the pip package of that name, copied into the build and loaded from there:
              # sphinx.ext.mathjax alone loads it from a CDN, and offline the maths stays raw LaTeX
              "sphinx-mathjax-offline"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["dollarmath", "amsmath"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
# wider pages, code that scrolls sideways, figures that link to their full-size files
html_static_path = ["_static"]
html_css_files = ["regattn.css"]
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
    ("hf_adaptive_sparsity", "Adaptively sparse attention in a HuggingFace transformers model"),
    ("context_parallel_torch", "One sequence over two processes: context-parallel attention"),
]


def _picture(path):
    """MyST lines showing the picture at ``path`` (relative to the page) with a link to its full-size file.

    ``:scale: 100`` keeps the picture's own size (the stylesheet narrows it to the
    column) and makes Sphinx wrap it in a link to the file (``html_scaled_image_link``).
    """
    return [f"```{{image}} {path}", f":alt: {Path(path).stem}", ":scale: 100", "```", ""]


def _examples():
    folder = GENERATED / "examples"
    folder.mkdir(parents=True, exist_ok=True)
    index = ["# Examples", "", "Each page shows what the script printed and drew when these docs were built "
             "(click a picture to open it at full size).", "", "```{toctree}", ":maxdepth: 1", ""]
    for name, title in EXAMPLES:
        script = ROOT / "examples" / f"{name}.py"
        work = folder / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        kept = Path(os.environ.get("REGATTN_EXAMPLE_RUNS") or work) / name / "stdout.txt"
        if os.environ.get("REGATTN_EXAMPLE_RUNS") and kept.exists():  # run by the tests of this run (.ci/run)
            for png in kept.parent.glob("*.png"):
                shutil.copy(png, work)
            stdout = kept.read_text()
        else:
            stdout = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True,
                                    timeout=600, check=True).stdout
        doc = (script.read_text().split('"""')[1]).strip()
        page = [f"# {title}", "", f"`examples/{name}.py`", "", "```text", doc, "```", "", "## Output", "", "```text",
                stdout.strip(), "```", ""]
        pictures = sorted(work.glob("*.png"))
        if pictures:
            page += ["Click a picture to open it at full size.", ""]
        for png in pictures:
            page += _picture(f"{name}/{png.name}")
        (folder / f"{name}.md").write_text("\n".join(page))
        index.append(name)
    index += ["```", ""]
    (folder / "index.md").write_text("\n".join(index))


class _Loads(HTMLParser):
    """The URLs a page fetches by itself: scripts, stylesheets, pictures, frames (not the links a reader follows)."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source") and attrs.get("src"):
            self.urls.append(attrs["src"])
        elif tag == "link" and "stylesheet" in (attrs.get("rel") or "").split() and attrs.get("href"):
            self.urls.append(attrs["href"])


_CSS_URL = re.compile(r"""(?:url\(|@import)\s*['"]?((?:https?:)?//[^'")\s]+)""")


def _check_offline(app, exc):
    """Warn about every resource a built page would fetch from the network or that is not in the build.

    Looks at each HTML page's scripts, stylesheets and pictures (a URL with a host,
    or a relative path to a file that does not exist) and at the ``url(...)`` and
    ``@import`` of the stylesheets in ``_static``.  Runs after the other
    ``build-finished`` handlers, so after ``sphinx-mathjax-offline`` copied MathJax.
    """
    if exc is not None or app.builder.format != "html":
        return
    log = logging.getLogger("regattn.docs")
    out = Path(app.outdir)
    # this build's pages (not pages an earlier build left behind) and the pages every build writes
    pages = {Path(app.builder.get_outfilename(doc)) for doc in app.env.all_docs}
    pages |= {out / f"{name}.html" for name in ("genindex", "search", "py-modindex") if (out / f"{name}.html").is_file()}
    for page in sorted(pages):
        parser = _Loads()
        parser.feed(page.read_text(encoding="utf-8"))
        for url in parser.urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme == "data":
                continue
            name = page.relative_to(out)
            if parts.scheme or parts.netloc:
                log.warning(f"{name} loads {url} from the network; the documentation must read the same offline")
            elif parts.path and not (page.parent / urllib.parse.unquote(parts.path)).is_file():
                log.warning(f"{name} loads {url}, which is not in the build")
    for css in sorted((out / "_static").rglob("*.css")):
        for url in _CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            log.warning(f"{css.relative_to(out)} loads {url} from the network; the documentation must read the same offline")


def setup(app):
    app.connect("build-finished", _check_offline, priority=900)


if not tags.has("no_generated"):  # noqa: F821 (Sphinx defines tags for conf.py)
    GENERATED.mkdir(exist_ok=True)
    _derivations()
    _examples()
