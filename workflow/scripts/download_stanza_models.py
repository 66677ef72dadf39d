from _common import job

from headcount.io import HeadcountError

with job(snakemake) as log:
    import stanza

    lang = snakemake.wildcards.lang
    log(f"downloading stanza models for '{lang}' into {snakemake.output[0]}")
    try:
        stanza.download(lang, model_dir=snakemake.output[0], processors="tokenize,pos,lemma,depparse")
    except Exception as error:
        raise HeadcountError(
            f"could not download stanza models for '{lang}' ({type(error).__name__}: {error}). On a machine "
            f"without a network, download them elsewhere with stanza.download('{lang}', model_dir=DIR), copy DIR "
            f"here and set roles.stanza_dir to it, or parse English with spaCy (roles.parser: spacy), or use gold "
            f"treebanks (roles.parser: gold)"
        ) from None
