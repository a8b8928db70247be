"""The built documentation reads offline, and its example pictures link to their full-size files.

A full ``make docs`` runs every example (about a minute); these tests build one small page
with the project's ``docs/conf.py`` (``-c docs -t no_generated``: nothing is written to
``docs/_generated``), which takes seconds.  They run where the ``[docs]`` extra is installed
(``make docs`` installs it) and skip elsewhere.
"""

from __future__ import annotations

import importlib.util
import runpy
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")
if importlib.util.find_spec("sphinx-mathjax-offline") is None:
    pytest.skip("sphinx-mathjax-offline (the [docs] extra) is not installed", allow_module_level=True)

from sphinx.util.tags import Tags  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _png(path, width=40, height=10):
    """A small valid PNG (grey), so that Sphinx can read its size."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _build(tmp_path, extra=()):
    """Build a page with maths, code and an example's picture (written as docs/conf.py writes it)."""
    conf = runpy.run_path(str(DOCS / "conf.py"), init_globals={"tags": Tags(["no_generated"])})
    src = tmp_path / "src"
    (src / "example").mkdir(parents=True)
    _png(src / "example" / "picture.png")
    lines = ["# Page", "", "$$", r"\begin{aligned} p^\star(s) &= \arg\max_{p \in \triangle^d} \langle p, s \rangle"
             r" - \Omega(p) \\ g(z) &= (\omega')^{-1}(z) \end{aligned}", "$$", "", "```text", "x" * 300, "```", ""]
    (src / "index.md").write_text("\n".join(lines + conf["_picture"]("example/picture.png") + list(extra)))
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-c", str(DOCS),
           "-t", "no_generated", str(src), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300), out


def test_maths_renders_without_the_network_and_pictures_link_to_full_size(tmp_path):
    proc, out = _build(tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = (out / "index.html").read_text()
    assert "://" not in "".join(line for line in html.splitlines() if "<script" in line or "stylesheet" in line)
    assert 'src="_static/mathjax/tex-chtml.js"' in html
    mathjax = out / "_static" / "mathjax"
    assert (mathjax / "tex-chtml.js").is_file()
    assert (mathjax / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Main-Regular.woff").is_file()
    assert 'href="_static/regattn.css' in html and (out / "_static" / "regattn.css").is_file()
    # the picture is a link to the full-size file
    assert '<a class="reference internal image-reference" href="_images/picture.png"><img alt="picture"' in html
    assert (out / "_images" / "picture.png").is_file()


def test_the_build_fails_on_a_resource_from_the_network_or_missing(tmp_path):
    raw = ['<script src="https://cdn.example.org/mathjax/tex-chtml.js"></script>', "", '<img src="missing.png">', ""]
    proc, _ = _build(tmp_path, raw)
    assert proc.returncode != 0
    assert "index.html loads https://cdn.example.org/mathjax/tex-chtml.js from the network" in proc.stderr
    assert "index.html loads missing.png, which is not in the build" in proc.stderr
