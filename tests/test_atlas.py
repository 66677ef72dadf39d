"""The head atlas (issue 39): the records gathered from the tables, the attention examples from a
tiny model, the page's self-containment, and the page of the toy run in headless Chromium."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import toy_conllu, toy_corpus
from fakes import PieceSegmenter

from headcount.analysis.measures import MEASURES
from headcount.analysis.roles.collect import text_statistics
from headcount.analysis.roles.registry import role_names
from headcount.analysis.roles.statistics import count_words
from headcount.data.parses import read_conllu
from headcount.models.transformer import ModelConfig, Transformer
from headcount.report.atlas.data import gather_tables, head_key, measure_columns, pruning_records
from headcount.report.atlas.examples import RADIUS, decode_matrix, gather_examples
from headcount.report.atlas.page import render_page

TYPES = {"enc_self": (2, 3), "dec_self": (2, 3), "dec_enc": (2, 3)}


def score_table(types=TYPES, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"type": t, "layer": layer, "head": head} for t, (n_layers, n_heads) in types.items()
            for layer in range(n_layers) for head in range(n_heads)]
    table = pd.DataFrame(rows)
    for measure in MEASURES.values():
        for column in measure.columns:
            table[column] = rng.random(len(table))
    return table


def role_table() -> pd.DataFrame:
    return pd.DataFrame([
        {"layer": 0, "head": 0, "role": "positional", "statistic": 0.95, "role_paper": "none",
         "is_positional": True, "is_syntactic": False, "is_rare": False, "syntactic_relation": "amod",
         "syntactic_direction": "dep->head", "syntactic_name": "adj->noun", "syntactic_accuracy": 0.3,
         "syntactic_baseline": 0.4, "syntactic_margin": -0.1},
        {"layer": 1, "head": 2, "role": "rare", "statistic": 0.7, "role_paper": "rare", "is_positional": False,
         "is_syntactic": False, "is_rare": True, "syntactic_relation": "nsubj", "syntactic_direction": "head->dep",
         "syntactic_name": "v->s", "syntactic_accuracy": 0.2, "syntactic_baseline": 0.4, "syntactic_margin": -0.2}])


# --------------------------------------------------------------------------------------------
# Records from the tables


def test_heads_carry_every_registered_score_with_its_rank_in_the_layer_and_encoder_roles():
    scores = score_table()
    data = gather_tables(scores, roles=role_table(), role_settings={"positional_threshold": 0.9, "top_k": 500})
    assert data["layout"] == {t: list(shape) for t, shape in TYPES.items()}
    assert [m["column"] for m in data["measures"]] == [c for m in MEASURES.values() for c in m.columns]
    assert [r["name"] for r in data["roles"]] == role_names("encoder_decoder")  # no induction or sink
    assert len(data["heads"]) == len(scores)
    by_key = {h["key"]: h for h in data["heads"]}
    for row in scores.itertuples(index=False):
        record = by_key[head_key(row.type, row.layer, row.head)]
        layer = scores[(scores["type"] == row.type) & (scores["layer"] == row.layer)]
        for column in record["scores"]:
            assert record["scores"][column] == getattr(row, column)
            assert record["ranks"][column] == int((layer[column] > getattr(row, column)).sum()) + 1
    assert by_key["enc_self/0/0"]["role"] == "positional" and by_key["enc_self/1/2"]["role"] == "rare"
    assert by_key["enc_self/1/2"]["syntactic_best"]["name"] == "v->s"
    assert "role" not in by_key["dec_self/0/0"] and "role" not in by_key["enc_self/0/1"]
    assert data["thresholds"] == {"positional_threshold": 0.9, "top_k": 500}


def test_a_model_without_some_attention_types_shows_only_those_it_has():
    scores = score_table({"enc_self": (3, 2)}).drop(columns=["delta_loss", "delta_bleu"])  # no ablation run
    data = gather_tables(scores)
    assert data["layout"] == {"enc_self": [3, 2]}
    assert {h["type"] for h in data["heads"]} == {"enc_self"}
    assert "delta_loss" not in [m["column"] for m in measure_columns(scores)]
    assert data["pruning"]["settings"] == {} and data["planted"] == []


def write_run(folder, setting, lam, closed, gated_types=("enc_self",), steps=(0, 10, 20)):
    folder.mkdir(parents=True)
    heads = [{"type": t, "layer": layer, "head": head, "gated": t in gated_types,
              "pruned": (t, layer, head) in closed}
             for t, (n_layers, n_heads) in TYPES.items() for layer in range(n_layers) for head in range(n_heads)]
    (folder / "gates.json").write_text(json.dumps({"setting": setting, "lambda": lam, "control": lam == 0,
                                                   "heads": heads}))
    rows = [(s, h["type"], h["layer"], h["head"], s / steps[-1] if h["pruned"] else 0.0)
            for s in steps for h in heads if h["gated"]]
    pd.DataFrame(rows, columns=["step", "type", "layer", "head", "p_closed"]).to_csv(folder / "trajectory.csv",
                                                                                     index=False)
    return folder / "gates.json", folder / "trajectory.csv"


def test_pruning_runs_in_lambda_order_with_their_closed_heads_bleu_intervals_and_trajectories(tmp_path):
    table = pd.DataFrame([
        {"setting": "enc", "lam": 0.5, "control": False, "bleu": 30.1, "d_baseline": -0.4, "d_baseline_low": -0.9,
         "d_baseline_high": 0.1, "retained_total": 16},
        {"setting": "enc", "lam": 0.0, "control": True, "bleu": 30.6, "d_baseline": 0.1, "d_baseline_low": -0.3,
         "d_baseline_high": 0.5, "retained_total": 18}])
    runs = [write_run(tmp_path / "enc_05", "enc", 0.5, {("enc_self", 0, 1), ("enc_self", 1, 2)}),
            write_run(tmp_path / "enc_0", "enc", 0.0, set())]
    table = pd.concat([table, pd.DataFrame([{"setting": "baseline", "lam": np.nan, "bleu": 30.5}])])
    pruning = pruning_records(table, runs)
    assert pruning["baseline_bleu"] == 30.5 and set(pruning["settings"]) == {"enc"}
    runs_of = pruning["settings"]["enc"]
    assert [r["lam"] for r in runs_of] == [0.0, 0.5]
    assert runs_of[1]["closed"] == ["enc_self/0/1", "enc_self/1/2"] and runs_of[0]["closed"] == []
    assert runs_of[1]["bleu"] == 30.1 and runs_of[1]["d_baseline_low"] == -0.9 and runs_of[0]["control"]
    assert len(runs_of[1]["closed"]) == 18 - runs_of[1]["retained_total"]
    trajectory = runs_of[1]["trajectory"]
    assert trajectory["steps"] == [0, 10, 20]
    assert list(trajectory["p_closed"]["enc_self/0/1"]) == [0.0, 0.5, 1.0]
    assert "dec_self/0/0" not in trajectory["p_closed"]  # not gated in this setting


def test_the_page_embeds_everything_and_survives_markup_in_the_data():
    data = gather_tables(score_table(), experiment="x</script><script>alert(1)</script>",
                         description="<!-- not a comment")
    html = render_page(data)
    assert html.count("</script>") == 3  # D3, the data, the page's script: nothing closes early
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import", html)  # nothing fetched
    assert "https://d3js.org v7" in html
    embedded = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(embedded)["experiment"] == data["experiment"]


# --------------------------------------------------------------------------------------------
# Attention examples from a tiny model



def test_examples_are_bounded_per_head_and_the_encoder_histogram_is_the_role_analysis_own(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab=48, tgt_vocab=48, d_model=16, n_heads=2, d_ff=32, enc_layers=2,
                                    dec_layers=1, max_len=24)).eval()
    sources, targets = toy_corpus(30, seed=5)
    sources = [s.lower() for s in sources]
    treebank = tmp_path / "toy.conllu"
    treebank.write_text(toy_conllu(toy_corpus(8, seed=6)[0]), encoding="utf-8")
    frequencies = count_words(sources)
    roles = {"enc_self/0/0": {"role": "syntactic", "syntactic_best": {"relation": "amod",
                                                                      "direction": "dep->head"}},
             "enc_self/0/1": {"role": "rare"}, "enc_self/1/0": {"role": "positional", "positional": {"offset": -1}}}
    tokenizer = PieceSegmenter(ids=40)
    out = gather_examples(model, tokenizer, tokenizer, sources, targets, roles, chosen=[0, 4, 99], best=2,
                          parses=read_conllu(treebank), frequencies=frequencies, role_settings={"top_k": 5},
                          log=lambda _: None)
    assert set(out["axes"]) == {"enc_self", "dec_self", "dec_enc"}
    assert len(out["examples"]) == 2 * 2 + 1 * 2 + 1 * 2  # every head of every type
    for key, examples in out["examples"].items():
        chosen = [e for e in examples if e["why"] == "chosen"]
        assert [out["sentences"][e["s"]]["label"] for e in chosen] == ["analysis line 1", "analysis line 5"]
        assert 1 <= len(examples) - len(chosen) <= 2  # line 100 does not exist; at most `best` of its own
        kind = key.split("/")[0]
        rows_axis, cols_axis = out["axes"][kind]
        for e in examples:
            sentence = out["sentences"][e["s"]]
            assert (e["rows"], e["cols"]) == (len(sentence[rows_axis]), len(sentence[cols_axis]))
            matrix = decode_matrix(e["m"], e["rows"], e["cols"])
            assert np.allclose(matrix.sum(axis=1), 1, atol=e["cols"] / 255)  # each query's weights sum to 1
    syntactic = [e for e in out["examples"]["enc_self/0/0"] if e["why"] == "role"]
    assert syntactic and all(out["sentences"][e["s"]]["label"].startswith("parsed sentence") for e in syntactic)
    assert all(e["marks"]["arcs"] for e in syntactic)
    rare = [e for e in out["examples"]["enc_self/0/1"] if e["why"] == "role"]
    assert rare and all(e["marks"]["rare"] for e in rare)
    positional = [e for e in out["examples"]["enc_self/1/0"] if e["why"] == "role"]
    assert all(e["marks"] == {"offset": -1} for e in positional)
    # The encoder histogram counts what head_roles counts: the offset shares of positional.csv.
    table = text_statistics(model, tokenizer, sources, frequencies, lowercase=False, log=lambda _: None)["positional"]
    histogram = out["histograms"]["enc_self"]
    for row in table.itertuples():
        assert histogram["share"][head_key("enc_self", row.layer, row.head)][row.offset + RADIUS] == pytest.approx(
            row.fraction)


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_examples_of_pretrained_model_families(family):
    """The HuggingFace adapters implement the same interface: their attention comes back too."""
    pytest.importorskip("transformers")
    from test_hf_models import tiny

    torch.manual_seed(0)
    model = tiny(family)  # a vocabulary of 40
    sources, targets = toy_corpus(8, seed=7)
    tokenizer = PieceSegmenter(ids=30)
    out = gather_examples(model, tokenizer, tokenizer, sources, targets, {}, chosen=[1], best=1, log=lambda _: None)
    layers = {kind: len(modules) for kind, modules in model.attention_modules().items()}
    heads = {kind: modules[0].n_heads for kind, modules in model.attention_modules().items()}
    assert set(out["axes"]) == set(layers)
    assert len(out["examples"]) == sum(layers[k] * heads[k] for k in layers)
    assert all(len(examples) == 2 for examples in out["examples"].values())


# --------------------------------------------------------------------------------------------
# The toy run's page in a real browser


@pytest.fixture(scope="module")
def chromium():
    from headcount.report.atlas.browser import find_chromium, headless_chromium

    if find_chromium() is None:
        pytest.skip("headless Chromium is not installed: the browser test needs Debian's chromium and "
                    "chromium-driver packages (apt-get install chromium chromium-driver)")
    driver = headless_chromium()
    yield driver
    driver.quit()


def number_after(label: str, text: str) -> float:
    return float(re.search(re.escape(label) + r" (-?[0-9.]+)", text).group(1))


@pytest.mark.workflow
def test_the_toy_runs_atlas_in_chromium_shows_its_tables(smoke_run, chromium):
    """Open the page of the finished toy run, click a head, move the lambda slider: what is shown
    equals the run's head score, role and pruning tables."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    from headcount.report.atlas.browser import open_page

    assert smoke_run.result.returncode == 0, smoke_run.result.stderr[-3000:]
    results = smoke_run.results
    scores = pd.read_csv(results / "heads/scores.csv")
    roles = pd.read_csv(results / "syntax/roles.csv")
    positional = pd.read_csv(results / "syntax/positional.csv")
    pruning = pd.read_csv(results / "prune/pruning.tsv", sep="\t")
    pruning = pruning[pruning["setting"] != "baseline"]  # the runs
    assert open_page(chromium, results / "atlas/index.html") < 10
    assert len(chromium.find_elements(By.CSS_SELECTOR, "rect.head")) == len(scores)
    assert len(chromium.find_elements(By.CSS_SELECTOR, "#head-table tbody tr")) == len(scores)

    # A head's card: an encoder head with a role if there is one.
    row = roles.sort_values("role", key=lambda r: r.eq("none"), kind="stable").iloc[0]
    key = f"enc_self/{row['layer']}/{row['head']}"
    chromium.find_element(By.CSS_SELECTOR, f'rect.head[data-key="{key}"]').click()
    card = chromium.find_element(By.ID, "card")
    assert card.get_attribute("data-key") == key and card.is_displayed()
    expected = scores[(scores["type"] == "enc_self") & (scores["layer"] == row["layer"])].reset_index(drop=True)
    mine = expected[expected["head"] == row["head"]].iloc[0]
    shown = {td.get_attribute("data-column"): float(td.get_attribute("data-value"))
             for td in card.find_elements(By.CSS_SELECTOR, "td.score-value")}
    assert set(shown) == {c for m in MEASURES.values() for c in m.columns if c in scores.columns}
    for column, value in shown.items():
        assert value == pytest.approx(mine[column], rel=1e-5), column
    ranks = {td.get_attribute("data-column"): td.text for td in card.find_elements(By.CSS_SELECTOR, "td.score-rank")}
    for column, text in ranks.items():
        assert text == f"{int((expected[column] > mine[column]).sum()) + 1} of {len(expected)}", column
    assert card.find_element(By.CSS_SELECTOR, ".badge.role").get_attribute("data-role") == row["role"]
    offset = int(positional.query(f"layer == {row['layer']} and head == {row['head']}")["offset"].iloc[0])
    bar = card.find_element(By.CSS_SELECTOR, f'.positional-histogram rect.bar[data-label="{offset:+d}"]'
                            if offset else '.positional-histogram rect.bar[data-label="0"]')
    assert float(bar.get_attribute("data-value")) == pytest.approx(
        positional.query(f"layer == {row['layer']} and head == {row['head']}")["fraction"].iloc[0], abs=1e-4)
    chosen = smoke_run.config["defaults"]["atlas"]["sentences"]
    assert len(card.find_elements(By.CSS_SELECTOR, '.example[data-why="chosen"]')) == len(chosen)
    assert card.find_elements(By.CSS_SELECTOR, ".example svg.matrix rect")
    assert len(card.find_elements(By.CSS_SELECTOR, "svg.trajectories path[data-run]")) == len(pruning)

    # The lambda slider: the greyed heads are the run's closed heads, BLEU is the table's.
    n_types = scores.groupby("type").size()
    for setting, runs in pruning.sort_values("lam").groupby("setting", sort=False):
        Select(chromium.find_element(By.ID, "pruning-setting")).select_by_value(setting)
        slider = chromium.find_element(By.ID, "lambda-slider")
        for i, run in enumerate(runs.itertuples()):
            if i:
                slider.send_keys(Keys.ARROW_RIGHT)
            status = chromium.find_element(By.ID, "pruning-status")
            assert float(status.get_attribute("data-lambda")) == pytest.approx(run.lam)
            assert len(chromium.find_elements(By.CSS_SELECTOR, "rect.head.closed")) == len(scores) - run.retained_total
            for kind, n in n_types.items():
                closed = chromium.find_elements(By.CSS_SELECTOR, f'.grid[data-type="{kind}"] rect.head.closed')
                assert len(closed) == n - getattr(run, f"retained_{kind}"), (setting, run.lam, kind)
            assert number_after("BLEU", status.text) == pytest.approx(run.bleu, abs=0.01)


@pytest.mark.slow
def test_the_slider_greys_exactly_each_runs_closed_heads(tmp_path, chromium):
    """The toy run closes no gate; here runs that close some, one setting gating every type."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    from headcount.report.atlas.browser import open_page
    from headcount.report.atlas.page import write_page

    closures = {("enc", 0.0): set(), ("enc", 1.0): {("enc_self", 0, 1), ("enc_self", 1, 2)},
                ("all", 0.5): {("enc_self", 1, 0), ("dec_self", 0, 0), ("dec_enc", 1, 1), ("dec_enc", 0, 2)}}
    runs = [write_run(tmp_path / f"{s}_{lam}", s, lam, closed, ("enc_self",) if s == "enc" else tuple(TYPES))
            for (s, lam), closed in closures.items()]
    table = pd.DataFrame([{"setting": s, "lam": lam, "bleu": 20 + lam, "retained_total": 18 - len(c)}
                          for (s, lam), c in closures.items()])
    planted = pd.DataFrame([  # as the positive control's planted_vs_found.csv lists them
        {"function": "amod", "kind": "syntactic", "layer": 1, "head": 1, "via": "adj->noun", "rate": 0.787,
         "baseline": 0.503, "closes_at_all": 0.5},
        {"function": "rare token", "kind": "rare", "layer": np.nan, "head": np.nan, "via": np.nan, "rate": np.nan,
         "baseline": 0.365, "closes_at_all": np.nan}])
    page = write_page(gather_tables(score_table(), pruning=table, runs=runs, planted=planted),
                      tmp_path / "index.html")
    open_page(chromium, page)
    for setting in ("enc", "all"):
        Select(chromium.find_element(By.ID, "pruning-setting")).select_by_value(setting)
        for i, lam in enumerate(sorted(lam for s, lam in closures if s == setting)):
            if i:
                chromium.find_element(By.ID, "lambda-slider").send_keys(Keys.ARROW_RIGHT)
            greyed = {tuple(int(x) if x.isdigit() else x for x in e.get_attribute("data-key").split("/"))
                      for e in chromium.find_elements(By.CSS_SELECTOR, "rect.head.closed")}
            assert greyed == closures[(setting, lam)]
            assert len(chromium.find_elements(By.CSS_SELECTOR, "#head-table tr.closed")) == len(greyed)
            status = chromium.find_element(By.ID, "pruning-status")
            assert float(status.get_attribute("data-lambda")) == lam and number_after("BLEU", status.text) == 20 + lam
    chromium.find_element(By.CSS_SELECTOR, 'rect.head[data-key="dec_enc/1/1"]').click()
    card = chromium.find_element(By.ID, "card")
    assert "Gate closed at λ = 0.5" in card.find_element(By.CSS_SELECTOR, ".closed-note").text
    assert len(card.find_elements(By.CSS_SELECTOR, "svg.trajectories path[data-run]")) == 1  # gated in 'all' only
    Select(chromium.find_element(By.ID, "pruning-setting")).select_by_value("none")
    assert not chromium.find_elements(By.CSS_SELECTOR, "rect.head.closed")
    listed = [li.text for li in chromium.find_elements(By.CSS_SELECTOR, "#planted li")]
    assert len(listed) == 2 and "amod" in listed[0] and listed[1].endswith("not found")
    chromium.find_element(By.CSS_SELECTOR, 'rect.head[data-key="enc_self/1/1"]').click()
    shown = chromium.find_element(By.CSS_SELECTOR, "#card ul.planted li").text
    assert shown.startswith("amod (syntactic) via adj->noun: rate 0.787") and "closes at λ 0.5 (all)" in shown


# --------------------------------------------------------------------------------------------
# A language model's atlas


LM_LINES = ["A man in a blue shirt is riding a bike down the street.", "Two dogs play in the snow.",
            "A woman sits on a bench and reads a book.", "Children are playing football in a park.",
            "A black dog runs through the grass.", "A group of people stand outside a building."]


@pytest.mark.slow
def test_a_decoder_only_language_models_atlas_shows_bos_and_its_pieces_with_perplexity(tmp_path):
    """The trained tiny GPT-2 (2 layers x 4 heads of causal dec_self): every head's examples over
    BOS + the line's pieces (BOS first, causal rows), its role's marks past BOS, the histogram equal
    to the role analysis's positional.csv, and a page of dec_self heads whose pruning is perplexity."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer

    trained = Path(__file__).parent / "data" / "gpt2_multi30k"
    model, tokenizer = load_pretrained_lm(trained).eval(), load_lm_tokenizer(trained)
    frequencies = count_words(LM_LINES)
    roles = {"dec_self/0/1": {"role": "rare"}, "dec_self/1/0": {"role": "positional", "positional": {"offset": -1}},
             "dec_self/0/0": {"role": "syntactic", "syntactic_best": {"relation": "amod", "direction": "head->dep"}}}
    treebank = tmp_path / "toy.conllu"
    treebank.write_text(toy_conllu(toy_corpus(8, seed=6)[0]), encoding="utf-8")
    out = gather_examples(model, tokenizer, tokenizer, LM_LINES, [], roles, chosen=[0, 2], best=2,
                          parses=read_conllu(treebank), frequencies=frequencies, role_settings={"top_k": 3},
                          log=lambda _: None)
    assert out["axes"] == {"dec_self": ["tgt", "tgt"]}
    assert len(out["examples"]) == 2 * 4 and all(k.startswith("dec_self/") for k in out["examples"])
    bos = tokenizer.tokenizer.convert_ids_to_tokens(model.special.bos)
    for examples in out["examples"].values():
        assert [out["sentences"][e["s"]]["label"] for e in examples if e["why"] == "chosen"] == [
            "analysis line 1", "analysis line 3"]
        for e in examples:
            sentence = out["sentences"][e["s"]]
            assert sentence["src"] is None and sentence["tgt"][0] == bos
            if sentence["label"].startswith("analysis line"):
                line = int(sentence["label"].split()[-1]) - 1
                assert sentence["tgt"][1:] == tokenizer.pieces(LM_LINES[line])
            assert e["rows"] == e["cols"] == len(sentence["tgt"])
            matrix = decode_matrix(e["m"], e["rows"], e["cols"])
            assert np.allclose(matrix.sum(axis=1), 1, atol=e["cols"] / 255)
            assert np.allclose(np.triu(matrix, 1), 0)  # causal: no query sees a later token
    rare = [e for e in out["examples"]["dec_self/0/1"] if e["why"] == "role"]
    assert rare and all(e["marks"]["rare"] and min(e["marks"]["rare"]) >= 1 for e in rare)  # past BOS
    syntactic = [e for e in out["examples"]["dec_self/0/0"] if e["why"] == "role"]
    assert syntactic and all(out["sentences"][e["s"]]["label"].startswith("parsed sentence") for e in syntactic)
    assert all(min(min(arc) for arc in e["marks"]["arcs"]) >= 1 for e in syntactic if e["marks"]["arcs"])
    assert all(e["marks"] == {"offset": -1} for e in out["examples"]["dec_self/1/0"] if e["why"] == "role")
    table = text_statistics(model, tokenizer, LM_LINES, frequencies, lowercase=False, log=lambda _: None)["positional"]
    for row in table[table["offset"].abs() <= RADIUS].itertuples():  # the page keeps offsets -RADIUS..RADIUS
        assert out["histograms"]["dec_self"]["share"][head_key("dec_self", row.layer, row.head)][
            row.offset + RADIUS] == pytest.approx(row.fraction)

    scores = score_table({"dec_self": (2, 4)})
    pruning = pd.DataFrame([{"setting": "all", "lam": 2.0, "control": False, "retained_total": 6, "steps": 6,
                             "perplexity": 31.5, "nll": 3.45, "delta_nll": 0.1, "delta_nll_low": 0.05,
                             "delta_nll_high": 0.15, "perplexity_ratio": 1.105}])
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"setting": "all", "lambda": 2.0, "control": False, "heads": [
        {"type": "dec_self", "layer": layer, "head": head, "gated": True, "pruned": (layer, head) in {(0, 0), (1, 3)}}
        for layer in range(2) for head in range(4)]}))
    data = gather_tables(scores, roles=pd.DataFrame([{"layer": 1, "head": 0, "role": "positional", "statistic": 0.9}]),
                         pruning=pruning, runs=[(gates, None)], experiment="gpt2_toy")
    assert data["layout"] == {"dec_self": [2, 4]} and data["role_type"] == "dec_self"
    assert {r["name"] for r in data["roles"]} >= {"induction", "sink"}
    assert next(h for h in data["heads"] if h["key"] == "dec_self/1/0")["role"] == "positional"
    assert data["pruning"]["metric"] == "perplexity (lower is better)" and data["pruning"]["column"] == "perplexity"
    run = data["pruning"]["settings"]["all"][0]
    assert run["perplexity"] == 31.5 and run["delta_nll_low"] == 0.05 and run["closed"] == ["dec_self/0/0",
                                                                                            "dec_self/1/3"]
    page = render_page({**data, **out})
    embedded = json.loads(re.search(r'id="atlas-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert embedded["pruning"]["metric"] == "perplexity (lower is better)" and "BLEU" not in json.dumps(embedded)


def test_an_encoder_only_language_models_examples_are_over_cls_pieces_and_sep(tmp_path):
    """A tiny BERT: enc_self over [CLS] + pieces + [SEP] (its own spelling), rows summing to 1, and
    the histogram the role analysis's positional.csv ([CLS] folded into the sink)."""
    pytest.importorskip("transformers")
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer
    from headcount.testing.tiny_lm import write_tiny_bert

    torch.manual_seed(0)
    source = write_tiny_bert(tmp_path / "bert", LM_LINES)
    model, tokenizer = load_pretrained_lm(source).eval(), load_lm_tokenizer(source)
    out = gather_examples(model, tokenizer, tokenizer, LM_LINES, [], {}, chosen=[1], best=1, log=lambda _: None)
    assert out["axes"] == {"enc_self": ["src", "src"]}
    cls, sep = tokenizer.tokenizer.convert_ids_to_tokens([model.special.bos, model.special.eos])
    for examples in out["examples"].values():
        for e in examples:
            sentence = out["sentences"][e["s"]]
            assert sentence["tgt"] is None and sentence["src"][0] == cls and sentence["src"][-1] == sep
            assert e["rows"] == e["cols"] == len(sentence["src"])
            assert np.allclose(decode_matrix(e["m"], e["rows"], e["cols"]).sum(axis=1), 1, atol=e["cols"] / 255)
    table = text_statistics(model, tokenizer, LM_LINES, count_words(LM_LINES), lowercase=False,
                            log=lambda _: None)["positional"]
    for row in table[table["offset"].abs() <= RADIUS].itertuples():  # the page keeps offsets -RADIUS..RADIUS
        assert out["histograms"]["enc_self"]["share"][head_key("enc_self", row.layer, row.head)][
            row.offset + RADIUS] == pytest.approx(row.fraction)


def test_a_documents_examples_are_a_window_of_its_map_so_the_page_stays_small():
    """Documents, not sentences (issue 62): every stored example of a 300-token text is its first
    WINDOW tokens on each axis, the label says so, causal rows still sum to 1 inside the window, and
    the examples weigh what WINDOW x WINDOW bytes do, not 300 x 300."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headcount.data.special import SpecialIds
    from headcount.models.hf_lm import HFCausalLM
    from headcount.report.atlas.examples import WINDOW

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=70, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    model = HFCausalLM(LlamaForCausalLM(config), special=SpecialIds(pad=0, bos=1, eos=2, unk=3)).eval()
    words = "the old dog saw a cat near the red barn and ran home".split()
    document = " ".join(words[i % len(words)] for i in range(300))  # 300 words of at most 2 pieces
    segmenter = PieceSegmenter()
    lines = [document, "a short line"]
    out = gather_examples(model, segmenter, segmenter, lines, [], {"dec_self/1/0": {"role": "rare"}}, chosen=[0, 1],
                          best=1, frequencies=count_words(lines), log=lambda _: None)
    n = len(segmenter.pieces(document)) + 1
    assert n > WINDOW
    long = [s for s in out["sentences"] if s["label"].startswith("analysis line 1")]
    assert long and long[0]["label"] == f"analysis line 1 (its first {WINDOW} of {n} tokens)"
    assert len(long[0]["tgt"]) == WINDOW
    for examples in out["examples"].values():
        for e in examples:
            assert e["rows"] <= WINDOW and e["cols"] <= WINDOW
            matrix = decode_matrix(e["m"], e["rows"], e["cols"])
            assert np.allclose(matrix.sum(axis=1), 1, atol=e["cols"] / 255)  # causal: a window holds whole rows
            assert all(p < WINDOW for p in e.get("marks", {}).get("rare", []))
    size = len(json.dumps(out["examples"]))
    assert size < 4 * 2 * 2 * 2 * WINDOW * WINDOW  # heads x examples x base64 (4/3) < 2, well under 300^2
