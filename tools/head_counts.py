"""How many heads can go, at matched counts against random heads, on a shipped pretrained model
(pipeline.head_counts; docs/results_lm.md publishes what it writes).

Resumable: rerun the same command and it goes on from what `--out` holds. SmolLM2 is scored on
windows of running English (data.text_windows: newstest, FLORES-101, EWT), MiniLM on sentences of
the same sources, under its embedding objective. Writes head_counts.tsv (every arm and draw),
head_counts_summary.tsv, head_counts.png, targets.tsv (the L0 runs' error against their target) and
cost.json (CPU seconds per stage); with --captions, the same tables of the same head sets scored on
Multi30k captions under out/captions/. SmolLM2's published run:

    .venv/bin/python tools/head_counts.py smollm2 --out results/head_counts/smollm2 --held-out-tokens 256 \
        --iterative-step 0 --l0-steps 300 --gate-window-tokens 256 --gates-per-source 16 \
        --l0-max-tokens 300 --gate-lr 1.0 --captions 150 --causal

and the same with `--gate-lr 0.1 --out results/head_counts/smollm2_slow_gates` (without --causal); the
syntactic heads' causal test adds `--syntactic 200` to the first. The same arms on 40 whole windows
(about 20k held-out tokens), with smollm2_slow_gates' rankings and gates copied into --out first:
    .venv/bin/python tools/head_counts.py smollm2 --out results/head_counts/smollm2_long \
        --held-out-per-source 10 --iterative-step 0 --l0-steps 300 --gate-window-tokens 256 \
        --gates-per-source 16 --l0-max-tokens 300 --gate-lr 0.1 --chunk 8 --sets-per-pass 1
MiniLM's:

    .venv/bin/python tools/head_counts.py minilm --out results/head_counts/minilm --train-per-source 25 \
        --held-out-per-source 50 --gates-per-source 50 --l0-steps 300 --gate-lr 1.0 --causal

and the same with `--gate-lr 0.1 --out results/head_counts/minilm_slow_gates`. Gates settled on the
count (`--gate-settle 0.25`, 400 steps), scored beside another run's arms: copy that run's
arms.json, scored.tsv, scored.sets.json, scores_*.tsv (and arm_michel_iterative.json) and its
model link into --out first (MiniLM: from minilm_slow_gates; SmolLM2: from smollm2_long), then

    .venv/bin/python tools/head_counts.py minilm --out results/head_counts/minilm_settled --train-per-source 25 \
        --held-out-per-source 50 --gates-per-source 50 --l0-steps 400 --gate-lr 0.1 --gate-settle 0.25
    .venv/bin/python tools/head_counts.py smollm2 --out results/head_counts/smollm2_settled \
        --held-out-per-source 10 --iterative-step 0 --l0-steps 400 --gate-window-tokens 256 \
        --gates-per-source 16 --l0-max-tokens 300 --gate-lr 0.1 --gate-settle 0.25 --chunk 8 --sets-per-pass 1
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from headcount.analysis.head_access import HeadAccess  # noqa: E402
from headcount.data import text_windows as tw  # noqa: E402
from headcount.models.loading import import_pretrained, load_model, open_tokenizer  # noqa: E402
from headcount.models.packaged import fetch_packaged_model, packaged_path  # noqa: E402
from headcount.pipeline import head_counts as hcnt  # noqa: E402
from headcount.pruning import matched_counts as mc  # noqa: E402
from headcount.report import preregistered  # noqa: E402
from headcount.settings import TrainingSettings  # noqa: E402

MODELS = {  # experiment in config.yaml, objective, published score table, what it was computed on
    "smollm2": ("smollm2_en", None, "docs/tables/smollm2_head_scores.csv",
                "Multi30k captions, val[:100] (the published table)"),
    "minilm": ("minilm_en", "sentence_embedding", None, ""),
}
# The published table's rankings an arm takes (costly to make again: 270 ablations, an LRP pass);
# confidence and Michel are made on the training windows, running text like the held-out text.
PUBLISHED_RANKINGS = {"smollm2": ("delta_loss", "lrp")}
ROLES = {"smollm2": "docs/tables/smollm2_head_roles.csv", "minilm": "docs/tables/minilm_head_roles.csv"}
PREVIOUS_TOKEN = 0.4  # previous_score at least this: a previous-token head for the composition test
CAPTIONS = "multi30k/test_2016_flickr.en.gz"  # --captions: the second column, beside the translation models
SYNTACTIC = {"smollm2": "docs/tables/smollm2_table1.md"}  # the published Table 1 whose best heads are tested
SYNTACTIC_TREEBANK = "UD_English-EWT/en_ewt-ud-train.conllu.gz"  # Table 1 read EWT's dev and test and PUD
SYNTACTIC_MAX_PIECES = 45  # the longest sentence Table 1 read
CAUSAL_WINDOWS = 4  # held-out windows the sink test and the ICL score read (each set is a forward pass)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class StageCost:
    """CPU seconds per stage in cost.json, summed over the attempts of a resumed run. A stage's
    progress lines (`progress`, the log its work is given) record its time so far, so an attempt
    stopped mid-stage (a chunked scoring run) keeps what it spent."""

    def __init__(self, path: Path, clock=time.process_time):
        self.path, self.clock = path, clock
        self.cost = json.loads(path.read_text()) if path.exists() else {}
        self.running = None  # (stage, clock at its start, its cost before this attempt)

    def record(self) -> None:
        stage, start, before = self.running
        self.cost[stage] = before + self.clock() - start
        self.path.write_text(json.dumps(self.cost, indent=1))

    def progress(self, message: str) -> None:
        log(message)
        if self.running:
            self.record()

    def timed(self, stage: str, fn):
        self.running = (stage, self.clock(), self.cost.get(stage, 0.0))
        result = fn()
        self.record()
        self.running = None
        return result


def load(name: str, work: Path):
    """The shipped model as the workflow imports it -> (headcount model, tokenizer)."""
    experiment, objective, _, _ = MODELS[name]
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    pin = config["experiments"][experiment]["pretrained"]
    if not (work / "model.pt").exists():
        source = fetch_packaged_model(pin["package"], pin["version"], pin["file"], pin["sha256"],
                                      work / packaged_path(pin["package"], pin["version"], pin["file"]), log=log)
        import_pretrained(str(source), work / "model.pt", work / "tokenizer", objective=objective)
    return load_model(work / "model.pt").eval(), open_tokenizer(work / "tokenizer", "source")


def texts(name: str, tokenizer, data: Path, per_source: dict, gate_tokens: int = 0) -> dict[str, tuple[list, list]]:
    """Training, held-out and gate-training texts -> {use: (texts, sources)}. Each source is read,
    and cut into windows, once: the ranking and the gate-training texts come from the same files.
    gate_tokens: the gate-training windows' length in tokens (0: the ranking windows'; shorter
    windows make a gate step cheaper, and can match a scoring cut to the windows' beginnings). Cut
    anew, they are not checked against the ranking windows and may repeat their text (never the
    held-out sources')."""
    def count(text: str) -> int:
        return len(tokenizer.encode([text])[0])

    @functools.cache
    def sentences(source: str) -> list[str]:
        return tw.read_sentences(data / tw.SOURCES[source])

    windows: dict = {}  # each source cut into windows once, for the ranking and the gate-training texts
    short: dict = {}  # the same, cut into gate_tokens windows
    out = {}
    for use, sources in (("train", tw.TRAIN_SOURCES), ("held_out", tw.HELD_OUT_SOURCES),
                         ("gates", tw.TRAIN_SOURCES)):
        n = per_source[use]
        if name == "minilm":  # sentences: an embedding model embeds one at a time
            found, names = [], []
            for source in sources:
                picked = tw.spread(sentences(source)[1 if use == "gates" else 0:], n)  # gates: others than train's
                found += picked
                names += [source] * len(picked)
        elif use == "gates" and gate_tokens:
            found, names = tw.source_windows(data, sources, count, gate_tokens - 2, n, cache=short)
        else:
            found, names = tw.source_windows(data, sources, count, preregistered.WINDOW_TOKENS - 2,
                                             n + per_source["train"] if use == "gates" else n, cache=windows)
        if use == "gates" and name != "minilm":  # the ranking windows left out
            train = set(out["train"][0])
            keep = [i for i, t in enumerate(found) if t not in train]
            found, names = [found[i] for i in keep], [names[i] for i in keep]
        out[use] = (found, names)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--train-per-source", type=int, default=1, help="ranking texts per training source")
    parser.add_argument("--held-out-per-source", type=int, default=2, help="held-out texts per source")
    parser.add_argument("--gates-per-source", type=int, default=4, help="gate-training texts per training source")
    parser.add_argument("--gate-window-tokens", type=int, default=0,
                        help="gate-training windows of at most N tokens (0: as long as the ranking windows)")
    parser.add_argument("--held-out-tokens", type=int, default=0,
                        help="cut each held-out window to its first N tokens (0: whole windows)")
    parser.add_argument("--captions", type=int, default=0,
                        help="also score every arm on N Multi30k test captions (out/captions/), the text of the "
                             "translation models and of the earlier analyses")
    parser.add_argument("--draws", type=int, default=preregistered.RANDOM_DRAWS)
    parser.add_argument("--iterative-step", type=float, default=0.1,
                        help="share of heads removed between Michel rescorings (0: at each matched count only)")
    parser.add_argument("--l0-steps", type=int, default=0, help="gate steps per L0-to-target run (0: no such arm)")
    parser.add_argument("--l0-lr", type=float, default=0.01, help="the controller's learning rate in the L0 runs")
    parser.add_argument("--gate-lr", type=float, default=hcnt.GATES_ONLY_RATE,
                        help="the gates' learning rate in the L0 runs, about their move in log alpha a step "
                             "(the workflow's on frozen weights)")
    parser.add_argument("--gate-settle", type=float, default=0.0,
                        help="the share of the L0 runs' steps at the end that pull the gates toward the count's "
                             "mask, so that they decide (pruning.lagrangian; 0: none)")
    parser.add_argument("--l0-max-tokens", type=int, default=600, help="tokens per gate-training batch")
    parser.add_argument("--max-tokens", type=int, default=1100)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=8, help="head sets scored (and stored) together: each chunk "
                        "scores the unpruned model once more")
    parser.add_argument("--sets-per-pass", type=int, default=4,
                        help="head sets run as copies of a batch in one forward pass; on a CPU with long windows 1 "
                             "is faster (the copies rarely share layers: a random set edits the first ones)")
    parser.add_argument("--causal", action="store_true", help="also the causal tests of the published roles")
    parser.add_argument("--syntactic", type=int, default=0,
                        help="with --causal: also ablate the best head of each relation of the published Table 1 "
                             "on N sentences of EWT's training treebank (not among those the heads were found on)")
    parser.add_argument("--icl-windows", type=int, default=CAUSAL_WINDOWS,
                        help="with --causal: held-out windows the in-context-learning score reads (other than "
                             f"{CAUSAL_WINDOWS}: written as icl_<N>_windows.tsv)")
    parser.add_argument("--sequences", type=int, default=20, help="repeated random sequences for the causal tests")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stages = StageCost(out / "cost.json")
    timed, progress = stages.timed, stages.progress  # progress: the log of timed work

    model, tokenizer = timed("load", lambda: load(args.model, out / "model"))
    _, objective, published_path, published_on = MODELS[args.model]
    data = timed("texts", lambda: texts(args.model, tokenizer, args.data, {
        "train": args.train_per_source, "held_out": args.held_out_per_source, "gates": args.gates_per_source},
        args.gate_window_tokens))
    if args.held_out_tokens:  # the windows' beginnings, as token ids: every arm reads the same tokens
        held_out, names = data["held_out"]
        data["held_out"] = ([ids[:args.held_out_tokens] for ids in tokenizer.encode(held_out)], names)
    (out / "texts.json").write_text(json.dumps({use: {"sources": names, "texts": t} for use, (t, names)
                                                in data.items()}))
    access = HeadAccess(model, tokenizer, tokenizer, torch.device("cpu"), max_tokens=args.max_tokens)
    total = len(access.heads)
    published = pd.read_csv(REPO / published_path)[["type", "layer", "head", *PUBLISHED_RANKINGS[args.model]]] \
        if published_path else None
    kv = getattr(getattr(getattr(model, "hf", None), "config", None), "num_key_value_heads", None)
    trained_on = ("training windows" if args.model != "minilm" else "training sentences") + \
        f" ({', '.join(tw.TRAIN_SOURCES)})"
    arms, groups = timed("rankings", lambda: hcnt.build_arms(
        access, data["train"][0], out, published=published, published_on=published_on, trained_on=trained_on,
        draws=args.draws, kv_heads=kv, iterative_step=args.iterative_step or None, log=progress))
    counts = mc.counts_removed(total)
    targets = None
    if args.l0_steps:
        import headcount

        # The gates move about --gate-lr a step in log alpha. On SmolLM2, 1.0 decided nearly every gate
        # in 300 steps but chose heads no better than random ones; 0.1 left most undecided, and the
        # count of lowest log alpha was the best arm at every count (docs/results_lm.md).
        recipe = hcnt.gates_only_recipe(dataclasses.asdict(TrainingSettings()), model.hf.config.hidden_size,
                                        args.l0_steps, rate=args.gate_lr)

        settling = {"settle": args.gate_settle} if args.gate_settle else {}  # absent: as the runs before it

        def run(kept):
            pruned = headcount.prune(model, tokenizer, data["gates"][0], target=kept, steps=args.l0_steps,
                                     gates_only=True, dev_texts=data["gates"][0][:2], objective=objective,
                                     training={"max_tokens": args.l0_max_tokens, "seed": 1},
                                     recipe={**recipe, "controller": {"lr": args.l0_lr, "warmup": 0.3,
                                                                      **settling}},
                                     work_dir=out / f"l0_{kept}", log=progress)
            return pruned.gates

        arm, targets = timed("l0 targets", lambda: hcnt.target_arm(run, counts, total, out, log=progress))
        arms.insert(0, arm)
        targets.to_csv(out / "targets.tsv", sep="\t", index=False)
    head_dim = model.hf.config.hidden_size // model.hf.config.num_attention_heads if hasattr(model, "hf") else 0

    def extra(arm, k):
        return {"kv_bytes_per_token": mc.kv_bytes_per_token(arm.removed[k], groups, head_dim)} if groups else {}

    margin = preregistered.NO_LOSS_COSINE if objective == "sentence_embedding" else preregistered.NO_LOSS_NATS
    unit = "cosine distance to the unpruned embedding" if objective else "nats per token"
    summary = timed("scoring", lambda: hcnt.score_arms(
        access, arms, data["held_out"][0], out, total=total, margin=margin, unit=unit, extra=extra,
        draws=args.draws, chunk=args.chunk, sets_per_pass=args.sets_per_pass, log=progress,
        title=f"{args.model}: {len(data['held_out'][0])} held-out texts, {args.draws} random draws"))
    print(summary.to_string(index=False))
    again = mc.rescored(out / "scored.tsv", len(data["held_out"][0]))
    if len(again):  # sets defined anew under their old names (gates trained again): the new against the old
        again.to_csv(out / "rescored.tsv", sep="\t", index=False)
    if args.captions and objective is None:  # the same sets on captions: what the translation models read
        captions = tw.spread(tw.read_sentences(args.data / CAPTIONS), args.captions)
        (out / "captions").mkdir(exist_ok=True)
        (out / "captions" / "texts.json").write_text(json.dumps({"source": CAPTIONS, "texts": captions}))
        timed("scoring captions", lambda: hcnt.score_arms(
            access, arms, captions, out / "captions", total=total, margin=margin, unit=unit, extra=extra,
            draws=args.draws, chunk=args.chunk, log=progress,
            title=f"{args.model}: {len(captions)} Multi30k test captions, {args.draws} random draws"))
    if args.causal:
        timed("causal tests", lambda: causal(args, access, data, out))
    if MODELS[args.model][2]:
        sinks_and_confidence(args.model).to_csv(out / "confidence_vs_sinks.tsv", sep="\t", index=False)
    write_record(out)
    return 0


def table1_heads(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(relation, direction) -> the best head (layer, head from 1) of a published Table 1 (markdown)."""
    from headcount.analysis.roles.statistics import DIRECTION_NAMES

    key_of = {(key[0], name): key for key, name in DIRECTION_NAMES.items()}  # (relation, 'v->s') -> key
    best = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and (cells[0], cells[1]) in key_of:
            layer, head = (int(x) for x in cells[3].split(","))
            best[key_of[(cells[0], cells[1])]] = (layer, head)
    if not best:
        raise SystemExit(f"{path}: no Table 1 rows (relation | direction | instances | best head) found")
    return best


def syntactic(args, access: HeadAccess) -> pd.DataFrame:
    """Each relation's best head (the published Table 1) ablated against other heads of its layer,
    read at the positions it feeds (causal_roles.relation_positions) on `--syntactic` sentences of
    EWT's training treebank of at most SYNTACTIC_MAX_PIECES pieces, spread through it."""
    from headcount.analysis import causal_roles as cr
    from headcount.analysis.roles.statistics import DIRECTION_NAMES
    from headcount.data.parses import read_conllu

    table = read_conllu(args.data / SYNTACTIC_TREEBANK)
    sentences = [s for _, s in table.groupby("sentence", sort=True)]
    pieces = access.src_tokenizer.encode([str(s["text"].iloc[0]) for s in sentences])
    sentences = tw.spread([s for s, p in zip(sentences, pieces) if 3 <= len(p) <= SYNTACTIC_MAX_PIECES],
                          args.syntactic)
    tests, texts = {}, None
    for (relation, direction), (layer, head) in table1_heads(REPO / SYNTACTIC[args.model]).items():
        texts, positions = cr.relation_positions(access, sentences, relation, direction)
        if sum(map(len, positions)):
            tests[f"{relation} {DIRECTION_NAMES[(relation, direction)]}"] = (f"{layer}.{head}", positions)
    log(f"syntactic heads: {len(tests)} relations on {len(sentences)} sentences of {SYNTACTIC_TREEBANK}")
    found = cr.syntactic_tests(access, tests, texts)
    return pd.concat([t.table.assign(instances=int(sum(map(len, tests[t.test.split(' ', 1)[1]][1]))))
                      for t in found], ignore_index=True)


def write_record(out: Path) -> None:
    """out/provenance/run_<commit>.json: the software that made the tables, one record per commit
    that ran part of a run (a resumed run keeps the earlier ones; tools/publish_results.py reads
    the commits from them)."""
    from headcount.provenance import provenance

    record = provenance()
    commit = (record.get("software", record).get("headcount_commit") or "unknown")[:12]
    (out / "provenance").mkdir(exist_ok=True)
    (out / "provenance" / f"run_{commit}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")


def sinks_and_confidence(name: str) -> pd.DataFrame:
    """Confidence's rank correlation with the sink share, and with single-head ablation over every
    head and over the heads that are not sinks (the published tables; 95% bootstrap intervals)."""
    from headcount.analysis.correlations import spearman, spearman_interval

    scores = pd.read_csv(REPO / MODELS[name][2]).merge(
        pd.read_csv(REPO / ROLES[name])[["layer", "head", "sink_share", "is_sink"]], on=["layer", "head"])
    rows = []
    for heads, table in (("all", scores), ("not sinks", scores[~scores["is_sink"]])):
        for other in ("sink_share", "delta_loss"):
            low, high = spearman_interval(table["confidence"], table[other])
            rows.append({"heads": heads, "n": len(table), "confidence_with": other,
                         "spearman": spearman(table["confidence"], table[other]), "low": low, "high": high})
    return pd.DataFrame(rows)


def icl_windows(access: HeadAccess, data: Path, n: int = CAUSAL_WINDOWS) -> list[list[int]]:
    """`n` windows of held-out running text for the in-context-learning score, cut in tokens
    (WINDOW_TOKENS less the specials the model adds) so that each reaches the score's late
    position: sentence-aligned windows mostly stop a few tokens short of it. Each held-out source
    in turn gives one, its k-th of m starting at the middle of the source's k-th m-th (one a
    source: its middle); a window reads on through at most 150 sentences, and needs about 20."""
    length = preregistered.WINDOW_TOKENS - 2
    sources = tw.HELD_OUT_SOURCES
    per_source = -(-n // len(sources))
    out = []
    for i in range(n):
        sentences = tw.read_sentences(data / tw.SOURCES[sources[i % len(sources)]])
        start = len(sentences) * (2 * (i // len(sources)) + 1) // (2 * per_source)
        ids = access.tgt_tokenizer.encode([" ".join(sentences[start:start + 150])])[0]
        out.append([int(t) for t in ids[:length]])
    return out


def causal(args, access: HeadAccess, data: dict, out: Path) -> None:
    """The published roles tested by ablation against layer-matched random sets
    (analysis.causal_roles): induction (repeated random tokens), copying, the in-context-learning
    score, previous-token -> induction composition, and sinks."""
    from headcount.analysis import causal_roles as cr

    roles = pd.read_csv(REPO / ROLES[args.model])
    named = {role: [access.names.name(("dec_self" if args.model != "minilm" else "enc_self", int(r.layer),
                                       int(r.head))) for r in roles[roles[f"is_{role}"]].itertuples()]
             for role in ("induction", "sink") if f"is_{role}" in roles}
    held_out = data["held_out"][0]
    windows = held_out[:: max(1, len(held_out) // CAUSAL_WINDOWS)][:CAUSAL_WINDOWS] if args.model != "minilm" \
        else held_out
    tests = []
    if args.model != "minilm":
        kind = "dec_self"
        vocab = access.model.hf.config.vocab_size
        sequences = cr.repeated_random_tokens(vocab, args.sequences, seed=0, low=100,
                                              avoid=cr.special_ids(access))
        tests.append(hcnt.cached_table(out / "causal_induction.tsv",
                           lambda: cr.induction_test(access, named["induction"], sequences).table))
        hcnt.cached_table(out / "copying.tsv", lambda: cr.copying_scores(access, sequences))
        matched = access.matched_random(named["induction"], draws=3, seed=1)
        icl_name = "icl.tsv" if args.icl_windows == CAUSAL_WINDOWS else f"icl_{args.icl_windows}_windows.tsv"
        hcnt.cached_table(out / icl_name, lambda: cr.icl_scores(
            access, icl_windows(access, args.data, args.icl_windows), {"induction": named["induction"], **matched}))
        previous = [access.names.name((kind, int(r.layer), int(r.head)))
                    for r in roles[roles["previous_score"] >= PREVIOUS_TOKEN].itertuples()]

        def composition():
            found = cr.composition_test(access, previous, named["induction"], sequences)
            found.per_head.to_csv(out / "composition_per_head.tsv", sep="\t", index=False)
            table = found.table
            table["left_out"] = " ".join(found.left_out)
            return table

        tests.append(hcnt.cached_table(out / "causal_composition.tsv", composition))
    tests.append(hcnt.cached_table(out / "causal_sink.tsv", lambda: cr.sink_test(access, named["sink"], windows).table))
    if args.syntactic and args.model in SYNTACTIC:
        tests.append(hcnt.cached_table(out / "causal_syntactic.tsv", lambda: syntactic(args, access)))
    pd.concat(tests, ignore_index=True).to_csv(out / "causal.tsv", sep="\t", index=False)
    log(f"wrote {out / 'causal.tsv'}")


if __name__ == "__main__":
    sys.exit(main())
