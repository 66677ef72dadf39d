"""Corpora: fetching (URL or local mirror), reading with validation, cleaning.

A *source* is one text file of one language, described by where it lives on the web (`url`),
where it lies under a mirror directory (`path`, the layout of a data mirror such as
../shared/data), and optionally an archive `member` and a TSV `column` to take from it.
"""

from __future__ import annotations

import codecs
import gzip
import os
import random
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .batching import positions
from .io import DataError, atomic_path, read_lines, sha256_file, write_lines

GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------
# Fetching


def fetch_source(
    url: str | None,
    relpath: str,
    dest: str | os.PathLike,
    mirror: str | os.PathLike | None = None,
    sha256: str | None = None,
    retries: int = 3,
    timeout: float = 60.0,
    log=print,
) -> None:
    """Put the file `relpath` at `dest`: copied from `mirror/relpath` if a mirror is given,
    else downloaded from `url`. A given sha256 is checked before `dest` appears."""
    dest = Path(dest)
    with atomic_path(dest) as tmp:
        if mirror:
            mirrored = Path(mirror) / relpath
            if not mirrored.is_file():
                raise DataError(
                    f"{mirrored}: not found in the data mirror {mirror}. Put the file '{relpath}' there "
                    f"(it is published at {url}), or unset the mirror (config key 'mirror' and "
                    f"HEADCOUNT_MIRROR) to download it."
                )
            log(f"copying {mirrored} -> {dest}")
            shutil.copyfile(mirrored, tmp)
            if relpath.endswith(".gz") and not _is_gzip(tmp):
                raise DataError(_not_gzip(mirrored, tmp, f"fix or replace {mirrored}"))
        else:
            if not url:
                raise DataError(f"source '{relpath}' has no url and no mirror is set: add 'url' or set 'mirror'")
            _download(url, tmp, retries, timeout, log)
            if relpath.endswith(".gz") and not _is_gzip(tmp):
                # Mirrors keep text gzipped; the web may serve the same text plain (but not bytes).
                if not _starts_as_text(tmp):
                    raise DataError(_not_gzip(url, tmp, f"check 'url' of source '{relpath}' in the config"))
                _gzip_in_place(tmp)
        if sha256:
            actual = sha256_file(tmp)
            if actual != sha256:
                raise DataError(
                    f"{mirrored if mirror else url}: sha256 {actual} does not match the expected {sha256} for "
                    f"'{relpath}': the file differs from the one the config names. Replace it, or update "
                    f"'sha256' in the config if the new file is intended."
                )


def _download(url: str, dest: Path, retries: int, timeout: float, log) -> None:
    last_error = None
    for attempt in range(1, retries + 1):
        try:
            log(f"downloading {url} (attempt {attempt}/{retries})")
            with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                done, next_report = 0, 0.0
                while block := response.read(1 << 20):
                    out.write(block)
                    done += len(block)
                    if total and done / total >= next_report:
                        log(f"  {done / 1e6:.1f} / {total / 1e6:.1f} MB")
                        next_report += 0.1
            return
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            last_error = error
            time.sleep(min(2**attempt, 10))
    raise DataError(
        f"could not download {url}: {last_error}. If this machine has no network, set a data mirror "
        f"(config key 'mirror' or HEADCOUNT_MIRROR) that holds the file."
    )


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _starts_as_text(path: Path, size: int = 1 << 16) -> bool:
    """Whether the file's first bytes are UTF-8 text (a multi-byte character may be cut at the end)."""
    with open(path, "rb") as f:
        head = f.read(size)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return b"\0" not in head


def _not_gzip(origin, path: Path, fix: str) -> str:
    with open(path, "rb") as f:
        head = f.read(8)
    return (f"{origin} is not gzip data (first bytes {head.hex(' ')}; gzip starts with 1f 8b), though its "
            f"name ends in .gz: the file is damaged or not what the config names; {fix}")


def _gzip_in_place(path: Path) -> None:
    packed = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, open(packed, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    os.replace(packed, path)


# --------------------------------------------------------------------------------------------
# Reading


def _raw_bytes(path: Path, member: str | None) -> bytes:
    """The bytes of a file, or of one member of a .tar(.gz)/.tgz/.zip archive; gunzipped."""
    if member is not None:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                try:
                    data = archive.read(member)
                except KeyError:
                    raise DataError(f"{path}: archive has no member '{member}'; fix 'member' in the source") from None
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as archive:
                try:
                    data = archive.extractfile(member).read()
                except (KeyError, AttributeError):
                    raise DataError(f"{path}: archive has no member '{member}'; fix 'member' in the source") from None
        else:
            raise DataError(f"{path}: 'member' is set to '{member}' but the file is not a tar or zip archive")
    else:
        data = path.read_bytes()
        if path.name.endswith(".gz") and data[:2] != GZIP_MAGIC:
            raise DataError(_not_gzip(path, path, "delete it so that it is fetched again, or fix its source"))
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as error:
            raise DataError(f"{path}: corrupt gzip data ({error}); fetch the file again") from None
    return data


def read_text_lines(path: str | os.PathLike, member: str | None = None, column: int | None = None) -> list[str]:
    """Lines of a UTF-8 text (optionally one TSV column), with errors naming file and line."""
    path = Path(path)
    where = f"{path}:{member}" if member else str(path)
    data = _raw_bytes(path, member)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{where}, line {number}: not valid UTF-8 (byte {raw[error.start]:#04x} at column "
                f"{error.start + 1}). Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) "
                f"or remove the line from both sides of the corpus."
            ) from None
        line = line.rstrip("\r")
        if column is not None:
            fields = line.split("\t")
            if column >= len(fields):
                raise DataError(f"{where}, line {number}: has {len(fields)} tab-separated fields, "
                                f"column {column} was asked for; fix 'column' in the source")
            line = fields[column]
        out.append(line)
    return out


def read_parallel(src: dict, tgt: dict) -> tuple[list[str], list[str]]:
    """Read both sides of a parallel corpus; each side is {'file', 'member'?, 'column'?}."""
    src_lines = read_text_lines(src["file"], src.get("member"), src.get("column"))
    tgt_lines = read_text_lines(tgt["file"], tgt.get("member"), tgt.get("column"))
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src['file']} has {len(src_lines)} lines but {tgt['file']} has {len(tgt_lines)}: the two sides "
            f"of a parallel corpus must align line by line (line {min(len(src_lines), len(tgt_lines)) + 1} "
            f"is the first without a partner). Fix or replace the files."
        )
    if not src_lines:
        raise DataError(f"{src['file']} and {tgt['file']} are empty: a corpus needs at least one sentence pair")
    return src_lines, tgt_lines


# --------------------------------------------------------------------------------------------
# Cleaning


@dataclass
class CleaningConfig:
    max_words: int = 250  # whitespace words on either side
    max_chars: int = 1500  # characters on either side
    max_ratio: float = 3.0  # longer/shorter side, in words
    min_words_for_ratio: int = 3  # short pairs vary too much for a ratio test


def clean_pairs(src: list[str], tgt: list[str], cfg: CleaningConfig) -> tuple[list[int], dict[str, int]]:
    """Indices of the pairs to keep and how many were dropped for each reason.

    Each pair is counted under the first reason that applies: empty, too long, length ratio.
    """
    keep, dropped = [], {"empty": 0, "too_long": 0, "length_ratio": 0}
    for i, (s, t) in enumerate(zip(src, tgt)):
        s, t = s.strip(), t.strip()
        if not s or not t:
            dropped["empty"] += 1
            continue
        ns, nt = len(s.split()), len(t.split())
        if max(ns, nt) > cfg.max_words or max(len(s), len(t)) > cfg.max_chars:
            dropped["too_long"] += 1
            continue
        if min(ns, nt) >= cfg.min_words_for_ratio and max(ns, nt) / min(ns, nt) > cfg.max_ratio:
            dropped["length_ratio"] += 1
            continue
        keep.append(i)
    return keep, dropped


def normalise_line(line: str, lowercase: bool) -> str:
    line = " ".join(line.split())  # tabs, runs of spaces, stray carriage returns
    return line.lower() if lowercase else line


def check_evaluation_pairs(src: list[str], tgt: list[str], max_chars: int, where: str) -> None:
    """Dev and test sets are never filtered (scores must cover every line), only checked."""
    for number, (s, t) in enumerate(zip(src, tgt), start=1):
        if not s.strip():
            raise DataError(f"{where}, line {number}: empty source sentence in an evaluation set; "
                            f"remove the line from both sides")
        if max(len(s), len(t)) > max_chars:
            raise DataError(f"{where}, line {number}: a sentence of {max(len(s), len(t))} characters exceeds "
                            f"cleaning.max_chars={max_chars}; remove it or raise the limit")


# --------------------------------------------------------------------------------------------
# Lengths in subwords: only sentences the model can take reach training, decoding and analyses


def overlong_pairs(src_ids: list[list[int]], tgt_ids: list[list[int]], max_len: int) -> list[tuple[int, str, int]]:
    """(index, side, subwords) of the pairs with a side longer than a model of `max_len` takes."""
    over = []
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        for side, ids in (("source", s), ("target", t)):
            if positions(len(ids)) > max_len:
                over.append((i, side, len(ids)))
                break
    return over


def fit_training_corpus(in_src: str, in_tgt: str, in_stats: dict, src_spm: str, tgt_spm: str, max_len: int,
                        out_src: str, out_tgt: str, log=print) -> dict:
    """Drop the cleaned training pairs that are longer than model.max_len in subwords (a sentence
    under cleaning.max_chars can still be: a long unspaced line splits into many pieces) and
    write the rest unchanged. Returns `in_stats` with the final pair count and the drop count."""
    from .subwords import open_tokenizer

    src, tgt = read_lines(in_src), read_lines(in_tgt)
    over = overlong_pairs(open_tokenizer(src_spm, "source").encode(src), open_tokenizer(tgt_spm, "target").encode(tgt),
                          max_len)
    for i, side, n in over[:5]:
        log(f"dropping training pair {i + 1} of {in_src}: its {side} is {n} subwords, "
            f"model.max_len={max_len} takes {max_len - 1}")
    dropped = {i for i, _, _ in over}
    if len(dropped) == len(src):
        raise DataError(f"{in_src}: every training pair is longer than model.max_len={max_len} subwords; "
                        f"raise model.max_len")
    log(f"{len(dropped)} of {len(src)} training pairs dropped as longer than model.max_len={max_len} subwords")
    write_lines(out_src, (s for i, s in enumerate(src) if i not in dropped))
    write_lines(out_tgt, (t for i, t in enumerate(tgt) if i not in dropped))
    return {**in_stats, "pairs": len(src) - len(dropped),
            "too_long_subwords": {"max_len": max_len, "dropped": len(dropped)}}


def check_evaluation_lengths(src: list[str], tgt: list[str], src_spm: str, tgt_spm: str, max_len: int,
                             where: str) -> None:
    """Evaluation sets are not filtered, and not truncated either: a score must cover every line
    of the published set as published. A line the model cannot take is an error, before any job
    that decodes or analyses it."""
    from .subwords import open_tokenizer

    over = overlong_pairs(open_tokenizer(src_spm, "source").encode(src), open_tokenizer(tgt_spm, "target").encode(tgt),
                          max_len)
    if over:
        i, side, n = over[0]
        more = f" ({len(over) - 1} more lines like it)" if len(over) > 1 else ""
        raise DataError(
            f"{where}, line {i + 1}: the {side} sentence is {n} subwords long, and a model with "
            f"model.max_len={max_len} takes at most {max_len - 1} (one position goes to BOS/EOS){more}. "
            f"Evaluation sets are neither filtered nor truncated: raise model.max_len, or remove line {i + 1} "
            f"from both sides of the set."
        )



# --------------------------------------------------------------------------------------------
# The data stage: read, check, clean, subsample, normalise, write


def prepare_training_corpus(
    corpora: list[tuple[dict, dict]],
    cfg: CleaningConfig,
    lowercase: bool,
    max_pairs: int | None,
    seed: int,
    out_src: str,
    out_tgt: str,
    log=print,
) -> dict:
    """Clean and concatenate the training corpora (each a (src side, tgt side)); write both sides.

    Every corpus is read and checked before anything is written. Returns the statistics.
    """
    stats: dict = {"corpora": []}
    src_all, tgt_all = [], []
    for src_side, tgt_side in corpora:
        src, tgt = read_parallel(src_side, tgt_side)
        keep, dropped = clean_pairs(src, tgt, cfg)
        stats["corpora"].append({"src": str(src_side["file"]), "tgt": str(tgt_side["file"]), "pairs": len(src),
                                 "kept": len(keep), "dropped": dropped})
        log(f"{src_side['file']}: {len(src)} pairs, kept {len(keep)}; dropped "
            + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in dropped.items()))
        src_all += [src[i] for i in keep]
        tgt_all += [tgt[i] for i in keep]
    if not src_all:
        raise DataError("no training pair survived cleaning: check the corpora and the 'cleaning' settings")
    if max_pairs is not None and len(src_all) > max_pairs:
        chosen = sorted(random.Random(seed).sample(range(len(src_all)), max_pairs))
        src_all, tgt_all = [src_all[i] for i in chosen], [tgt_all[i] for i in chosen]
        log(f"subsampled {max_pairs} training pairs (seed {seed})")
    stats["pairs"] = len(src_all)
    write_lines(out_src, (normalise_line(s, lowercase) for s in src_all))
    write_lines(out_tgt, (normalise_line(t, lowercase) for t in tgt_all))
    return stats


def prepare_evaluation_set(src_side: dict, tgt_side: dict, max_chars: int, lowercase: bool,
                           out_src: str, out_tgt: str, subwords: tuple[str, str, int] | None = None) -> dict:
    """Check a dev or test set and write it: the source normalised like the training data,
    the reference as published (whitespace tidied) so that scores compare with others'.

    With `subwords` (the source and target BPE models and model.max_len), a line longer than the
    model takes is refused too (check_evaluation_lengths)."""
    src, tgt = read_parallel(src_side, tgt_side)
    where = f"{src_side['file']} / {tgt_side['file']}"
    check_evaluation_pairs(src, tgt, max_chars, where)
    src = [normalise_line(s, lowercase) for s in src]
    tgt = [" ".join(t.split()) for t in tgt]
    if subwords is not None:
        check_evaluation_lengths(src, tgt, *subwords, where)
    write_lines(out_src, src)
    write_lines(out_tgt, tgt)
    return {"pairs": len(src)}
