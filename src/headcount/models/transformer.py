"""The encoder-decoder Transformer of Voita et al. (2019), section 1.2 of SPEC.md.

Pre-LayerNorm Transformer (Vaswani et al. 2017; Xiong et al. 2020) with a final LayerNorm on the
encoder and decoder outputs, sinusoidal positions and dropout on residuals, attention and ReLU.

The same module also holds the variants of fairseq's `transformer` architectures, so that a fairseq
checkpoint (models/fairseq.py converts it) gets gates, LRP and head removal from this one model:
post-LayerNorm blocks (`norm: post`, no final LayerNorm), fairseq's sinusoids or learned positions
(both numbered from the padding id + 1), no embedding scale, a LayerNorm on the embeddings, GELU,
one embedding matrix for both sides, and the model's own special ids. The defaults are
headcount's own model; checkpoints written before these settings existed load unchanged.

Every attention module multiplies each head's context vector by a gate before the output
projection, MultiHead = Concat_i(g_i head_i) W^O (Voita et al. 2019, eq. 2). Here the gates are
a fixed 0/1 mask (`head_mask`); the pruning stage swaps in Hard Concrete gates by overriding
`MultiHeadAttention.gates`. The per-head context passes through an `nn.Identity` named
`head_context` so that analyses (LRP, Michel importance) can hook it without touching this file.

`Transformer` implements seq2seq.Seq2SeqWithHeads (family "headcount"): the analyses see it only
through that interface; its LRP forward pass is transformer_lrp.py.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh = D / H, V vocabulary.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from headcount.data.special import SpecialIds
from headcount.data.subwords import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from headcount.models.checkpoint import save_checkpoint
from headcount.models.seq2seq import register_family

FAMILY = "headcount"
DROPOUT_MASKS = ("torch", "fast")
FFN_INITS = ("xavier", "torch")  # how the feed-forward layers start (ModelConfig.ffn_init)
NORMS = ("pre", "post")  # LayerNorm before each block (x + f(LN(x))) or after it (LN(x + f(x)))
# headcount's sinusoids (interleaved sin/cos, position 0 first); fairseq's (sines then cosines,
# numbered from pad + 1); fairseq's learned table (numbered from pad + 1).
POSITIONS = ("sinusoidal", "fairseq_sinusoidal", "learned")
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass
class ModelConfig:
    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    enc_layers: int = 6
    dec_layers: int = 6
    dropout: float = 0.1  # on residual branches and embeddings
    attn_dropout: float = 0.1  # on attention probabilities
    relu_dropout: float = 0.1  # inside the feed-forward block
    # Where residual, embedding and ReLU dropout masks come from: "torch" (torch's dropout, one
    # random float per element) or "fast" (16-bit slices of 64-bit random integers; see Dropout).
    dropout_masks: str = "torch"
    tie_target_embeddings: bool = True  # decoder input embedding shared with the output layer
    max_len: int = 1024
    # The variants of fairseq's architectures (see the module docstring); defaults: headcount's model.
    norm: str = "pre"
    positions: str = "sinusoidal"
    scale_embeddings: bool = True  # token embeddings times sqrt(D)
    layernorm_embedding: bool = False
    activation: str = "relu"
    share_all_embeddings: bool = False  # one matrix for source and target embeddings (one vocabulary)
    # Xavier gain of W^Q, W^K, W^V at initialisation: 1, or fairseq's 1/sqrt(2) (its q, k and v
    # projections are initialised as one (3D, D) matrix would be; benchmarks/RESULTS.md measures it).
    qkv_init_gain: float = 1.0
    # How the feed-forward layers start: "xavier" (Xavier weights, zero biases, as every other
    # Linear here) or "torch" (nn.Linear's own init: uniform weights and biases within
    # 1/sqrt(fan_in), which fairseq's FFN keeps; benchmarks/RESULTS.md measures it).
    ffn_init: str = "xavier"
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID  # what the decoder input starts with (fairseq: its EOS)
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __post_init__(self) -> None:
        if self.ffn_init not in FFN_INITS:
            raise ValueError(f"model.ffn_init is {self.ffn_init!r}; expected one of {FFN_INITS}")
        if self.dropout_masks not in DROPOUT_MASKS:
            raise ValueError(f"model.dropout_masks is {self.dropout_masks!r}; expected one of {DROPOUT_MASKS}")
        for name, allowed in (("norm", NORMS), ("positions", POSITIONS), ("activation", tuple(ACTIVATIONS))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name} is {getattr(self, name)!r}; expected one of {allowed}")
        if self.share_all_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(f"share_all_embeddings needs one vocabulary; src_vocab {self.src_vocab} != "
                             f"tgt_vocab {self.tgt_vocab}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )

    @property
    def special(self) -> SpecialIds:
        return SpecialIds(pad=self.pad_id, bos=self.bos_id, eos=self.eos_id, unk=self.unk_id)

    @property
    def position_offset(self) -> int:
        """The row of the position table that the first token reads (fairseq: pad + 1)."""
        return 0 if self.positions == "sinusoidal" else self.pad_id + 1

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """The fixed position encodings of Vaswani et al. (2017): (max_len, D)."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def fairseq_sinusoidal_positions(rows: int, d_model: int, pad_id: int) -> Tensor:
    """fairseq's fixed positions, (rows, D): D/2 sines then D/2 cosines, frequencies
    10000^(-i / (D/2 - 1)), the padding row zero; token i of a sentence reads row pad_id + 1 + i."""
    half = d_model // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (rows, D/2)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_model % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[pad_id] = 0
    return table


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over H heads with a gate on each head's output."""

    def __init__(self, d_model: int, n_heads: int, attn_dropout: float):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = attn_dropout
        self.register_buffer("head_mask", torch.ones(n_heads))
        self.hard_concrete = None  # HardConcreteGates when pruning (see gates.attach_gates)
        self.head_context = nn.Identity()  # hook point: (B, H, Tq, Dh), before the gates

    def gates(self) -> Tensor:
        """One multiplier per head, (H,): the fixed 0/1 mask, times Hard Concrete gates if any
        (sampled once per forward pass, i.e. per batch, in training mode)."""
        if self.hard_concrete is None:
            return self.head_mask
        return self.head_mask * self.hard_concrete()

    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: Tensor,  # (B, Tq, D) queries (and keys/values for self-attention)
        memory: Tensor | None = None,  # (B, Tk, D) keys/values for decoder-encoder attention
        key_padding_mask: Tensor | None = None,  # (B, Tk) True where the key is padding
        causal: bool = False,
        need_weights: bool = False,
        cache: dict | None = None,  # incremental decoding state, filled in place
    ) -> tuple[Tensor, Tensor | None]:
        B, Tq, D = x.shape
        if self.n_heads == 0:  # every head physically pruned: only W^O's bias is left
            return self.out_proj.bias.expand(B, Tq, D), None
        q = self._split_heads(self.q_proj(x))  # (B, H, Tq, Dh)
        if memory is None:
            k, v = self._split_heads(self.k_proj(x)), self._split_heads(self.v_proj(x))
            if cache is not None:  # append this step's keys/values to the earlier steps'
                if "k" in cache:
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        elif cache is not None and "k" in cache:  # encoder memory projected once per sentence
            k, v = cache["k"], cache["v"]
        else:
            k, v = self._split_heads(self.k_proj(memory)), self._split_heads(self.v_proj(memory))
            if cache is not None:
                cache["k"], cache["v"] = k, v
        Tk = k.shape[2]
        causal = causal and Tq > 1  # a single new query may see every cached key

        allowed = None  # (B or 1, 1, Tq or 1, Tk) True where a query may look
        if key_padding_mask is not None:
            allowed = ~key_padding_mask[:, None, None, :]
        # A causal mask is needed explicitly unless SDPA can apply it alone on a square matrix.
        explicit_causal = causal and (allowed is not None or need_weights or Tq != Tk)
        if explicit_causal:
            tri = torch.ones(Tq, Tk, dtype=torch.bool, device=x.device).tril(diagonal=Tk - Tq)
            allowed = tri[None, None] if allowed is None else allowed & tri
        dropout_p = self.attn_dropout if self.training else 0.0

        probs = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            probs = scores.softmax(dim=-1)
            ctx = F.dropout(probs, dropout_p, self.training) @ v  # (B, H, Tq, Dh)
        else:
            # On CPU the fused flash kernel's backward is slow for sentence-length sequences
            # (measured: 42% of a training step); the math backend is ~1.6x faster end to end.
            backend = sdpa_kernel([SDPBackend.MATH]) if q.is_cpu and torch.is_grad_enabled() else nullcontext()
            with backend:
                ctx = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=causal and not explicit_causal
                )
        ctx = self.head_context(ctx)  # (B, H, Tq, Dh)
        ctx = ctx * self.gates().to(ctx.dtype).view(1, -1, 1, 1)  # Concat(g_i head_i)
        out = self.out_proj(ctx.transpose(1, 2).reshape(B, Tq, self.n_heads * self.head_dim))  # (B, Tq, D)
        return out, probs

    @torch.no_grad()
    def keep_heads(self, heads: list[int]) -> None:
        """Physical pruning, in place: keep only `heads` (their rows of W^Q, W^K, W^V and columns
        of W^O, each kept head's fixed gate folded into its columns), so the module computes only
        them; the same outputs as masking the others."""
        if self.hard_concrete is not None:
            raise ValueError("fold the Hard Concrete gates (hard_concrete.fold_gates) before removing heads")
        heads = sorted(int(h) for h in heads)
        if heads == list(range(self.n_heads)) and bool((self.head_mask == 1).all()):
            return
        dh = self.head_dim
        index = torch.tensor([h * dh + i for h in heads for i in range(dh)], dtype=torch.long)
        scale = torch.repeat_interleave(self.head_mask[heads], dh) if heads else torch.ones(0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self, name)
            new = _uninitialised_linear(old.in_features, len(index), like=old.weight)
            new.weight.copy_(old.weight[index])
            new.bias.copy_(old.bias[index])
            setattr(self, name, new)
        old = self.out_proj
        new = _uninitialised_linear(len(index), old.out_features, like=old.weight)
        new.weight.copy_(old.weight[:, index] * scale[None, :])
        new.bias.copy_(old.bias)
        self.out_proj = new
        self.n_heads = len(heads)
        self.head_mask = torch.ones(len(heads), device=self.head_mask.device)


def _uninitialised_linear(in_features: int, out_features: int, like: Tensor) -> nn.Linear:
    """A Linear whose weights the caller copies in: no random init, and no torch warning when a
    layer loses all its heads (zero-size weights)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return nn.utils.skip_init(nn.Linear, in_features, out_features, device=like.device, dtype=like.dtype)


class Dropout(nn.Module):
    """Inverted dropout with a choice of where the masks come from (`ModelConfig.dropout_masks`).

    "torch" is torch's own dropout, exactly. On CPU, torch draws one Mersenne-Twister float per
    element on a single thread, which measured 20% of a training step of the default model. "fast"
    cuts four 16-bit lanes out of each 64-bit draw of the same generator (so torch.manual_seed and
    the checkpointed RNG state still make runs reproducible) and drops an element when its lane
    falls below p * 2^16: 5x faster masks, ~1.1x faster training steps (benchmarks/RESULTS.md). The
    drop probability is p rounded to a multiple of 2^-16 (0.1 -> 0.100006). It is a different
    random stream from torch's, so the two settings train different (equally valid) models.
    Hand-written because torch offers no faster CPU mask; on other devices torch's fused dropout
    is used.
    """

    def __init__(self, p: float, masks: str = "torch"):
        super().__init__()
        self.p, self.masks = p, masks

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if self.masks == "torch" or not x.is_cpu or self.p >= 1:
            return F.dropout(x, self.p, training=True)
        return x * lane_keep_mask(x.shape, self.p).to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, masks={self.masks}"


def lane_keep_mask(shape: torch.Size, p: float) -> Tensor:
    """Bool mask, True (kept) with probability 1 - p, from 16-bit lanes of 64-bit random integers."""
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)  # 4 lanes each
    lanes = words.view(torch.int16)[:n].view(shape)  # uniform over [-2^15, 2^15)
    return lanes >= round(p * 2**16) - 2**15


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, relu_dropout: float, dropout_masks: str = "torch",
                 activation: str = "relu"):
        super().__init__()
        self.w_in, self.w_out = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.relu_dropout = Dropout(relu_dropout, dropout_masks)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        return self.w_out(self.relu_dropout(ACTIVATIONS[self.activation](self.w_in(x))))


def residual(x: Tensor, norm: nn.LayerNorm, branch, dropout: nn.Module, pre_norm: bool):
    """One residual block: x + f(LN(x)) (pre-LN) or LN(x + f(x)) (post-LN); f's extra outputs
    (attention probabilities) are passed on."""
    out = branch(norm(x) if pre_norm else x)
    h, extra = out if isinstance(out, tuple) else (out, None)
    x = x + dropout(h)
    return (x if pre_norm else norm(x)), extra


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.dropout_masks, cfg.activation)
        self.dropout = Dropout(cfg.dropout, cfg.dropout_masks)
        self.pre_norm = cfg.norm == "pre"

    def forward(self, x: Tensor, src_pad: Tensor, need_weights: bool = False):
        x, attn = residual(x, self.self_attn_norm,
                           lambda h: self.self_attn(h, key_padding_mask=src_pad, need_weights=need_weights),
                           self.dropout, self.pre_norm)
        x, _ = residual(x, self.ffn_norm, self.ffn, self.dropout, self.pre_norm)
        return x, attn


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.dropout_masks, cfg.activation)
        self.dropout = Dropout(cfg.dropout, cfg.dropout_masks)
        self.pre_norm = cfg.norm == "pre"

    def forward(self, y, memory, src_pad, need_weights: bool = False, cache: dict | None = None):
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        y, self_probs = residual(
            y, self.self_attn_norm,
            lambda h: self.self_attn(h, causal=True, need_weights=need_weights, cache=self_cache),
            self.dropout, self.pre_norm)
        y, cross_probs = residual(
            y, self.cross_attn_norm,
            lambda h: self.cross_attn(h, memory, key_padding_mask=src_pad, need_weights=need_weights,
                                      cache=cross_cache),
            self.dropout, self.pre_norm)
        y, _ = residual(y, self.ffn_norm, self.ffn, self.dropout, self.pre_norm)
        return y, self_probs, cross_probs


class Transformer(nn.Module):
    """headcount's encoder-decoder Transformer, a seq2seq.Seq2SeqWithHeads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.special = cfg.special
        self.src_embed = nn.Embedding(cfg.src_vocab, cfg.d_model, padding_idx=cfg.pad_id)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab, cfg.d_model, padding_idx=cfg.pad_id)
        rows = cfg.max_len + cfg.position_offset
        if cfg.positions == "learned":  # one table a side, as fairseq's encoder and decoder have
            self.src_positions = nn.Embedding(rows, cfg.d_model, padding_idx=cfg.pad_id)
            self.tgt_positions = nn.Embedding(rows, cfg.d_model, padding_idx=cfg.pad_id)
        else:
            table = (sinusoidal_positions(rows, cfg.d_model) if cfg.positions == "sinusoidal"
                     else fairseq_sinusoidal_positions(rows, cfg.d_model, cfg.pad_id))
            self.register_buffer("positions", table, persistent=False)
        if cfg.layernorm_embedding:
            self.src_embed_norm, self.tgt_embed_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.embed_dropout = Dropout(cfg.dropout, cfg.dropout_masks)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        # Pre-LN stacks end in a LayerNorm; post-LN blocks already end in one.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        self._init_weights()
        if cfg.share_all_embeddings:
            self.tgt_embed = self.src_embed
        if cfg.tie_target_embeddings:
            self.generator.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.cfg.qkv_init_gain != 1.0:  # drawn after the rest, so gain 1 keeps the old random stream
            for modules in self.attention_modules().values():
                for m in modules:
                    for proj in (m.q_proj, m.k_proj, m.v_proj):
                        nn.init.xavier_uniform_(proj.weight, gain=self.cfg.qkv_init_gain)
        for embed in (self.src_embed, self.tgt_embed):
            # Scaled by sqrt(D) on the way in, so unit-scale vectors after scaling.
            nn.init.normal_(embed.weight, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                embed.weight[self.cfg.pad_id].zero_()
        if self.cfg.ffn_init == "torch":  # drawn last: the other tensors keep the default stream
            for layer in (*self.encoder_layers, *self.decoder_layers):
                layer.ffn.w_in.reset_parameters()
                layer.ffn.w_out.reset_parameters()

    def position_table(self, side: str) -> Tensor:
        """The positions' table, (rows, D); token i of a sentence reads row cfg.position_offset + i."""
        if self.cfg.positions == "learned":
            return (self.src_positions if side == "src" else self.tgt_positions).weight
        return self.positions

    def embed_scale(self) -> float:
        return math.sqrt(self.cfg.d_model) if self.cfg.scale_embeddings else 1.0

    def embedding(self, side: str, tokens: Tensor, start: int = 0) -> Tensor:
        """Token embeddings times the scale plus positions, (B, T, D), before any embedding
        LayerNorm; side "src" or "tgt"; start: the position of tokens[:, 0]."""
        T = tokens.shape[1]
        if start + T > self.cfg.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds model.max_len={self.cfg.max_len}")
        first = self.cfg.position_offset + start
        embed = self.src_embed if side == "src" else self.tgt_embed
        return embed(tokens) * self.embed_scale() + self.position_table(side)[first : first + T]

    def embedding_norm(self, side: str) -> nn.LayerNorm | None:
        if not self.cfg.layernorm_embedding:
            return None
        return self.src_embed_norm if side == "src" else self.tgt_embed_norm

    def _embed(self, side: str, tokens: Tensor, start: int = 0) -> Tensor:
        x = self.embedding(side, tokens, start)
        norm = self.embedding_norm(side)
        return self.embed_dropout(x if norm is None else norm(x))

    def encode(self, src: Tensor, need_weights: bool = False):
        """src (B, S) -> memory (B, S, D), padding mask (B, S), per-layer probs [(B, H, S, S)]."""
        src_pad = src.eq(self.cfg.pad_id)
        x = self._embed("src", src)
        probs = []
        for layer in self.encoder_layers:
            x, p = layer(x, src_pad, need_weights)
            probs.append(p)
        return self.encoder_norm(x), src_pad, probs

    def decode(
        self,
        tgt_in: Tensor,  # (B, T) starting with BOS; during incremental decoding only the new tokens
        memory: Tensor,  # (B, S, D)
        src_pad: Tensor,  # (B, S)
        need_weights: bool = False,
        cache: list[dict] | None = None,  # one dict per decoder layer
        start: int = 0,  # position of tgt_in[:, 0] in the target sentence
    ):
        """-> hidden states (B, T, D), self probs [(B, H, T, T)], cross probs [(B, H, T, S)]."""
        y = self._embed("tgt", tgt_in, start)
        self_probs, cross_probs = [], []
        for i, layer in enumerate(self.decoder_layers):
            y, ps, pc = layer(y, memory, src_pad, need_weights, None if cache is None else cache[i])
            self_probs.append(ps)
            cross_probs.append(pc)
        return self.decoder_norm(y), self_probs, cross_probs

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False):
        """Teacher-forced pass: logits (B, T, V) and, on request, attention probabilities by type."""
        memory, src_pad, enc_probs = self.encode(src, need_weights)
        hidden, dec_self, dec_enc = self.decode(tgt_in, memory, src_pad, need_weights)
        logits = self.logits(hidden)
        attentions = None
        if need_weights:
            attentions = {"enc_self": enc_probs, "dec_self": dec_self, "dec_enc": dec_enc}
        return logits, attentions

    def attention_modules(self) -> dict[str, list[MultiHeadAttention]]:
        """The gated attention modules by type, in layer order."""
        return {
            "enc_self": [layer.self_attn for layer in self.encoder_layers],
            "dec_self": [layer.self_attn for layer in self.decoder_layers],
            "dec_enc": [layer.cross_attn for layer in self.decoder_layers],
        }

    def set_head_mask(self, masks: dict[str, Tensor]) -> None:
        """Fix the 0/1 gates, masks[type] of shape (layers, H); types left out stay as they are."""
        modules = self.attention_modules()
        for kind, mask in masks.items():
            mask = torch.as_tensor(mask, dtype=torch.float32)
            if mask.shape != (len(modules[kind]), self.cfg.n_heads):
                raise ValueError(f"head mask for {kind} has shape {tuple(mask.shape)}, "
                                 f"expected ({len(modules[kind])}, {self.cfg.n_heads})")
            for module, row in zip(modules[kind], mask):
                module.head_mask.copy_(row)

    def head_mask(self) -> dict[str, Tensor]:
        return {kind: torch.stack([m.head_mask for m in mods]) for kind, mods in self.attention_modules().items()}

    # ----------------------------------------------------------------------------------------
    # The rest of seq2seq.Seq2SeqWithHeads

    @property
    def max_positions(self) -> int:
        return self.cfg.max_len

    @property
    def d_model(self) -> int:
        return self.cfg.d_model

    def logits(self, hidden: Tensor) -> Tensor:
        """(..., D) decoder output -> (..., V) target vocabulary logits (the generator, no bias)."""
        return self.generator(hidden)

    def new_cache(self) -> list[dict]:
        """An empty incremental-decoding cache: one dict per decoder layer."""
        return [{} for _ in self.decoder_layers]

    def reorder_cache(self, cache: list[dict], rows: Tensor) -> None:
        """Keep the given rows (batch entries) of every cached key/value tensor, in place."""
        for layer in cache:
            for part in layer.values():
                for key in ("k", "v"):
                    if key in part:
                        part[key] = part[key].index_select(0, rows)

    def encoder_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.src_embed.parameters()
        if self.cfg.positions == "learned":
            yield from self.src_positions.parameters()
        if self.cfg.layernorm_embedding:
            yield from self.src_embed_norm.parameters()
        for layer in self.encoder_layers:
            yield from layer.parameters()
        yield from self.encoder_norm.parameters()

    def lrp_forward(self):
        from headcount.models.transformer_lrp import TransformerLRPForward

        return TransformerLRPForward(self)

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """An atomic checkpoint that loading.load_model reads back."""
        save_checkpoint(path, {"family": FAMILY, "model": self.state_dict(), "model_config": self.cfg.to_dict(),
                               **(extra or {})})


@register_family(FAMILY)
def from_checkpoint(state: dict) -> Transformer:
    """The family's loader: a Transformer with the checkpoint's configuration and weights."""
    model = Transformer(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model
