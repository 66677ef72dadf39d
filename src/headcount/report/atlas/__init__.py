"""The head atlas: one self-contained HTML page per experiment with every head's scores,
role evidence, attention on real sentences and gate trajectories.

data.py gathers the per-head records from a finished experiment's tables, examples.py runs the
model on the analysis sentences for the attention shown, page.py writes the page (D3 vendored in
static/), build.py is the stage the workflow's `atlas` rule calls. docs/atlas.md describes the page.
"""
