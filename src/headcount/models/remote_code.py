"""The one rule for configs that would run a model's own Python code: transformers' `auto_map`.

headcount never runs a model's code (trust_remote_code is always False). Every config it reads or
rebuilds (a directory's config.json, a checkpoint's embedded model_config) is checked here, by the
checkpoint reader and by the transformers sources alike, so neither imports the other for it.
"""

from __future__ import annotations

from headcount.io import HeadcountError


class UnsafeModel(HeadcountError):
    """The model asks for something headcount never does (run its own code)."""


def refuse_auto_map(settings: dict, where: str, in_checkpoint: bool = False) -> None:
    """UnsafeModel, naming `where`, for a transformers config that maps a class onto Python code of
    the model's own (`auto_map`, at any depth: an encoder-decoder nests its halves' configs). Every
    config headcount reads or rebuilds goes through here: a directory's config.json, a checkpoint's
    embedded model_config (`in_checkpoint`: which headcount never writes with one)."""
    found, todo = [], [((), settings)]
    while todo and len(found) < 8:
        at, value = todo.pop()
        if isinstance(value, dict):
            if value.get("auto_map"):
                found.append((at, value))
            todo += [((*at, str(k)), v) for k, v in value.items() if isinstance(v, (dict, list)) and len(at) < 32]
        elif isinstance(value, list):
            todo += [((*at, str(i)), v) for i, v in enumerate(value[:10_000]) if isinstance(v, (dict, list))]
    if not found:
        return
    at, config = found[0]
    key = ".".join((*at, "auto_map"))
    auto_map = config["auto_map"]
    classes = sorted(auto_map) if isinstance(auto_map, dict) else auto_map
    model_type = config.get("model_type")
    if in_checkpoint:
        fix = ("headcount writes no auto_map into its checkpoints, so this file was altered or built elsewhere: "
               "replace it with one from a source you trust")
    elif ships_architecture(model_type):
        fix = (f"model_type {model_type!r} is an architecture transformers ships, so the model needs no code of "
               f"its own: remove '{key}' from it (or load the model where you trust its code and save it again "
               f"with save_pretrained, which writes no auto_map for a shipped architecture)")
    else:
        fix = (f"model_type {model_type!r} is not an architecture transformers ships: use a model whose "
               f"architecture it ships, or port this one to one and save it with save_pretrained")
    raise UnsafeModel(f"{where}: '{key}' maps the model's classes onto its own Python code ({classes}); "
                      f"headcount never runs a model's code (trust_remote_code is always False). {fix}")


def ships_architecture(model_type) -> bool:
    if not isinstance(model_type, str):
        return False
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING
