"""Small stand-ins the unit tests share."""

import random
from types import SimpleNamespace

import torch

from headcount.data.special import SpecialIds


class PieceSegmenter:
    """Each word into pieces of at most 3 characters, the first with '▁', as sentencepiece marks a
    word start; ids 4 .. 4 + ids - 1 assigned on first use (0-3 are the special ids)."""

    def __init__(self, ids: int = 60):
        self.vocab: dict[str, int] = {}
        self.ids = ids

    def pieces(self, line: str) -> list[str]:
        out = []
        for word in line.split():
            chunks = [word[i:i + 3] for i in range(0, len(word), 3)]
            out += ["▁" + chunks[0]] + chunks[1:]
        return out

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [[self.vocab.setdefault(p, 4 + len(self.vocab) % self.ids) for p in self.pieces(line)] for line in lines]

    def __len__(self) -> int:
        return 4 + self.ids


# --------------------------------------------------------------------------------------------
# A decoder-only model with planted causal attention


def previous_token(ids: list[int], i: int) -> int:
    return max(i - 1, 0)


def induction_target(ids: list[int], i: int) -> int:
    """The position after the latest earlier occurrence of token i's id; i itself if none."""
    earlier = [j for j in range(1, i) if ids[j] == ids[i]]
    return earlier[-1] + 1 if earlier else i


def bos_only(ids: list[int], i: int) -> int:
    return 0


class PlantedCausalLM(torch.nn.Module):
    """A decoder_only model (models.seq2seq) whose causal self-attention is planted. Head h of every
    layer puts sinks[h] on BOS (position 0), `peak` of the rest on targets[h](ids, i) (a position
    <= i) and spreads what remains evenly over 0..i; the BOS query sees only itself. forward returns
    zero logits and {"dec_self": [(B, H, T, T)] per layer}; `calls` records each tgt_in."""

    model_kind = "decoder_only"

    def __init__(self, targets, sinks=None, layers: int = 1, vocab: int = 64, max_positions: int = 256,
                 peak: float = 0.9):
        super().__init__()
        self.special = SpecialIds(pad=0, bos=1, eos=2, unk=3)
        self.targets, self.sinks = list(targets), list(sinks or [0.0] * len(targets))
        self.layers, self.vocab, self.max_positions, self.peak = layers, vocab, max_positions, peak
        self.calls: list[torch.Tensor] = []

    def attention_modules(self) -> dict:
        return {"dec_self": [SimpleNamespace(n_heads=len(self.targets)) for _ in range(self.layers)]}

    def forward(self, src, tgt_in, need_weights: bool = False):
        assert src.shape == (tgt_in.shape[0], 0), "a decoder-only model's source is empty"
        self.calls.append(tgt_in)
        B, T = tgt_in.shape
        probs = torch.zeros(B, len(self.targets), T, T, dtype=torch.float64)
        for b, ids in enumerate(tgt_in.tolist()):
            for h, (target, sink) in enumerate(zip(self.targets, self.sinks)):
                probs[b, h, 0, 0] = 1.0
                for i in range(1, T):
                    rest = 1.0 - sink
                    probs[b, h, i, 0] += sink
                    probs[b, h, i, target(ids, i)] += self.peak * rest
                    probs[b, h, i, :i + 1] += (1 - self.peak) * rest / (i + 1)
        logits = torch.zeros(B, T, self.vocab)
        return logits, ({"dec_self": [probs.float()] * self.layers} if need_weights else None)


class PlantedMaskedLM(torch.nn.Module):
    """An encoder_only model (models.seq2seq) whose self-attention over [CLS] + pieces + [SEP] is
    planted: head h puts cls[h] on [CLS], sep[h] on [SEP], the rest on the next piece (the last
    piece: the one before it). `encode` returns ((B, S, 1) zeros, padding mask, [(B, H, S, S)])."""

    model_kind = "encoder_only"

    def __init__(self, cls: list[float], sep: list[float], max_positions: int = 256):
        super().__init__()
        self.special = SpecialIds(pad=0, bos=1, eos=2, unk=3, mask=4)
        self.cls, self.sep, self.max_positions = cls, sep, max_positions

    def encode(self, src, need_weights: bool = False):
        B, S = src.shape
        probs = torch.zeros(B, len(self.cls), S, S)
        for b, ids in enumerate(src.tolist()):
            last = ids.index(self.special.eos)
            for h, (on_cls, on_sep) in enumerate(zip(self.cls, self.sep)):
                for q in range(last + 1):
                    probs[b, h, q, 0] += on_cls
                    probs[b, h, q, last] += on_sep
                    probs[b, h, q, q + 1 if q + 1 < last else max(q - 1, 1)] += 1 - on_cls - on_sep
        return torch.zeros(B, S, 1), src.eq(self.special.pad), [probs]


def louder(model):
    """Weights of std ~0.2 instead of transformers' initial 0.02, so that every head moves the loss
    (agreement between two ways of masking heads is then not trivial)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    return model


def random_texts(vocab: int, avoid: set[int], n: int = 6, seed: int = 0) -> list[list[int]]:
    """`n` texts of 3-9 ids drawn from the vocabulary less `avoid` (the special ids)."""
    rng = random.Random(seed)
    ordinary = [i for i in range(vocab) if i not in avoid]
    return [[rng.choice(ordinary) for _ in range(rng.randint(3, 9))] for _ in range(n)]


def tiny_marian(layers: int):
    """A random MarianMT of `layers` + `layers` layers, 4 heads, d 16, 40 words (39: pad), louder."""
    import transformers

    from headcount.models.hf import HFSeq2Seq

    config = transformers.MarianConfig(vocab_size=40, d_model=16, encoder_layers=layers, decoder_layers=layers,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
                                       decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.0,
                                       attention_dropout=0.0, activation_dropout=0.0, pad_token_id=39,
                                       decoder_start_token_id=39, eos_token_id=0, scale_embedding=True)
    return HFSeq2Seq(louder(transformers.MarianMTModel(config))).eval()
