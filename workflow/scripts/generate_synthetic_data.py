from _common import job

from headcount.config import SYNTHETIC_TEST_SET
from headcount.data.synthetic_language import Grammar, write_corpus

with job(snakemake) as log:
    settings = dict(snakemake.params.synthetic)
    seed = settings.pop("seed")
    sizes = {split: settings.pop(split) for split in ("train", "dev", SYNTHETIC_TEST_SET)}
    out = snakemake.output
    outputs = {"train": {"src": out.src, "tgt": out.tgt}}
    for split in ("dev", SYNTHETIC_TEST_SET):
        outputs[split] = {kind: out[f"{split}_{kind}"] for kind in ("src", "tgt", "conllu")}
    write_corpus(Grammar(**settings), seed, sizes, outputs, out.stats, log=log)
