import json

import pandas as pd
from _common import job

from headcount.io import atomic_path

with job(snakemake) as log:
    rows = []
    for path in snakemake.input:
        with open(path, encoding="utf-8") as f:
            s = json.load(f)
        if "distance" in s:  # a sentence encoder's (pipeline.lm_quality): distance to the unpruned model
            rows.append({"experiment": snakemake.wildcards.exp, "split": s["split"], "sentences": s["sentences"],
                         "distance": s["distance"]})
            continue
        if "perplexity" in s:  # a language model's (pipeline.lm_quality): lower is better
            rows.append({"experiment": snakemake.wildcards.exp, "split": s["split"], "sentences": s["sentences"],
                         "tokens": s["tokens"], "nll": s["nll"], "perplexity": s["perplexity"]})
            continue
        rows.append({"experiment": snakemake.wildcards.exp, "split": s["split"], "sentences": s["sentences"],
                     "bleu": s["bleu"], "chrf": s["chrf"], "bleu_signature": s["bleu_signature"],
                     "chrf_signature": s["chrf_signature"]})
    table = pd.DataFrame(rows)
    shown = (["split", "perplexity", "nll"] if "perplexity" in table else ["split", "distance"] if "distance" in table
             else ["split", "bleu", "chrf"])
    with atomic_path(snakemake.output[0]) as tmp:
        table.to_csv(tmp, sep="\t", index=False)
    log("\n" + table[shown].to_string(index=False))
