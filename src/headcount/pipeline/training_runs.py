"""Training a translation model from files: the baseline (and each seed's), and the from-scratch
twin of a pruned model (its head mask, random initialisation). What train_baseline.py calls."""

from __future__ import annotations

import json
from contextlib import nullcontext

import torch

from headcount.data.subwords import Segmenter, pieces_fingerprint
from headcount.data.token_corpus import encode_file
from headcount.io import HeadcountError, read_lines, sha256_file, write_json
from headcount.models.checkpoint import load_checkpoint
from headcount.models.device import inherited_precision
from headcount.models.loading import load_model
from headcount.models.seq2seq import Seq2SeqWithHeads, heads_per_layer
from headcount.models.transformer import ModelConfig, Transformer
from headcount.provenance import provenance
from headcount.pruning.removal import computing_kept_heads
from headcount.settings import PruneRecipe
from headcount.training.decode import translate
from headcount.training.evaluate import corpus_bleu
from headcount.training.loop import Corpus, DevSet, TrainConfig, train
from headcount.training.schedules import pruned_model_lr


def continued_precision(train_settings: dict, began: str | None, what: str, log=print) -> dict:
    """`train_settings` for a run that continues another (`what`, which trained in `began`): with
    precision auto, that run's precision, so one chain of runs never mixes bf16 and fp32 (the
    machines of a cluster, or of successive runs, differ in whether they have bf16)."""
    precision = inherited_precision(train_settings["precision"], began)
    if precision != train_settings["precision"]:
        log(f"precision auto: {precision}, as {what} trained")
    return {**train_settings, "precision": precision}


def train_translation_model(
    train_src: str, train_tgt: str, dev_src: str, dev_tgt: str, src_spm: str, tgt_spm: str,
    model_settings: dict, train_settings: dict, lowercase: bool, work_dir: str, model_out: str,
    summary_out: str, head_mask_from: str | None = None, log=print,
) -> dict:
    """Train a Transformer on subword-encoded text; resumable from `work_dir/checkpoint.pt`.

    With `head_mask_from` (a pruned model), the new model gets that model's fixed 0/1 head mask
    and is trained from random initialisation: the paper's "from scratch" models. A "schedule" entry
    of `train_settings` (config.scratch_schedule; the rule adds it only for prune.scratch_schedule:
    pruned, so that twins trained before the option keep their parameters) replaces Noam with the
    pruned model's own learning-rate schedule (training.schedules.pruned_model_lr); the summary's
    `lr_schedule` says which the run had.
    """
    train_settings = dict(train_settings)
    schedule = train_settings.pop("schedule", None)
    if head_mask_from is not None:
        pruning = load_checkpoint(head_mask_from).get("pruning", {})
        train_settings = continued_precision(train_settings, (pruning.get("summary") or {}).get("precision"),
                                             "its pruned model", log)
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    log("encoding the training and dev data")
    # Compact (token_corpus): a 6M-pair corpus as lists of Python ints would not fit in memory.
    data = Corpus(encode_file(src_seg, train_src), encode_file(tgt_seg, train_tgt))
    dev_references = read_lines(dev_tgt)
    dev = DevSet(src_seg.encode(read_lines(dev_src)), tgt_seg.encode(dev_references), dev_references)
    model_cfg = ModelConfig(src_vocab=len(src_seg), tgt_vocab=len(tgt_seg), **model_settings)
    cfg = TrainConfig(**{**train_settings, "adam_betas": tuple(train_settings["adam_betas"])})
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)
    # The subwords by their pieces (a rebuilt model with the same pieces resumes the run), the text by its bytes.
    fingerprint = {"src_spm": pieces_fingerprint(src_spm), "tgt_spm": pieces_fingerprint(tgt_spm),
                   "train_src": _file_id(train_src), "train_tgt": _file_id(train_tgt)}
    if head_mask_from is not None:
        masks = load_model(head_mask_from).head_mask()
        model.set_head_mask({kind: (mask > 0).float() for kind, mask in masks.items()})
        fingerprint["head_mask"] = {kind: mask.tolist() for kind, mask in model.head_mask().items()}
        fingerprint["computed_heads"] = "kept"
        log("retained heads: " + ", ".join(f"{k} {int(m.sum())}/{m.numel()}" for k, m in model.head_mask().items()))

    lr_at = None  # the baseline's Noam
    if schedule is not None:
        lr_at = pruned_model_lr(schedule["baseline_training"], schedule["fine_tuning"], schedule["lr_schedule"],
                                schedule["fine_tuning_steps"], schedule["heal_steps"], model.d_model,
                                schedule.get("weight_lr_scale", PruneRecipe.weight_lr_scale))
        fingerprint["schedule"] = schedule
        log(f"the pruned model's schedule: Noam for {schedule['baseline_training']['max_steps']} steps, "
            f"{schedule['lr_schedule']} for {schedule['fine_tuning_steps']}, healing for {schedule['heal_steps']}")

    def dev_bleu(model: Seq2SeqWithHeads, dev: DevSet) -> float:
        return greedy_dev_bleu(model, dev, tgt_seg, cfg.dev_bleu_sentences, lowercase)

    # A twin computes only its kept heads (the same function in less time a step; see
    # pruning.removal.computing_kept_heads). Its checkpoints hold that smaller layout, as the
    # fingerprint says.
    heads = computing_kept_heads(model) if head_mask_from is not None else nullcontext()
    with heads:
        summary = train(model, cfg, data, dev, work_dir, dev_bleu=dev_bleu if cfg.dev_bleu_sentences else None,
                        run_fingerprint=fingerprint, lr_at=lr_at, log=log, earlier_fingerprints=[
                            {**fingerprint, "src_spm": _file_id(src_spm), "tgt_spm": _file_id(tgt_spm)}])
    model.to("cpu")
    model.save(model_out, {"train_config": cfg.to_dict(), "summary": summary, "provenance": provenance()})
    summary = {**summary, "lr_schedule": "noam" if schedule is None else "pruned",
               "model_config": model_cfg.to_dict(), "train_config": cfg.to_dict(),
               "parameters": sum(p.numel() for p in model.parameters()), "provenance": provenance()}
    write_json(summary_out, summary)
    return summary


def import_pretrained_baseline(source: str, model_out: str, summary_out: str, tokenizer_dir: str,
                               src_lang: str, tgt_lang: str, model_langs: dict | None = None,
                               allow_weights: dict | None = None, objective: str | None = None, log=print) -> dict:
    """A pretrained experiment's baseline: the model `source` (hub id or local directory) as a
    headcount checkpoint at `model_out`, where a trained baseline would be, its tokenizer's files
    in `tokenizer_dir`, and a record at `summary_out` in place of the training summary (no steps:
    the pruning table counts fine-tuning steps alone). `model_langs` ({"src", "tgt"}: the model's
    own language codes, `pretrained_langs`) sets a multilingual tokenizer's languages. A causal or
    masked language model (loading.import_pretrained tells by its config) is imported the same way,
    with its one tokenizer; its record names its `model_kind` and its language (src_lang). A model
    whose checkpoint lacks weights it needs, or holds unused ones, is refused unless `allow_weights`
    ({"missing", "unexpected"}: fnmatch patterns) names them. `objective` (the experiment's key):
    "sentence_embedding" imports an encoder as a sentence encoder, analysed through its pooled
    embedding (models.hf_sentence); None, by the objective its config says."""
    if isinstance(source, dict):  # a checkpoint another run or toolkit wrote (config.checkpoint_source)
        return _import_checkpoint_baseline(source, model_out, summary_out, tokenizer_dir, src_lang, tgt_lang, log)
    from headcount.models.loading import import_pretrained
    from headcount.models.seq2seq import kind_of

    langs = model_langs or {}
    log(f"importing pretrained model {source!r}" + (f" ({langs['src']} -> {langs['tgt']})" if langs else ""))
    model = import_pretrained(source, model_out, tokenizer_dir, src_lang=langs.get("src"), tgt_lang=langs.get("tgt"),
                              allow_weights=allow_weights, objective=objective)
    # What the experiment asked for, where its config.json could not tell before the import
    # (config.declared_kind): config.load_experiments gives a text: experiment src_lang = tgt_lang =
    # its lang, and refuses a translation experiment whose two languages are one.
    wanted_lm, is_lm = src_lang == tgt_lang, kind_of(model).objective != "translation"
    if wanted_lm != is_lm:
        from headcount.config import kind_mismatch

        what = (f"a {model.family.name} {getattr(model, 'model_kind', 'language')} model" if is_lm
                else f"an encoder-decoder model ({model.family.name})")
        raise HeadcountError(kind_mismatch(None, source, wanted_lm, what))
    if is_lm:  # a language model: one language, no language codes
        summary = {"pretrained": str(source), "family": model.family.name, "model_kind": model.model_kind,
                   "objective": kind_of(model).objective, "lang": src_lang,
                   "model_config": json.loads(model.cfg.to_json_string()),
                   "heads": model.head_counts(), "parameters": sum(p.numel() for p in model.parameters()),
                   "train_config": {"select": "pretrained"}, "provenance": provenance()}
        if hasattr(model, "pooling"):  # a sentence encoder: what its embedding is (hf_sentence)
            summary["pooling"] = dict(vars(model.pooling))
            log(f"sentence embedding: {model.pooling.mode} pooling, normalised {model.pooling.normalize} "
                f"({model.pooling.declared_by or 'no modules.json: the mean over real tokens'})")
        write_json(summary_out, summary)
        log(f"{model.family.name} {model.model_kind} language model, {summary['parameters']} parameters, heads per "
            f"layer {summary['heads']}")
        return summary
    if model.special.forced:
        log(f"search forces {model.special.forced} after the decoder's start token (the target language tag)")
    summary = {"pretrained": str(source), "family": model.family.name, "src_lang": src_lang, "tgt_lang": tgt_lang,
               "model_langs": langs or None, "forced": list(model.special.forced),
               "model_config": json.loads(model.cfg.to_json_string()),
               "dims": model.dims(), "heads": model.head_counts(),
               "parameters": sum(p.numel() for p in model.parameters()), "train_config": {"select": "pretrained"},
               "provenance": provenance()}
    write_json(summary_out, summary)
    log(f"{model.family.name} model, {summary['parameters']} parameters, heads per layer {summary['heads']}")
    return summary


def _import_checkpoint_baseline(source: dict, model_out: str, summary_out: str, tokenizer_dir: str, src_lang: str,
                                tgt_lang: str, log=print) -> dict:
    """A fairseq checkpoint, or a headcount checkpoint from another run, as the experiment's baseline."""
    from dataclasses import asdict

    from headcount.config import checkpoint_source

    files = checkpoint_source({"pretrained": source})  # one sentencepiece path -> both sides
    log(f"importing {files['family']} checkpoint {files['checkpoint']}")
    if files["family"] == "fairseq":
        from headcount.models.fairseq import import_fairseq

        model, args = import_fairseq(files["checkpoint"], files["data"], files["sentencepiece"] or {}, model_out,
                                     tokenizer_dir)
        arch = args.get("arch")
    else:
        from headcount.data.subwords import write_tokenizer_dir

        model, arch = load_model(files["checkpoint"]), "headcount"
        if not isinstance(model, Transformer):
            raise HeadcountError(f"{files['checkpoint']}: a {type(model).__name__} checkpoint, not headcount's own "
                                 f"Transformer; give a transformers model as `pretrained: <directory>`")
        for side, vocab in (("src", model.cfg.src_vocab), ("tgt", model.cfg.tgt_vocab)):
            if len(Segmenter(files["sentencepiece"][side])) != vocab:
                raise HeadcountError(f"{files['sentencepiece'][side]}: {len(Segmenter(files['sentencepiece'][side]))} "
                                     f"pieces, but the checkpoint's {side} vocabulary has {vocab}: not its model")
        write_tokenizer_dir(tokenizer_dir, files["sentencepiece"])
        model.save(model_out, extra={"pretrained": {"source": str(files["checkpoint"]), "family": "headcount"}})
    cfg = asdict(model.cfg)
    summary = {"pretrained": dict(source), "family": files["family"], "arch": arch,
               "src_lang": src_lang, "tgt_lang": tgt_lang, "model_config": cfg,
               "heads": heads_per_layer(model),
               "parameters": sum(p.numel() for p in model.parameters()), "train_config": {"select": "pretrained"},
               "provenance": provenance()}
    write_json(summary_out, summary)
    log(f"{files['family']} {arch}: {cfg['enc_layers']}+{cfg['dec_layers']} layers, d_model {cfg['d_model']}, "
        f"{cfg['n_heads']} heads, {cfg['norm']}-LN, {cfg['positions']} positions, {summary['parameters']} parameters")
    return summary


def greedy_dev_bleu(model: Seq2SeqWithHeads, dev: DevSet, tgt_seg: Segmenter, n: int, lowercase: bool) -> float:
    """Dev BLEU of greedy translations of the first n dev sentences: checkpoint selection."""
    device = next(model.parameters()).device
    hyps = translate(model, dev.src[:n], beam=1, max_tokens=8000, device=device)
    return corpus_bleu(tgt_seg.decode(hyps), dev.references[:n], lowercase=lowercase)


def _file_id(path: str) -> str:
    """A file's identity for resuming: its content, so results moved or copied still resume."""
    return sha256_file(path)
