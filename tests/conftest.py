"""Shared fixtures: tiny models and a tiny synthetic parallel corpus the tests make themselves."""

import gzip
import importlib.util
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# `make test` runs two pytest-xdist workers on 2 cores. A workflow test whose jobs each took both
# cores would put four OpenMP threads on two cores, and their spin-waiting slowed a toy baseline
# 4x (5,000 against 23,000 tokens/s). So each worker's workflows and tools get one core; set
# HEADCOUNT_TEST_CORES to override.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("HEADCOUNT_TEST_CORES", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import toyflow  # noqa: E402

from headcount.models.transformer import ModelConfig, Transformer  # noqa: E402

torch.set_num_threads(1)  # tests are small; keep the second core for the workflow tests' jobs


# `make test` runs pytest-xdist workers (two on 2 cores). Each test file goes to one worker whole (its module
# fixtures are built once), and the files whose tests read the smoke run go to one worker
# together, so that its two-minute run happens once. xdist's own `xdist_group` cannot say this:
# its loadgroup mode does not group on pytest 9.2 (pytest-xdist issue 1386).
SMOKE_RUN_FILES = {"test_atlas.py", "test_rerun.py", "test_workflow.py"}


# The work units that take a worker longest, longest first (`--durations=0` of `make test` on an AVX2
# EPYC; benchmarks/RESULTS.md), sent to the workers before the rest: xdist's own order (most tests
# first) started some of them last, and the suite ended with one worker idle while the other ran them.
SLOWEST_UNITS = ("smoke_run", "tests/test_real_weights.py", "tests/test_lm_workflow.py",
                 "tests/test_untrusted_inputs.py", "tests/test_pretrained_workflow.py", "tests/test_pruning.py",
                 "tests/test_train.py",
                 "tests/test_prune_to_target.py", "tests/test_sentence_encoder.py", "tests/test_trained_marian.py")


def pytest_collection_modifyitems(items):
    """A test that reads the smoke run outside SMOKE_RUN_FILES would rerun it on the other worker.
    The slowest work units go first (SLOWEST_UNITS; the rest keep their order)."""
    stray = [item.nodeid for item in items
             if "smoke_run" in getattr(item, "fixturenames", ()) and item.path.name not in SMOKE_RUN_FILES]
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)} read(s) the smoke run: add the file to SMOKE_RUN_FILES in "
                                "tests/conftest.py so that pytest-xdist keeps it on the smoke run's worker")
    items.sort(key=lambda item: unit_rank(work_unit(item.nodeid)))  # stable: a unit's own order is kept


def unit_rank(unit: str) -> int:
    """Where a work unit goes in the queue: SLOWEST_UNITS by position, every other unit after them."""
    return SLOWEST_UNITS.index(unit) if unit in SLOWEST_UNITS else len(SLOWEST_UNITS)


def work_unit(nodeid: str) -> str:
    """The unit of work a worker takes: a test file, or all of the smoke run's files together."""
    path = nodeid.split("::", 1)[0]
    return "smoke_run" if Path(path).name in SMOKE_RUN_FILES else path


if importlib.util.find_spec("xdist"):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "load":  # -n without --dist; an explicit --dist is left alone
            config.option.loadscopereorder = False  # the collection's order (slowest first), not test counts
            return ByFile(config, log)


# A toy language pair: each source word has one target word; the target reverses adjective-noun
# order, so a model must look beyond the aligned position to translate.
SRC_WORDS = "cat dog bird fish horse cow sheep goat mouse frog big small red blue old young".split()
TGT_WORDS = "katze hund vogel fisch pferd kuh schaf ziege maus frosch gross klein rot blau alt jung".split()
LEXICON = dict(zip(SRC_WORDS, TGT_WORDS))
NOUNS, ADJECTIVES = SRC_WORDS[:10], SRC_WORDS[10:]


def load_script(path: Path, name: str | None = None):
    """A script of the repository (benchmarks/, tools/), which is no package, as a module."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toy_pair(rng: random.Random) -> tuple[str, str]:
    src, tgt = [], []
    for _ in range(rng.randint(1, 4)):
        noun = rng.choice(NOUNS)
        if rng.random() < 0.5:
            adj = rng.choice(ADJECTIVES)
            src += [adj, noun]
            tgt += [LEXICON[noun], LEXICON[adj]]
        else:
            src.append(noun)
            tgt.append(LEXICON[noun])
    return " ".join(src).capitalize() + ".", " ".join(tgt).capitalize() + "."


def toy_corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    pairs = [toy_pair(rng) for _ in range(n)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def write_gz(path: Path, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def toy_conllu(sentences: list[str]) -> str:
    """Toy source sentences as a CoNLL-U treebank: the first noun is the root, an adjective
    depends on the noun after it (amod), other nouns on the root (conj), the full stop (punct)."""
    blocks = []
    for number, sentence in enumerate(sentences, start=1):
        words = sentence.rstrip(".").split() + ["."]
        nouns = [i for i, w in enumerate(words) if w.lower() in NOUNS]
        root = nouns[0]
        lines = [f"# sent_id = toy-{number}", f"# text = {sentence}"]
        for i, word in enumerate(words):
            if i == root:
                head, rel = 0, "root"
            elif word == ".":
                head, rel = root + 1, "punct"
            elif word.lower() in ADJECTIVES:
                head, rel = i + 2, "amod"
            else:
                head, rel = root + 1, "conj"
            space = "SpaceAfter=No" if i + 1 < len(words) and words[i + 1] == "." else "_"
            lines.append(f"{i + 1}\t{word}\t{word.lower()}\tX\t_\t_\t{head}\t{rel}\t_\t{space}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


@pytest.fixture
def toy_mirror(tmp_path) -> Path:
    return make_toy_mirror(tmp_path)


@dataclass
class ToyRun:
    workdir: Path  # a copy of the workflow, with results/toy in it
    config: dict
    result: subprocess.CompletedProcess

    @property
    def results(self) -> Path:
        return self.workdir / "results/toy"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> ToyRun:
    """The smoke config run once to the end in a copy of the workflow; tests read it, plan
    reruns in it (dry runs only) and compare other runs with it."""
    root = tmp_path_factory.mktemp("smoke")
    workdir = toyflow.copy_workflow(root / "wf")
    config = toyflow.smoke_config(make_toy_mirror(root))
    config_path = toyflow.write_config(workdir / "smoke.yaml", config)
    result = toyflow.snakemake("--cores", toyflow.CORES, "--configfile", config_path, cwd=workdir,
                               snakefile=workdir / "Snakefile", timeout=900)
    return ToyRun(workdir, config, result)


@pytest.fixture(scope="session")
def lines() -> list[str]:
    """Toy text, both sides of 120 pairs: what the tiny transformers language models of
    test_hf_lm and test_head_access are trained and tokenised on (a module may define its own)."""
    src, tgt = toy_corpus(120, seed=5)
    return src + tgt


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, lines) -> dict:
    """family -> a directory holding a tiny transformers language model of it (test_hf_lm.FAMILIES),
    written once per worker (5 s for the eight) and only read by the tests."""
    from test_hf_lm import FAMILIES, _write

    return {family: _write(family, tmp_path_factory.mktemp(family), lines) for family in FAMILIES}


def make_toy_mirror(root: Path) -> Path:
    """A data mirror holding a toy en-de corpus in Multi30k's layout, under root/mirror."""
    mirror = root / "mirror"
    for split, n, seed in (("train", 600, 1), ("val", 40, 2), ("test_2016_flickr", 40, 3)):
        src, tgt = toy_corpus(n, seed)
        write_gz(mirror / f"toy/{split}.en.gz", src)
        write_gz(mirror / f"toy/{split}.de.gz", tgt)
    (mirror / "toy/treebank.conllu").write_text(toy_conllu(toy_corpus(60, seed=4)[0]), encoding="utf-8")
    return mirror


def tiny_config(**overrides) -> ModelConfig:
    settings = dict(src_vocab=23, tgt_vocab=19, d_model=16, n_heads=4, d_ff=32, enc_layers=2, dec_layers=2,
                    dropout=0.0, attn_dropout=0.0, relu_dropout=0.0, max_len=64)
    settings.update(overrides)
    return ModelConfig(**settings)


@pytest.fixture
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


def randomise_norms_and_biases(model, biases: bool = True):
    """LayerNorm gains in [0.5, 1.5] and, with `biases`, LayerNorm and Linear biases ~ N(0, 0.2)
    (else zero): a model whose every affine term matters, for LRP and forward checks."""
    from torch import nn

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2) if biases else module.bias.zero_()
            elif isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.2) if biases else module.bias.zero_()
    return model


def random_batch(model: Transformer, batch: int = 3, src_len: int = 7, tgt_len: int = 5, seed: int = 0):
    """Source (B, S) and decoder input (B, T) with some padding at the ends."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, model.cfg.src_vocab, (batch, src_len), generator=g)
    tgt = torch.randint(4, model.cfg.tgt_vocab, (batch, tgt_len), generator=g)
    pad, bos = model.special.pad, model.special.bos
    src[1:, -2:] = pad  # padding on all but the first sentence
    tgt[:, 0] = bos
    tgt[2:, -1] = pad
    return src, tgt


def teacher_forced(model, src: list[int], tgt: list[int], need_weights: bool = False):
    """(per-token log-probabilities of tgt (T,), attention probabilities by type) for one sentence,
    the decoder fed EOS first as fairseq feeds it (tests of models against fairseq's recorded outputs)."""
    s, t = torch.tensor([src]), torch.tensor([tgt])
    tgt_in = torch.cat([torch.tensor([[model.special.bos]]), t[:, :-1]], dim=1)
    with torch.no_grad():
        logits, attention = model(s, tgt_in, need_weights=need_weights)
    return torch.log_softmax(logits.float(), dim=-1)[0].gather(1, t[0][:, None])[:, 0], attention


def masked_loglik_against_fairseq(model, ref: dict) -> tuple[float, float]:
    """With the heads fairseq masked (its recorded `masked_heads`) masked here too: the largest
    per-token error against fairseq's masked log-likelihoods, and how far masking moved fairseq's
    (so that agreement is not agreement by default). The heads are open again afterwards."""
    masks = {kind: torch.ones(len(modules), max(m.n_heads for m in modules))
             for kind, modules in model.attention_modules().items()}
    for kind, layer, head in ref["masked_heads"]:
        masks[kind][layer, head] = 0
    model.set_head_mask(masks)
    try:
        pairs = list(zip(ref["sources"], ref["targets"], ref["loglik_masked"], ref["loglik"]))
        worst = max(float((teacher_forced(model, s, t)[0] - theirs).abs().max()) for s, t, theirs, _ in pairs)
        moved = max(float((theirs - unmasked).abs().max()) for _, _, theirs, unmasked in pairs)
    finally:
        model.set_head_mask({kind: torch.ones_like(m) for kind, m in masks.items()})
    return worst, moved



def need_installed(distribution: str) -> None:
    """Skip a test whose registry package (real pretrained weights, a reference tool) is missing,
    except under CI, where make test installs it and the test must run: there, fail."""
    import importlib.metadata

    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        need(False, f"the package {distribution} is not installed")


def need(condition: bool, what: str) -> None:
    """Skip unless `condition`, or fail under CI (make test provides what these tests need)."""
    import os

    if not condition:
        if os.environ.get("CI"):
            pytest.fail(f"{what} (make test installs it; CI must run these tests)")
        pytest.skip(what)


def module_state(hf) -> list:
    """What an LRP pass may leave on a transformers model's modules: an instance forward, forward
    hooks, a config copy, the pass's own marker (models.module_rules puts them on for the pass)."""
    return [(m.__dict__.get("forward"), len(m._forward_hooks), len(m._forward_pre_hooks),
             getattr(m, "config", None), "_headcount_lrp" in m.__dict__) for m in hf.modules()]
