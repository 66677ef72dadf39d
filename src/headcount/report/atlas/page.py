"""The head atlas as one self-contained HTML file: the data, D3 and the page's own script and
style all inside it, so that it opens from file:// with no server and no network.

Charts: D3 (https://d3js.org, v7, ISC licence), vendored as static/d3.min.js (280 kB, its licence
beside it) and inlined into every page. D3 rather than Vega-Lite: the atlas needs a linked grid
whose cells are clicked and greyed by a slider, a sortable table, and attention drawn as a matrix
and as token-to-token lines, and D3's scales, axes, colour schemes, line shapes and data joins do
all of that in one small file without a runtime of its own (Vega-Lite's bundle with Vega is
about four times larger and its charts are harder to link by hand); each element carries the
head's key as a data attribute, which is also what the browser test reads. The page's own code
(static/atlas.js) only wires D3's pieces together; it draws nothing D3 offers.
"""

from __future__ import annotations

import html as markup
import json
import re
from pathlib import Path

from ...io import atomic_path
from .data import clean

STATIC = Path(__file__).parent / "static"


def d3_version() -> str:
    match = re.search(r"d3js\.org v([0-9.]+)", (STATIC / "d3.min.js").read_text(encoding="utf-8")[:200])
    return match.group(1) if match else "unknown"


def embedded_json(data: dict) -> str:
    """JSON that is safe inside a <script> element: every '<' written as its JSON escape, so that
    no '</script>' or '<!--' in the data can end the element early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c")


def render_page(data: dict) -> str:
    """The page's HTML with `data` (atlas.data / atlas.examples records; data.clean makes them
    JSON) embedded."""
    html = (STATIC / "atlas.html").read_text(encoding="utf-8")
    title = markup.escape(data.get("experiment") or "experiment")
    # Plain replacements, in this order: the data last, so nothing inside it is taken for a placeholder.
    for placeholder, text in (("/*ATLAS_CSS*/", (STATIC / "atlas.css").read_text(encoding="utf-8")),
                              ("__TITLE__", title), ("__D3_VERSION__", d3_version()),
                              ("/*D3_JS*/", (STATIC / "d3.min.js").read_text(encoding="utf-8")),
                              ("/*ATLAS_JS*/", (STATIC / "atlas.js").read_text(encoding="utf-8"))):
        html = html.replace(placeholder, text, 1)
    return html.replace("__ATLAS_DATA__", embedded_json(clean(data)), 1)


def write_page(data: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(render_page(data), encoding="utf-8")
    return path
