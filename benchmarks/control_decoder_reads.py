"""Where the positive control's decoder looks when it writes an agreement morpheme: at the word that
carries the morpheme, or at the partner whose class the morpheme shows. Teacher-forced on the
control's dev sentences, the decoder-encoder attention averaged over heads.

    .venv/bin/python benchmarks/control_decoder_reads.py results/control

The sentences are regenerated from the grammar and the seed of config/config.yaml's control (and
checked against the run's dev files), so each target token is known to belong to a source word:
an adverb's morpheme shows its verb's class, an adjective's its noun's, the verb's first morpheme
its subject's. Where the decoder reads a class at the partner itself, no encoder head has to
bring it over (docs/control_history.md: why the rerun's control has no advmod head).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from headcount.analysis.roles.alignment import align_pieces
from headcount.data.batching import source_tensor, target_tensors
from headcount.data.synthetic_language import Grammar, Lexicon, generate, listing_order
from headcount.models.loading import load_model, open_tokenizer

REPO = Path(__file__).resolve().parents[1]


def morpheme_partners(lexicon: Lexicon, sentence) -> list[tuple[int, str, int | None]]:
    """For each target token, in order: (its source word, "stem" or the kind of morpheme, the
    partner whose class a morpheme shows; None for stems and the verb's object morpheme)."""
    words = sentence.words
    verb = next(i for i, w in enumerate(words) if w.pos == "VERB")
    subject = next(i for i, w in enumerate(words) if w.relation == "nsubj")
    tokens = []
    for i, target in zip(listing_order(lexicon, sentence), sentence.target):
        w, morphemes = words[i], target.split()[1:]
        tokens.append((i, "stem", None))
        for n, _ in enumerate(morphemes):
            if w.pos == "ADV":
                tokens.append((i, "adverb (the verb's class)", verb))
            elif w.pos == "ADJ":
                tokens.append((i, "adjective (its noun's class)", w.head - 1))
            elif w.pos == "VERB" and n == 0:
                tokens.append((i, "verb (its subject's class)", subject))
            else:
                tokens.append((i, "verb (its object's class)", None))
    return tokens


def main(root: Path) -> None:
    control = yaml.safe_load((REPO / "config/config.yaml").read_text())["experiments"]["control"]["synthetic"]
    settings = dict(control)
    seed = settings.pop("seed")
    settings = {k: v for k, v in settings.items() if k not in ("train", "dev", "test")}
    grammar = Grammar(**settings)
    lexicon = Lexicon(grammar, seed)
    (_, sentences), = generate(grammar, seed, {"dev": int(control["dev"])})
    dev = (root / "data/dev.src.txt").read_text().splitlines()
    if [s.source for s in sentences] != dev[:len(sentences)]:
        sys.exit(f"{root}/data/dev.src.txt is not the control's grammar and seed of config/config.yaml")
    model = load_model(root / "baseline/model.pt").eval()
    src_seg, tgt_seg = (open_tokenizer(root / f"subwords/{s}.model", side)
                        for s, side in (("src", "source"), ("tgt", "target")))
    special = model.cfg.special
    shares: dict[str, list[tuple[float, float]]] = {}
    with torch.no_grad():
        for s in sentences:
            tokens = morpheme_partners(lexicon, s)
            target = " ".join(s.target)
            src_words = align_pieces([w.form for w in s.words], src_seg.pieces(s.source))
            tgt_tokens = align_pieces(target.split(), tgt_seg.pieces(target))
            tgt_in, _ = target_tensors(tgt_seg.encode([target]), special)
            _, attention = model(source_tensor(src_seg.encode([s.source]), special), tgt_in, need_weights=True)
            cross = attention["dec_enc"][-1][0].float().mean(0).numpy()  # (T, S): position j predicts piece j
            for j, token in enumerate(tgt_tokens):
                word, kind, partner = tokens[int(token)]
                if partner is None:
                    continue
                row = cross[j, :len(src_words)]
                shares.setdefault(kind, []).append((row[src_words == word].sum(), row[src_words == partner].sum()))
    print(f"{len(sentences)} dev sentences of {root}; decoder-encoder attention of the morpheme's pieces, "
          f"mean over heads\n\n| morpheme of | pieces | on the word itself | on the partner | partner more |\n"
          f"|---|---|---|---|---|")
    for kind, pairs in shares.items():
        own, partner = np.array(pairs).T
        print(f"| {kind} | {len(pairs)} | {own.mean():.2f} | {partner.mean():.2f} | {(partner > own).mean():.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/control"))
