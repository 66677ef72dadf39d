"""Fetching, reading, validation and cleaning of corpora; batching."""

import gzip
import hashlib
import io
import tarfile
import zipfile

import pytest
from conftest import write_gz

from headcount.data.batching import make_batches, source_tensor, target_tensors
from headcount.data.corpora import (
    CleaningConfig,
    clean_pairs,
    fetch_source,
    prepare_evaluation_set,
    prepare_training_corpus,
    read_parallel,
    read_text_lines,
)
from headcount.data.subwords import SPECIAL_IDS
from headcount.io import DataError, read_lines


def test_reads_plain_and_gzip_text_alike(tmp_path):
    lines = ["Ein Hund läuft.", "Zwei Katzen\tschlafen.", ""]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_gz(tmp_path / "a.gz", lines)
    assert read_text_lines(tmp_path / "a.txt") == lines
    assert read_text_lines(tmp_path / "a.gz") == lines


def test_tsv_column_and_archive_members(tmp_path):
    tsv = tmp_path / "c.tsv.gz"
    write_gz(tsv, ["hello\thallo", "cat\tKatze"])
    assert read_text_lines(tsv, column=1) == ["hallo", "Katze"]
    with pytest.raises(DataError, match="line 1: has 2 tab-separated fields, column 2"):
        read_text_lines(tsv, column=2)

    payload = b"one\ntwo\n"
    with tarfile.open(tmp_path / "a.tgz", "w:gz") as archive:
        info = tarfile.TarInfo("dir/x.en")
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.writestr("x.en", payload)
    assert read_text_lines(tmp_path / "a.tgz", member="dir/x.en") == ["one", "two"]
    assert read_text_lines(tmp_path / "a.zip", member="x.en") == ["one", "two"]
    with pytest.raises(DataError, match="no member 'y.en'"):
        read_text_lines(tmp_path / "a.zip", member="y.en")


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.de"
    path.write_bytes(b"gut\nauch gut\n" + b"schlecht \xe4\n")
    with pytest.raises(DataError, match=r"bad.de, line 3: not valid UTF-8 \(byte 0xe4 at column 10\)"):
        read_text_lines(path)


def test_sides_of_different_length_are_refused(tmp_path):
    (tmp_path / "x.en").write_text("a\nb\nc\n")
    (tmp_path / "x.de").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"x.en has 3 lines but .*x.de has 2.*line 3 is the first"):
        read_parallel({"file": tmp_path / "x.en"}, {"file": tmp_path / "x.de"})


def test_empty_corpus_is_refused(tmp_path):
    (tmp_path / "x.en").write_text("")
    (tmp_path / "x.de").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_parallel({"file": tmp_path / "x.en"}, {"file": tmp_path / "x.de"})


def test_cleaning_counts_each_reason():
    src = ["a b c", "", "x " * 300, "one two three", "a b c d e f g h i j", "fine here", "   "]
    tgt = ["d e f", "leer", "y", "eins", "a b c", "gut hier", "nix"]
    keep, dropped = clean_pairs(src, tgt, CleaningConfig(max_words=250, max_chars=1000, max_ratio=3.0))
    # 1 and 6: empty; 2: too long; 4: ratio 10/3 > 3; 3: ratio 3/1 but the short side is under 3 words
    assert keep == [0, 3, 5]
    assert dropped == {"empty": 2, "too_long": 1, "length_ratio": 1}


def test_a_sentence_of_100000_characters_is_dropped_from_training_and_refused_in_evaluation(tmp_path):
    long = "x" * 100_000
    src, tgt = tmp_path / "t.en", tmp_path / "t.de"
    src.write_text(f"short one\n{long}\n")
    tgt.write_text("kurz eins\nlang\n")
    stats = prepare_training_corpus([({"file": src}, {"file": tgt})], CleaningConfig(), False, None, 1,
                                    str(tmp_path / "o.en"), str(tmp_path / "o.de"), log=lambda m: None)
    assert stats["corpora"][0]["dropped"]["too_long"] == 1
    assert read_lines(tmp_path / "o.en") == ["short one"]
    with pytest.raises(DataError, match=r"line 2: a sentence of 100000 characters"):
        prepare_evaluation_set({"file": src}, {"file": tgt}, 1500, False,
                               str(tmp_path / "e.en"), str(tmp_path / "e.de"))
    assert not (tmp_path / "e.en").exists()  # nothing half-written


def test_training_corpus_subsampling_and_lowercasing(tmp_path):
    src, tgt = tmp_path / "t.en", tmp_path / "t.de"
    src.write_text("".join(f"Sentence  {i}\n" for i in range(50)))
    tgt.write_text("".join(f"Satz {i}\n" for i in range(50)))
    args = ([({"file": src}, {"file": tgt})], CleaningConfig(min_words_for_ratio=1), True, 10, 7)
    prepare_training_corpus(*args, str(tmp_path / "a.en"), str(tmp_path / "a.de"), log=lambda m: None)
    prepare_training_corpus(*args, str(tmp_path / "b.en"), str(tmp_path / "b.de"), log=lambda m: None)
    a_en, a_de = read_lines(tmp_path / "a.en"), read_lines(tmp_path / "a.de")
    assert len(a_en) == 10 and a_en == read_lines(tmp_path / "b.en")  # same seed, same sample
    assert all(e.split()[1] == d.split()[1] for e, d in zip(a_en, a_de))  # still aligned
    assert a_en[0].startswith("sentence ")  # lowercased, whitespace normalised


def test_fetch_from_mirror_checks_the_checksum(tmp_path):
    mirror = tmp_path / "mirror"
    write_gz(mirror / "c/train.en.gz", ["hello"])
    digest = hashlib.sha256((mirror / "c/train.en.gz").read_bytes()).hexdigest()
    dest = tmp_path / "out/c/train.en.gz"
    fetch_source("https://example.org/x", "c/train.en.gz", dest, mirror=mirror, sha256=digest, log=lambda m: None)
    assert read_text_lines(dest) == ["hello"]
    dest.unlink()
    with pytest.raises(DataError, match="sha256 .* does not match"):
        fetch_source(None, "c/train.en.gz", dest, mirror=mirror, sha256="0" * 64, log=lambda m: None)
    assert not dest.exists()
    with pytest.raises(DataError, match=r"not found in the data mirror .*Put the file 'c/missing.gz' there"):
        fetch_source("https://example.org/y", "c/missing.gz", dest, mirror=mirror, log=lambda m: None)


def test_download_gzips_plain_text_for_a_gz_path(tmp_path):
    plain = tmp_path / "served.txt"
    plain.write_text("eins\nzwei\n")
    dest = tmp_path / "got/x.de.gz"
    fetch_source(plain.as_uri(), "x.de.gz", dest, log=lambda m: None)
    assert gzip.decompress(dest.read_bytes()) == b"eins\nzwei\n"


@pytest.mark.slow
def test_unreachable_url_without_mirror_fails_clearly(tmp_path):
    dest = tmp_path / "x.gz"
    with pytest.raises(DataError, match=r"could not download http://127.0.0.1:9/x.gz.*set a data mirror"):
        fetch_source("http://127.0.0.1:9/x.gz", "x.gz", dest, retries=1, timeout=2, log=lambda m: None)
    assert not dest.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("max_tokens", [8, 30, 100])
def test_batches_cover_every_sentence_once_within_the_budget(max_tokens):
    import random

    rng = random.Random(0)
    src_lens = [rng.randint(1, 8) for _ in range(300)]
    tgt_lens = [rng.randint(1, 8) for _ in range(300)]
    batches = make_batches(src_lens, tgt_lens, max_tokens, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for b in batches:
        longest = max(max(src_lens[i], tgt_lens[i]) for i in b)
        assert longest * len(b) <= max_tokens or len(b) == 1
    assert batches == make_batches(src_lens, tgt_lens, max_tokens, seed=3)
    assert batches != make_batches(src_lens, tgt_lens, max_tokens, seed=4)
    # Bucketing keeps padding low: far below what random batches of the same sizes would have.
    padded = sum(max(src_lens[i] for i in b) * len(b) for b in batches)
    assert padded < 1.3 * sum(src_lens)


def test_batches_group_pairs_by_the_longer_side_the_budget_counts():
    """Short sources with alternately long and short targets: sorted by the longer side, the 50
    pairs whose longer side is 30 share batches of 4 (13 batches) and the 50 of at most 5 fill two
    (30 of at most 3, 20 of 4 and 5); sorted by the source, every batch would hold a 30 and at most
    4 pairs (20 batches)."""
    src_lens = [1 + k % 5 for k in range(100)]
    tgt_lens = [30 if k % 2 else 1 + k % 5 for k in range(100)]
    batches = make_batches(src_lens, tgt_lens, 120, seed=0, pool_batches=1000)
    assert sorted(i for b in batches for i in b) == list(range(100))
    assert len(batches) == 13 + 2
    for b in batches:
        assert len({tgt_lens[i] == 30 for i in b}) == 1  # never long and short pairs in one batch


def test_tensors_add_eos_and_bos():
    src = source_tensor([[5, 6], [7]], SPECIAL_IDS)
    tgt_in, tgt_out = target_tensors([[8, 9, 10]], SPECIAL_IDS)
    assert src.tolist() == [[5, 6, 3], [7, 3, 0]]
    assert tgt_in.tolist() == [[2, 8, 9, 10]] and tgt_out.tolist() == [[8, 9, 10, 3]]


# --------------------------------------------------------------------------------------------
# Lengths in subwords


def unspaced_line(chars: int, seed: int) -> str:
    """A long line without spaces (a URL list, a table dump): one 'word', hundreds of subwords."""
    import random

    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789/.-") for _ in range(chars))


def test_the_length_limit_in_subwords_is_the_models_own():
    """overlong_pairs and the model agree on where the limit lies (BOS/EOS take a position)."""
    import torch
    from conftest import tiny_config

    from headcount.data.corpora import overlong_pairs
    from headcount.models.transformer import Transformer

    model = Transformer(tiny_config(max_len=12)).eval()
    fits, too_long = [5] * 11, [5] * 12
    assert overlong_pairs([fits, too_long, fits], [fits, fits, too_long], max_len=12) == [
        (1, "source", 12), (2, "target", 12)]
    with torch.no_grad():
        for ids in (fits, too_long):
            src = source_tensor([ids], SPECIAL_IDS)
            tgt_in, _ = target_tensors([ids], SPECIAL_IDS)
            if ids is fits:
                model.decode(tgt_in, *model.encode(src)[:2])
            else:
                with pytest.raises(ValueError, match="exceeds model.max_len=12"):
                    model.encode(src)
                with pytest.raises(ValueError, match="exceeds model.max_len=12"):
                    model.decode(tgt_in, *model.encode(source_tensor([fits], SPECIAL_IDS))[:2])


def test_a_training_pair_too_long_in_subwords_is_dropped_and_counted(tmp_path):
    """A 1,400-character unspaced line passes cleaning (under max_chars) but not the model's
    max_len in subwords: the fit step after the BPE models drops it and counts it; the rest of
    the text is written byte for byte as cleaned."""
    from conftest import toy_corpus

    from headcount.data.corpora import fit_training_corpus
    from headcount.data.subwords import Segmenter, train_bpe

    src, tgt = toy_corpus(300, seed=5)
    src[100] = unspaced_line(1400, seed=1)
    tgt[200] = unspaced_line(1400, seed=2)  # a long target, its source short
    write_gz(tmp_path / "t.en.gz", src)
    write_gz(tmp_path / "t.de.gz", tgt)
    cleaned = {side: tmp_path / f"cleaned.{side}.txt" for side in ("src", "tgt")}
    stats = prepare_training_corpus([({"file": tmp_path / "t.en.gz"}, {"file": tmp_path / "t.de.gz"})],
                                    CleaningConfig(), False, None, 1, cleaned["src"], cleaned["tgt"],
                                    log=lambda m: None)
    assert stats["pairs"] == 300  # cleaning keeps both: one word, 1,400 characters
    for side in ("src", "tgt"):
        train_bpe(cleaned[side], tmp_path / f"{side}.model", vocab_size=80)
    src_tok, tgt_tok = Segmenter(tmp_path / "src.model"), Segmenter(tmp_path / "tgt.model")
    messages = []
    fitted = fit_training_corpus(cleaned["src"], cleaned["tgt"], stats, src_tok, tgt_tok, 64, tmp_path / "train.src",
                                 tmp_path / "train.tgt", log=messages.append)
    assert fitted["too_long_subwords"] == {"max_len": 64, "dropped": 2}
    assert fitted["pairs"] == 298 and fitted["corpora"] == stats["corpora"]  # cleaning's counts kept
    assert "dropping training pair 101 of" in messages[0] and "its source is" in messages[0]
    kept_src, kept_tgt = read_lines(tmp_path / "train.src"), read_lines(tmp_path / "train.tgt")
    assert kept_src == [s for i, s in enumerate(src) if i not in (100, 200)]
    assert kept_tgt == [t for i, t in enumerate(tgt) if i not in (100, 200)]
    # Encoded a few pairs at a time (as a corpus of millions is), the same drops, messages and bytes.
    chunked = []
    assert fit_training_corpus(cleaned["src"], cleaned["tgt"], stats, src_tok, tgt_tok, 64, tmp_path / "chunked.src",
                               tmp_path / "chunked.tgt", log=chunked.append, chunk_lines=7) == fitted
    assert chunked == messages
    for side in ("src", "tgt"):
        assert (tmp_path / f"chunked.{side}").read_bytes() == (tmp_path / f"train.{side}").read_bytes()
    longest = max(len(ids) for seg, lines in (("src", kept_src), ("tgt", kept_tgt))
                  for ids in Segmenter(tmp_path / f"{seg}.model").encode(lines))
    assert longest <= 63

    # Without over-long pairs the step changes nothing: the same bytes, the same pair count.
    fitted = fit_training_corpus(tmp_path / "train.src", tmp_path / "train.tgt", {"pairs": 298},
                                 src_tok, tgt_tok, 64, tmp_path / "again.src",
                                 tmp_path / "again.tgt", log=lambda m: None)
    assert fitted == {"pairs": 298, "too_long_subwords": {"max_len": 64, "dropped": 0}}
    for side in ("src", "tgt"):
        assert (tmp_path / f"again.{side}").read_bytes() == (tmp_path / f"train.{side}").read_bytes()


def test_an_evaluation_line_too_long_in_subwords_is_refused_at_preparation(tmp_path):
    from conftest import toy_corpus

    from headcount.data.subwords import Segmenter, train_bpe

    src, tgt = toy_corpus(300, seed=6)
    for side, lines in (("src", src), ("tgt", tgt)):
        (tmp_path / f"train.{side}").write_text("\n".join(lines) + "\n")
        train_bpe(tmp_path / f"train.{side}", tmp_path / f"{side}.model", vocab_size=80)
    subwords = (Segmenter(tmp_path / "src.model"), Segmenter(tmp_path / "tgt.model"), 64)
    test_src, test_tgt = src[:20], tgt[:20]
    write_gz(tmp_path / "test.en.gz", test_src)
    write_gz(tmp_path / "test.de.gz", test_tgt)
    sides = ({"file": tmp_path / "test.en.gz"}, {"file": tmp_path / "test.de.gz"})
    out = (str(tmp_path / "test.src"), str(tmp_path / "test.tgt"))
    assert prepare_evaluation_set(*sides, 1500, False, *out, subwords=subwords) == {"pairs": 20}
    assert read_lines(out[0]) == test_src  # a set that fits is written as before
    (tmp_path / "test.src").unlink()
    (tmp_path / "test.tgt").unlink()

    test_src[7] = unspaced_line(1400, seed=3)
    write_gz(tmp_path / "test.en.gz", test_src)
    with pytest.raises(DataError, match=r"test.en.gz / .*test.de.gz, line 8: the source sentence is \d+ subwords "
                                        r"long.*model.max_len=64 takes at most 63.*raise model.max_len, or remove "
                                        r"line 8 from both sides"):
        prepare_evaluation_set(*sides, 1500, False, *out, subwords=subwords)
    assert not (tmp_path / "test.src").exists() and not (tmp_path / "test.tgt").exists()


def _prepare_as_lists(corpora, cfg, lowercase, max_pairs, seed, out_src, out_tgt):
    """prepare_training_corpus as it was before it streamed: whole files as lists (the reference)."""
    import random

    from headcount.data.corpora import normalise_line
    from headcount.io import write_lines

    def read(path):  # whole files, split at b"\n" (read_text_lines streams now)
        data = path.read_bytes()
        lines = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).split(b"\n")
        return [line.decode().rstrip("\r") for line in (lines[:-1] if lines[-1] == b"" else lines)]

    src_all, tgt_all, kept = [], [], []
    for src_side, tgt_side in corpora:
        src, tgt = read(src_side["file"]), read(tgt_side["file"])
        keep, dropped = clean_pairs(src, tgt, cfg)
        kept.append((len(src), len(keep), dropped))
        src_all += [src[i] for i in keep]
        tgt_all += [tgt[i] for i in keep]
    if max_pairs is not None and len(src_all) > max_pairs:
        chosen = sorted(random.Random(seed).sample(range(len(src_all)), max_pairs))
        src_all, tgt_all = [src_all[i] for i in chosen], [tgt_all[i] for i in chosen]
    write_lines(out_src, (normalise_line(s, lowercase) for s in src_all))
    write_lines(out_tgt, (normalise_line(t, lowercase) for t in tgt_all))
    return kept


@pytest.mark.parametrize("max_pairs", [None, 40])
def test_streaming_preparation_writes_the_bytes_the_list_path_wrote(tmp_path, max_pairs):
    """Dirty lines (empty sides, CRLF, tabs, runs of spaces, a non-breaking space, over-long and
    unbalanced pairs, no final newline), a gzipped and a plain corpus, subsampling or not."""
    from conftest import toy_corpus

    src, tgt = toy_corpus(60, seed=9)
    src[3], tgt[5], src[7] = "", "   ", "a " * 300
    src[9], tgt[9] = "one two three four five six seven eight nine ten", "eins zwei drei"
    src[11], tgt[12] = "Tab\there\r", "Viele   Leer\u00a0zeichen\r"
    write_gz(tmp_path / "a.en.gz", src)
    write_gz(tmp_path / "a.de.gz", tgt)
    (tmp_path / "b.en").write_bytes(b"Second corpus\r\nLast line, no newline")
    (tmp_path / "b.de").write_bytes(b"Zweites Korpus\r\nLetzte Zeile")
    corpora = [({"file": tmp_path / "a.en.gz"}, {"file": tmp_path / "a.de.gz"}),
               ({"file": tmp_path / "b.en"}, {"file": tmp_path / "b.de"})]
    cfg = CleaningConfig(max_chars=400)
    stats = prepare_training_corpus(corpora, cfg, True, max_pairs, 5, tmp_path / "new.en", tmp_path / "new.de",
                                    log=lambda m: None)
    kept = _prepare_as_lists(corpora, cfg, True, max_pairs, 5, tmp_path / "old.en", tmp_path / "old.de")
    for side in ("en", "de"):
        assert (tmp_path / f"new.{side}").read_bytes() == (tmp_path / f"old.{side}").read_bytes()
    assert [(c["pairs"], c["kept"], c["dropped"]) for c in stats["corpora"]] == kept
    assert kept[0][1] == 56 and stats["pairs"] == (max_pairs or 58)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_streaming_preparation_names_the_bad_file_and_line_and_writes_nothing(tmp_path):
    (tmp_path / "x.en").write_text("a\nb\nc\nd\ne\n")
    (tmp_path / "x.de").write_text("a\nb\n")
    out = (tmp_path / "o.en", tmp_path / "o.de")
    args = (CleaningConfig(), False, None, 1, *out)
    with pytest.raises(DataError, match=r"x.en has 5 lines but .*x.de has 2.*line 3 is the first"):
        prepare_training_corpus([({"file": tmp_path / "x.en"}, {"file": tmp_path / "x.de"})], *args)
    (tmp_path / "x.de").write_bytes(b"a\nb\nschlecht \xe4\n")
    with pytest.raises(DataError, match=r"x.de, line 3: not valid UTF-8 \(byte 0xe4 at column 10\)"):
        prepare_training_corpus([({"file": tmp_path / "x.en"}, {"file": tmp_path / "x.de"})], *args,
                                log=lambda m: None)
    write_gz(tmp_path / "y.en.gz", ["a"])
    (tmp_path / "y.de.gz").write_bytes(gzip.compress(b"a\n")[:-6])  # truncated
    with pytest.raises(DataError, match=r"y.de.gz: corrupt gzip data"):
        prepare_training_corpus([({"file": tmp_path / "y.en.gz"}, {"file": tmp_path / "y.de.gz"})], *args,
                                log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.de", "x.en", "y.de.gz", "y.en.gz"]
