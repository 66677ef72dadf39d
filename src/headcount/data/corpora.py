"""Corpora: fetching (URL or local mirror), reading with validation, cleaning.

A *source* is one text file of one language, described by where it lives on the web (`url`),
where it lies under a mirror directory (`path`, the layout of a data mirror such as
../shared/data), and optionally an archive `member` and a TSV `column` to take from it.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import os
import random
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from headcount.data.special import positions
from headcount.io import DataError, atomic_path, iter_lines, read_lines, sha256_file, write_lines

if TYPE_CHECKING:
    from headcount.data.special import Tokenizer

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


def _open_raw(path: Path, member: str | None):
    """A binary stream of a file, or of one member of a .tar(.gz)/.tgz/.zip archive, and whether
    it is gzip data (to be read through gzip). Nothing is read whole: a corpus of millions of lines
    passes through in blocks."""
    if member is not None:
        if zipfile.is_zipfile(path):
            archive = zipfile.ZipFile(path)
            try:
                stream = archive.open(member)
            except KeyError:
                archive.close()
                raise DataError(f"{path}: archive has no member '{member}'; fix 'member' in the source") from None
        elif tarfile.is_tarfile(path):
            archive = tarfile.open(path)
            try:
                stream = archive.extractfile(member)
                if stream is None:
                    raise KeyError(member)
            except KeyError:
                archive.close()
                raise DataError(f"{path}: archive has no member '{member}'; fix 'member' in the source") from None
        else:
            raise DataError(f"{path}: 'member' is set to '{member}' but the file is not a tar or zip archive")
        closers = [stream, archive]
    else:
        stream = open(path, "rb")
        closers = [stream]
    head = stream.peek(2)[:2]
    if member is None and path.name.endswith(".gz") and head != GZIP_MAGIC:
        for c in closers:
            c.close()
        raise DataError(_not_gzip(path, path, "delete it so that it is fetched again, or fix its source"))
    return stream, closers, head == GZIP_MAGIC


def _raw_lines(path: Path, member: str | None):
    """The lines of a file (or archive member) as bytes without their b"\n", gunzipped; split at
    b"\n" only, as bytes.split would (a final newline ends the last line, it does not start one)."""
    stream, closers, gzipped = _open_raw(path, member)
    try:
        if gzipped:
            stream = gzip.GzipFile(fileobj=stream, mode="rb")
            closers.insert(0, stream)
        try:
            for raw in stream:
                yield raw[:-1] if raw.endswith(b"\n") else raw
        except (OSError, EOFError, zlib.error) as error:
            if not gzipped:
                raise
            raise DataError(f"{path}: corrupt gzip data ({error}); fetch the file again") from None
    finally:
        for c in closers:
            c.close()


def iter_text_lines(path: str | os.PathLike, member: str | None = None, column: int | None = None):
    """Lines of a UTF-8 text (optionally one TSV column), one at a time, with errors naming file
    and line: a 6M-pair corpus is never held whole."""
    path = Path(path)
    where = f"{path}:{member}" if member else str(path)
    for number, raw in enumerate(_raw_lines(path, member), start=1):
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
        yield line


def read_text_lines(path: str | os.PathLike, member: str | None = None, column: int | None = None) -> list[str]:
    """Lines of a UTF-8 text (optionally one TSV column), with errors naming file and line."""
    return list(iter_text_lines(path, member, column))


def iter_parallel(src: dict, tgt: dict):
    """Sentence pairs of a parallel corpus, one at a time; the checks of read_parallel (the sides
    align, the corpus is not empty) are made as the end is reached."""
    src_lines = iter_text_lines(src["file"], src.get("member"), src.get("column"))
    tgt_lines = iter_text_lines(tgt["file"], tgt.get("member"), tgt.get("column"))
    n = 0
    for s, t in itertools.zip_longest(src_lines, tgt_lines):
        if s is None or t is None:
            # One side ran out: count the rest of the other (still checking it) for the message.
            n_src = n + (s is not None) + sum(1 for _ in src_lines)
            n_tgt = n + (t is not None) + sum(1 for _ in tgt_lines)
            raise _misaligned(src, tgt, n_src, n_tgt)
        n += 1
        yield s, t
    if not n:
        raise _empty(src, tgt)


def _misaligned(src: dict, tgt: dict, n_src: int, n_tgt: int) -> DataError:
    return DataError(
        f"{src['file']} has {n_src} lines but {tgt['file']} has {n_tgt}: the two sides "
        f"of a parallel corpus must align line by line (line {min(n_src, n_tgt) + 1} "
        f"is the first without a partner). Fix or replace the files."
    )


def _empty(src: dict, tgt: dict) -> DataError:
    return DataError(f"{src['file']} and {tgt['file']} are empty: a corpus needs at least one sentence pair")


def read_parallel(src: dict, tgt: dict) -> tuple[list[str], list[str]]:
    """Read both sides of a parallel corpus; each side is {'file', 'member'?, 'column'?}."""
    src_lines = read_text_lines(src["file"], src.get("member"), src.get("column"))
    tgt_lines = read_text_lines(tgt["file"], tgt.get("member"), tgt.get("column"))
    if len(src_lines) != len(tgt_lines):
        raise _misaligned(src, tgt, len(src_lines), len(tgt_lines))
    if not src_lines:
        raise _empty(src, tgt)
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
        reason = drop_reason(s, t, cfg)
        if reason:
            dropped[reason] += 1
        else:
            keep.append(i)
    return keep, dropped


def drop_reason(s: str, t: str, cfg: CleaningConfig) -> str | None:
    """Why cleaning drops the pair (s, t): "empty", "too_long", "length_ratio"; None to keep it."""
    s, t = s.strip(), t.strip()
    if not s or not t:
        return "empty"
    ns, nt = len(s.split()), len(t.split())
    if max(ns, nt) > cfg.max_words or max(len(s), len(t)) > cfg.max_chars:
        return "too_long"
    if min(ns, nt) >= cfg.min_words_for_ratio and max(ns, nt) / min(ns, nt) > cfg.max_ratio:
        return "length_ratio"
    return None


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


def fit_training_corpus(in_src: str, in_tgt: str, in_stats: dict, src_tok: Tokenizer, tgt_tok: Tokenizer,
                        max_len: int, out_src: str, out_tgt: str, log=print, chunk_lines: int = 20_000) -> dict:
    """Drop the cleaned training pairs that are longer than model.max_len in subwords (a sentence
    under cleaning.max_chars can still be: a long unspaced line splits into many pieces) and
    write the rest unchanged. Returns `in_stats` with the final pair count and the drop count.

    The text is encoded `chunk_lines` pairs at a time and only the dropped indices are kept: the
    subwords of a 6M-pair corpus as Python lists would take tens of GB. `src_tok`, `tgt_tok`: the
    model's tokenizers (models.loading.open_tokenizer)."""
    over, n_src, chunk = [], 0, ([], [])

    def encode_chunk() -> None:
        start = n_src - len(chunk[0])
        over.extend((start + i, side, n) for i, side, n in
                    overlong_pairs(src_tok.encode(chunk[0]), tgt_tok.encode(chunk[1]), max_len))
        chunk[0].clear()
        chunk[1].clear()

    for s, t in itertools.zip_longest(iter_lines(in_src), iter_lines(in_tgt)):
        if s is None:
            continue  # sides of unequal length: pairs are the lines both have (zip), as before
        n_src += 1
        if t is None:
            continue
        chunk[0].append(s)
        chunk[1].append(t)
        if len(chunk[0]) >= chunk_lines:
            encode_chunk()
    if chunk[0]:
        encode_chunk()
    for i, side, n in over[:5]:
        log(f"dropping training pair {i + 1} of {in_src}: its {side} is {n} subwords, "
            f"model.max_len={max_len} takes {max_len - 1}")
    dropped = {i for i, _, _ in over}
    if len(dropped) == n_src:
        raise DataError(f"{in_src}: every training pair is longer than model.max_len={max_len} subwords; "
                        f"raise model.max_len")
    log(f"{len(dropped)} of {n_src} training pairs dropped as longer than model.max_len={max_len} subwords")
    write_lines(out_src, (s for i, s in enumerate(iter_lines(in_src)) if i not in dropped))
    write_lines(out_tgt, (t for i, t in enumerate(iter_lines(in_tgt)) if i not in dropped))
    return {**in_stats, "pairs": n_src - len(dropped),
            "too_long_subwords": {"max_len": max_len, "dropped": len(dropped)}}


def check_evaluation_lengths(src: list[str], tgt: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer,
                             max_len: int, where: str) -> None:
    """Evaluation sets are not filtered, and not truncated either: a score must cover every line
    of the published set as published. A line the model cannot take is an error, before any job
    that decodes or analyses it. `src_tok`, `tgt_tok`: the model's tokenizers."""
    over = overlong_pairs(src_tok.encode(src), tgt_tok.encode(tgt), max_len)
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

    Every corpus is read and checked before anything is written: the pairs stream through
    cleaning and normalisation into temporary files that become the outputs only once all is
    read (a 6M-pair corpus is never held in memory). Returns the statistics.
    """
    stats: dict = {"corpora": []}
    total = 0
    with atomic_path(out_src) as tmp_src, atomic_path(out_tgt) as tmp_tgt:
        with open(tmp_src, "w", encoding="utf-8") as fs, open(tmp_tgt, "w", encoding="utf-8") as ft:
            for src_side, tgt_side in corpora:
                pairs, kept, dropped = 0, 0, {"empty": 0, "too_long": 0, "length_ratio": 0}
                for s, t in iter_parallel(src_side, tgt_side):
                    pairs += 1
                    reason = drop_reason(s, t, cfg)
                    if reason:
                        dropped[reason] += 1
                        continue
                    kept += 1
                    fs.write(normalise_line(s, lowercase) + "\n")
                    ft.write(normalise_line(t, lowercase) + "\n")
                stats["corpora"].append({"src": str(src_side["file"]), "tgt": str(tgt_side["file"]),
                                         "pairs": pairs, "kept": kept, "dropped": dropped})
                log(f"{src_side['file']}: {pairs} pairs, kept {kept}; dropped "
                    + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in dropped.items()))
                total += kept
        if not total:
            raise DataError("no training pair survived cleaning: check the corpora and the 'cleaning' settings")
        if max_pairs is not None and total > max_pairs:
            # The same sample of kept-pair indices as when the pairs were lists (normalising a line
            # before or after choosing it is the same).
            chosen = sorted(random.Random(seed).sample(range(total), max_pairs))
            for tmp in (tmp_src, tmp_tgt):
                _keep_lines(tmp, chosen)
            log(f"subsampled {max_pairs} training pairs (seed {seed})")
            total = max_pairs
    stats["pairs"] = total
    return stats


def _keep_lines(path: Path, chosen: list[int]) -> None:
    """Rewrite `path` (normalised lines: no newline inside one) with only the lines at the sorted
    indices `chosen`."""
    kept = path.with_name(path.name + ".kept")
    try:
        with open(path, "rb") as src, open(kept, "wb") as dst:
            wanted = iter(chosen)
            next_index = next(wanted, None)
            for i, line in enumerate(src):
                if i == next_index:
                    dst.write(line)
                    next_index = next(wanted, None)
                    if next_index is None:
                        break
        os.replace(kept, path)
    finally:
        if kept.exists():
            kept.unlink()


def prepare_evaluation_set(src_side: dict, tgt_side: dict, max_chars: int, lowercase: bool, out_src: str,
                           out_tgt: str, subwords: tuple[Tokenizer, Tokenizer, int] | None = None) -> dict:
    """Check a dev or test set and write it: the source normalised like the training data,
    the reference as published (whitespace tidied) so that scores compare with others'.

    With `subwords` (the model's source and target tokenizers and model.max_len), a line longer than the
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


def pool_evaluation_sets(members: list[tuple[str, str, str]], out_src: str, out_tgt: str, out_members: str) -> dict:
    """A pooled test set: each member's prepared (name, source file, reference file) one after
    another, and a table of which lines each member holds (name, first line, lines), so that a
    score on the pool can still be split by set."""
    src, tgt, rows = [], [], ["name\tfirst\tlines"]
    for name, src_path, tgt_path in members:
        s, t = read_lines(src_path), read_lines(tgt_path)
        if len(s) != len(t):
            raise DataError(f"{src_path} has {len(s)} lines and {tgt_path} {len(t)}: the prepared test set {name} "
                            f"is incomplete; delete both and rerun")
        rows.append(f"{name}\t{len(src)}\t{len(s)}")
        src += s
        tgt += t
    write_lines(out_src, src)
    write_lines(out_tgt, tgt)
    write_lines(out_members, rows)
    return {"pairs": len(src), "members": len(members)}
