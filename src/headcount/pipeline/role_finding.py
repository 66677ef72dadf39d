"""The head-role stages over files: parsing the analysis sentences, and finding positional,
syntactic and rare-token encoder heads with Table 1 (Voita et al. 2019, section 5). What
parse_analysis_sentences.py and head_roles.py call."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headcount.io import atomic_path, read_lines
from headcount.models.loading import load_model, open_tokenizer

# Table 1 of Voita et al. (2019): best head / positional baseline accuracy (%) on EN-RU.
PAPER_TABLE1 = {  # name: (WMT best, WMT baseline, OpenSubtitles best, OpenSubtitles baseline)
    ("nsubj", "v->s"): (45, 35, 77, 45), ("nsubj", "s->v"): (52, 35, 70, 45),
    ("obj", "v->o"): (78, 41, 61, 46), ("obj", "o->v"): (73, 41, 84, 46),
    ("amod", "noun->adj"): (74, 72, 81, 80), ("amod", "adj->noun"): (82, 72, 81, 80),
    ("advmod", "v->adv"): (48, 46, 38, 33), ("advmod", "adv->v"): (52, 46, 42, 33),
}


def parse_analysis_sentences(parser: str, treebanks: list[str], analysis_src: str | None, stanza_dir: str | None,
                             lang: str, max_sentences: int, out_path: str, log=print, spacy_model: str | None = None,
                             analysis_sentences: int | None = None, analysis_label: str | None = None,
                             info_path: str | None = None):
    """The parse table the syntactic-head analysis reads, and (to `info_path`, JSON) which text and
    which parser it holds.

    parser "gold": the CoNLL-U `treebanks`, first `max_sentences` sentences (not in-domain: the
    role analysis leaves out those longer than the training maximum). "spacy" (pipeline package
    `spacy_model`) or "stanza" (models in `stanza_dir`): parses of the experiment's own analysis
    set, its first `analysis_sentences` lines (`analysis_label` names them, e.g. "dev[:500] of
    multi30k_en_de").
    """
    import json

    from headcount.data.parses import (
        load_spacy_pipeline,
        parse_with_spacy,
        parse_with_stanza,
        read_gold_treebanks,
        spacy_description,
    )

    if parser == "gold":
        table, label = read_gold_treebanks(treebanks, max_sentences)
        info = {"parser": "gold treebank trees", "text": label, "in_domain": False}
    else:
        lines = read_lines(analysis_src)[:analysis_sentences or max_sentences]
        if parser == "spacy":
            nlp = load_spacy_pipeline(spacy_model)
            table, description = parse_with_spacy(lines, pipeline=nlp), spacy_description(nlp)
        else:
            import stanza

            table, description = parse_with_stanza(lines, stanza_dir, lang), f"stanza {stanza.__version__} ({lang})"
        info = {"parser": description, "text": analysis_label or Path(analysis_src).name, "in_domain": True}
    info.update(sentences=int(table["sentence"].nunique()), words=len(table))
    log(f"{info['sentences']} sentences, {info['words']} words parsed: {info['text']}, parser {info['parser']}")
    with atomic_path(out_path) as tmp:
        table.to_parquet(tmp, index=False)
    if info_path:
        with atomic_path(info_path) as tmp:
            tmp.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return table, info


def find_head_roles(model_path: str, src_spm: str, parses_path: str, train_src: str, lowercase: bool,
                    settings: dict, out: dict, head_scores_path: str | None = None, device: str = "auto",
                    log=print, analysis_src: str | None = None, analysis_sentences: int | None = None,
                    analysis_label: str | None = None, parses_info_path: str | None = None,
                    reference_treebanks: list[str] | tuple[str, ...] = ()):
    """Positional, syntactic and rare-token encoder heads (Voita et al. 2019, section 5).

    Positional and rare-token statistics come from the experiment's own analysis set (the first
    `analysis_sentences` lines of `analysis_src`, named `analysis_label`); syntactic ones from the
    parse table, whose text and parser `parses_info_path` (parse_analysis_sentences) names. Parses
    that are not of in-domain text (gold treebanks) lose the sentences longer, in subwords, than the
    longest training sentence. Every output table names its text and its parser.

    `reference_treebanks` (gold CoNLL-U, beside in-domain parses): the syntactic statistics on
    their gold trees as well, a cross-check of the parser's reading: roles.csv gets
    `*_gold` columns and table1 a second table (`settings["max_sentences"]` sentences at most,
    none longer than the longest training sentence).

    The heads analysed are those of the attention type the model's kind has for roles
    (roles.registry.ROLE_ATTENTION: a decoder-only model's causal self-attention). The roles its
    kind adds (roles.registry.roles_for) come with their statistics: a decoder-only model's
    induction scores on random repeated tokens (ids below the tokenizer's size; settings
    `induction_length`, `induction_sequences`, `induction_seed` if given) and sink shares on the
    analysis text. Their thresholds are settings `induction_threshold`, `sink_threshold` if given,
    the registry's otherwise; their tables are written to out["induction"] / out["sink"] when
    `out` names them, and their columns are in roles.csv either way.
    """
    import json

    import pandas as pd

    from headcount.analysis.roles.collect import longest_sentence
    from headcount.analysis.roles.registry import ROLE_ATTENTION
    from headcount.analysis.roles.statistics import RELATIONS, count_words
    from headcount.data.parses import read_gold_treebanks
    from headcount.models.device import pick_device  # torch, which the parse job need not load
    from headcount.models.seq2seq import kind_of
    from headcount.report.plots import head_function_map, relative_positions

    model = load_model(model_path).eval()
    kind = kind_of(model).layout
    segmenter = open_tokenizer(src_spm, "source")
    dev = pick_device(device)
    parses = pd.read_parquet(parses_path)
    info = {"parser": "unknown", "text": Path(parses_path).name, "in_domain": False}
    if parses_info_path:
        info.update(json.loads(Path(parses_info_path).read_text(encoding="utf-8")))
    train_lines = read_lines(train_src)
    frequencies = count_words(train_lines, lowercase=lowercase)
    if analysis_src:
        texts = read_lines(analysis_src)[:analysis_sentences]
        analysis_label = analysis_label or f"{Path(analysis_src).name}[:{len(texts)}]"
    else:  # no analysis set given: the parsed sentences stand in for it
        texts, analysis_label = parses.groupby("sentence", sort=True)["text"].first().tolist(), info["text"]
    gold = None
    if reference_treebanks and info["in_domain"]:
        gold, label = read_gold_treebanks(reference_treebanks, settings["max_sentences"])
        gold.attrs["text"] = label
    found = role_tables(model, segmenter, texts, analysis_label, parses, info, frequencies,
                        longest_sentence(segmenter, train_lines, lowercase), lowercase, settings, gold=gold,
                        device=dev, log=log)
    roles, table1, markdown, tables = found["roles"], found["table1"], found["table1_md"], found["tables"]
    for name, frame in tables.items():
        if name in ("sink", "induction") and name not in out:
            continue
        with atomic_path(out[name]) as tmp:
            frame.to_csv(tmp, index=False, float_format="%.4g")
    with atomic_path(out["table1"]) as tmp:
        table1.to_csv(tmp, index=False, float_format="%.1f")
    with atomic_path(out["table1_md"]) as tmp:
        tmp.write_text(markdown, encoding="utf-8")
    scores = pd.read_parquet(head_scores_path) if head_scores_path else None
    counts = roles["role"].value_counts().to_dict()
    heads = "decoder self-attention heads" if ROLE_ATTENTION[kind] == "dec_self" else "encoder heads"
    head_function_map(roles, scores, out["function_map"],
                      f"{heads} by function ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})", kind=kind)
    relative_positions(parses, list(RELATIONS), out["relative_positions"],
                       f"relative position of dependents (words), {info['text']}, {info['parser']}")
    paper = roles["role_paper"].value_counts().to_dict()
    log("roles: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "; with the paper's rules: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(paper.items())))
    return roles, table1


def role_tables(model, segmenter, texts: list[str], analysis_label: str, parses, info: dict, frequencies,
                longest: int | None, lowercase: bool, settings: dict, gold=None, device=None, log=print) -> dict:
    """The head-role analysis in memory: statistics, roles and Table 1 of `model`'s heads.

    `texts` (named `analysis_label`) give the positional, rare-token and sink statistics; `parses`
    (data.parses' table; `info`: its parser, its text, whether it is in-domain) the syntactic ones;
    `frequencies` (statistics.count_words of the training text) the rare words; `longest` (subwords)
    limits parses that are not in-domain. `gold` (a gold parse table, its attrs["text"] naming it)
    adds the `*_gold` cross-check. Returns {"roles", "table1", "table1_md", "tables"}, tables being
    every statistics table by name. find_head_roles and headcount.api.analyse both call this."""
    from headcount.analysis.roles.collect import induction_statistics, syntactic_statistics, text_statistics
    from headcount.analysis.roles.registry import assign_roles, roles_for
    from headcount.models.seq2seq import kind_of

    kind = kind_of(model).layout  # a sentence encoder's heads get a masked LM's roles: the same maps
    needs = {need for role in roles_for(kind) for need in role.needs}
    stats = text_statistics(model, segmenter, texts, frequencies, lowercase, top_k=settings["top_k"], device=device,
                            log=log)
    limit = f", sentences of at most {longest} subwords (the longest training sentence)"
    max_pieces, syntactic_text = (None, info["text"]) if info["in_domain"] else (longest, info["text"] + limit)
    stats.update(syntactic_statistics(model, segmenter, parses, lowercase, device=device, max_pieces=max_pieces,
                                      log=log))
    if "induction" in needs:
        stats["induction"] = induction_statistics(
            model, len(segmenter), length=settings.get("induction_length", 50),
            sequences=settings.get("induction_sequences", 20), seed=settings.get("induction_seed", 0), device=device,
            log=log)
    extra = {need: stats[need] for need in needs}
    role_rules = {rule: settings[rule] for role in roles_for(kind) for rule, _ in role.rules if rule in settings}

    def roles_of(syntactic):
        return assign_roles(stats["positional"], syntactic, stats["rare"],
                            positional_threshold=settings["positional_threshold"],
                            syntactic_margin=settings["syntactic_margin"], rare_threshold=settings["rare_threshold"],
                            min_instances=settings["min_instances"], rare_margin=settings["rare_margin"],
                            positional_share=settings["positional_share"], kind=kind, statistics=extra,
                            rules=role_rules)

    roles = roles_of(stats["syntactic"]).assign(text=analysis_label, syntactic_text=syntactic_text,
                                                parser=info["parser"])
    table1 = _with_paper_table1(stats["table1"]).assign(text=syntactic_text, parser=info["parser"])
    markdown = table1_markdown(table1, f"Text: {syntactic_text}. Parser: {info['parser']}.")
    if gold is not None:
        gold_text = gold.attrs.get("text", "gold trees") + limit
        log(f"cross-check on gold trees: {gold_text}")
        reference = syntactic_statistics(model, segmenter, gold, lowercase, device=device, max_pieces=longest,
                                         log=log)
        columns = ["syntactic_relation", "syntactic_name", "syntactic_margin", "is_syntactic"]
        roles = roles.merge(roles_of(reference["syntactic"])[["layer", "head", *columns]].rename(
            columns={c: f"{c}_gold" for c in columns}), on=["layer", "head"], how="left")
        roles["syntactic_text_gold"] = gold_text
        table1_gold = _with_paper_table1(reference["table1"])
        for column in ("n", "n_unanswerable", "best_layer", "best_head", "best_accuracy", "baseline_offset",
                       "baseline_accuracy"):
            if column in table1_gold:  # n_unanswerable: a causal model's
                table1[f"{column}_gold"] = table1_gold[column].to_numpy()
        table1["text_gold"] = gold_text
        markdown += "\n" + table1_markdown(table1_gold, f"Cross-check: text: {gold_text}. Parser: gold trees.")
        log(f"syntactic heads on gold trees: {int(roles['is_syntactic_gold'].sum())}, on {info['parser']} parses: "
            f"{int(roles['is_syntactic'].sum())}")
    no_parse = "none (needs no parse)"
    tables = {"roles": roles, "positional": stats["positional"].assign(text=analysis_label, parser=no_parse),
              "syntactic": stats["syntactic"].assign(text=syntactic_text, parser=info["parser"]),
              "rare": stats["rare"].assign(text=analysis_label, parser=no_parse)}
    if "sink" in needs:
        tables["sink"] = stats["sink"].assign(text=analysis_label, parser=no_parse)
    if "induction" in needs:
        tables["induction"] = stats["induction"].assign(text="random repeated tokens", parser=no_parse)
    return {"roles": roles, "table1": table1, "table1_md": markdown, "tables": tables}


def _with_paper_table1(table1):
    """Table 1 in percent, with the paper's numbers beside it."""
    table1 = table1.copy()
    for column, index in (("paper_wmt_best", 0), ("paper_wmt_baseline", 1), ("paper_opensubs_best", 2),
                          ("paper_opensubs_baseline", 3)):
        table1[column] = [PAPER_TABLE1.get((r, n), (np.nan,) * 4)[index] for r, n in zip(table1["relation"],
                                                                                           table1["name"])]
    table1["best_accuracy"] *= 100
    table1["baseline_accuracy"] *= 100
    return table1


def table1_markdown(table1, header: str | None = None) -> str:
    """Table 1 as Markdown; `header` (which text, which parser) goes above it. Every row says how
    many instances it rests on. A direction without instances has no best head and no row; a note
    below names it. For a causal model (table1 has `n_unanswerable`) an instance counts only where a
    related word precedes the query word, the only words its heads can attend to: its rows say how
    many of the parses' instances that leaves, and a direction none of whose instances it can
    answer (as v->o in English, where the object follows the verb) is left out."""
    causal = "n_unanswerable" in table1.columns
    lines = [header, ""] if header else []
    lines += ["| relation | direction | instances | best head (layer, head) | accuracy | positional baseline | "
              "paper WMT | paper OpenSubtitles |", "|---|---|---|---|---|---|---|---|"]
    left_out = []
    for r in table1.itertuples():
        instances = f"{r.n} of {r.n + r.n_unanswerable}" if causal else f"{r.n}"
        if r.n == 0:
            left_out.append(f"{r.relation} {r.name} ({instances})")
            continue
        lines.append(f"| {r.relation} | {r.name} | {instances} | {r.best_layer + 1}, {r.best_head + 1} | "
                     f"{r.best_accuracy:.0f} | {r.baseline_accuracy:.0f} | {r.paper_wmt_best:.0f} / "
                     f"{r.paper_wmt_baseline:.0f} | {r.paper_opensubs_best:.0f} / {r.paper_opensubs_baseline:.0f} |")
    notes = ["Accuracy in %; layers and heads counted from 1; paper: best / baseline (EN-RU)."]
    if causal:
        notes.append("A causal model's heads attend only to earlier words: an instance counts only where a related "
                     "word precedes the query word (instances: those of all in the parses), and the baseline is "
                     "the most frequent such offset.")
    if left_out:
        notes.append("No instance" + (" a causal head can answer" if causal else "") + ", so no row: "
                     + ", ".join(left_out) + ".")
    return "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"
