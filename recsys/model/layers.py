"""Transformer building blocks shared by the sequence encoders.

Mask convention everywhere in recsys: a boolean ``padding_mask`` of shape (B, T) with
**True = a real token**. :func:`attention_mask` is the one place that turns it into the mask
``torch.nn.functional.scaled_dot_product_attention`` expects.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import nn

from recsys.schema import NUM_RESERVED

QKV_ACTIVATIONS = (None, "relu")
FFN_ACTIVATIONS = ("gelu", "relu")
POSITION_ORIGINS = ("last", "first")


# --- argument checks shared by the model modules -------------------------------------------


def _check_int(name: str, value: object, *, minimum: int = 1, why: str = "") -> int:
    """Return ``value`` as a plain ``int`` (configs must hold plain Python values), or raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{name}={value!r} is invalid: pass an integer >= {minimum}{reason}")
    return int(value)


RESERVED_WHY = "indices 0 (PAD) and 1 (UNK) are reserved; pass the vocabulary size"


def _check_num_items(value: object) -> int:
    """``num_items``: the vocabulary size, PAD (0) and UNK (1) included, so at least 3."""
    return _check_int("num_items", value, minimum=NUM_RESERVED + 1, why=RESERVED_WHY)


def _check_dropout(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value!r} is invalid: pass a probability in [0, 1), e.g. 0.1")
    return float(value)


def _check_optional_positive(
    name: str, value: object, *, maximum: float, hint: str
) -> float | None:
    """None, or a number in (0, maximum] returned as a float; ``hint`` says what to pass."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value <= maximum:
        raise ValueError(f"{name}={value!r} is invalid: {hint}")
    return float(value)


def _check_init_std(value: object) -> float | None:
    """``init_std``: None, or the positive std linear weights are drawn at."""
    return _check_optional_positive(
        "init_std",
        value,
        maximum=1.0,
        hint="pass the std linear weights are drawn at, in (0, 1] (0.02: BERT's, which the "
        "S3-Rec family's code uses), or null for PyTorch's defaults",
    )


def init_linear_layers(module: nn.Module, std: float | None) -> None:
    """Draw every ``nn.Linear`` weight inside ``module`` from N(0, std) and zero its bias:
    BERT's initialiser, which the S3-Rec family's code (S3-Rec, BSARec, DuoRec) applies to its
    SASRec-style blocks. None keeps PyTorch's default (uniform within ±fan_in^-1/2, std ~0.07
    at width 64). Embedding tables are set by ``embedding_std``, not here."""
    if std is None:
        return
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _check_position_std(value: object) -> float | None:
    """``position_std``: None, or the positive std the learned position table is stored at."""
    return _check_optional_positive(
        "position_std",
        value,
        maximum=1.0,
        hint="pass the std the learned position table is stored at, in (0, 1] (0.02: the "
        "S3-Rec family's), or null to store it at unit scale",
    )


def _check_choice(name: str, value: object, allowed: Collection[object]) -> object:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported: choose one of {list(allowed)}")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid: pass True or False")
    return value


def _check_heads(d_model: int, num_heads: int) -> None:
    if d_model % num_heads != 0:
        lower = d_model - d_model % num_heads
        options = f"d_model={lower} or {lower + num_heads}" if lower else f"d_model={num_heads}"
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}: use a multiple of "
            f"num_heads ({options}) or a num_heads that divides d_model"
        )


# --- masks ---------------------------------------------------------------------------------


def never_recommended(num_items: int) -> torch.Tensor:
    """(I,) additive score mask: 0 for real items, -inf for PAD and UNK, which no encoder may
    ever recommend (cross-entropy stays finite because targets are never PAD or UNK)."""
    mask = torch.zeros(num_items)
    mask[:NUM_RESERVED] = float("-inf")
    return mask


def attention_mask(padding_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """Turn a padding mask (True = real token) into an SDPA attention mask (True = may attend).

    Query ``i`` may attend key ``j`` when key ``j`` is a real token and, if ``causal``, ``j <= i``.
    The diagonal is always allowed as well: in a left-padded causal sequence a padding query has
    no real key at or before it, and a query row with nothing allowed makes
    ``scaled_dot_product_attention`` return NaN, which would then leak into gradients. A real
    query always has its own (real) key allowed, so the diagonal changes nothing for real rows;
    padding rows produce throwaway values that the encoder zeroes.

    Worked example, one sequence left-padded to T=4 (``.`` = 0/False, ``1`` = True)::

        padding_mask = [F, F, T, T]

        causal=True                        causal=False
                  key 0 1 2 3                        key 0 1 2 3
        query 0       1 . . .    (diag)    query 0       1 . 1 1
        query 1       . 1 . .    (diag)    query 1       . 1 1 1
        query 2       . . 1 .              query 2       . . 1 1
        query 3       . . 1 1              query 3       . . 1 1

    Shapes:
        padding_mask: (B, T) bool, True = real token.
        returns: (B, 1, T, T) bool, broadcast over heads; True = query (row) may attend key
        (column).
    """
    if padding_mask.dtype != torch.bool:
        raise ValueError(
            f"padding_mask has dtype {padding_mask.dtype}: pass a bool tensor, True = real token"
        )
    seq_len = padding_mask.shape[-1]
    allowed = padding_mask[:, None, None, :]  # (B, 1, 1, T): key j is real
    diagonal = torch.eye(seq_len, dtype=torch.bool, device=padding_mask.device)  # (T, T)
    if causal:
        not_future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=padding_mask.device)
        allowed = allowed & not_future.tril()  # (B, 1, T, T)
    return allowed | diagonal  # (B, 1, T, T)


# --- attention and feed-forward ------------------------------------------------------------


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention on top of ``F.scaled_dot_product_attention``.

    ``qkv_activation="relu"`` applies ReLU to the Q/K/V projections and
    ``output_projection=False`` drops the output linear layer: both as in ATRank's reference
    code. The modern default is no activation and an output projection.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        dropout: float,
        qkv_activation: str | None = None,
        output_projection: bool = True,
    ) -> None:
        super().__init__()
        d_model = _check_int("d_model", d_model)
        num_heads = _check_int("num_heads", num_heads)
        _check_heads(d_model, num_heads)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dropout = _check_dropout("dropout", dropout)
        _check_choice("qkv_activation", qkv_activation, QKV_ACTIVATIONS)
        # One fused linear layer is the same map as ATRank's three dense layers, in one matmul.
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.qkv_activation = nn.ReLU() if qkv_activation == "relu" else nn.Identity()
        self.output = (
            nn.Linear(d_model, d_model)
            if _check_bool("output_projection", output_projection)
            else nn.Identity()
        )

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        score_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend every position to the positions ``attn_mask`` allows.

        ``score_bias`` is added to the scaled ``query · key`` logits before the softmax (the
        side-information scores of :class:`SideAttentionScores`); the values stay ``x``'s.

        Shapes:
            x: (B, T, D)
            attn_mask: (B, 1, T, T) bool from :func:`attention_mask`, True = may attend.
            score_bias: (B, H, T, T) float or None.
            returns: (B, T, D)
        """
        head_dim = self.d_model // self.num_heads
        qkv = self.qkv_activation(self.qkv(x))  # (B, T, 3D)
        qkv = qkv.unflatten(-1, (3, self.num_heads, head_dim))  # (B, T, 3, H, D/H)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D/H)
        if score_bias is not None:
            # A float mask is added to the logits: the bias where allowed, -inf elsewhere.
            attn_mask = score_bias.masked_fill(~attn_mask, float("-inf"))  # (B, H, T, T)
        attended = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
        )  # (B, H, T, D/H)
        attended = attended.transpose(1, 2).flatten(2)  # (B, T, D)
        return self.output(attended)


class SideAttentionScores(nn.Module):
    """Attention logits from side features of the tokens (DIF-SR's decoupled fusion).

    DIF-SR (Xie et al., SIGIR 2022, arXiv 2204.11046) lets item attributes steer *where* each
    position attends without mixing them into *what* is attended: every layer computes, beside
    the usual ``q · k`` of the hidden states, a second score from the attribute features with
    its own query and key maps, and adds the two before the softmax (its "sum" fusion); the
    values are the hidden states alone. The side features are fixed inputs (the tokens' attribute
    bags), read afresh by every layer, so deep layers still see them undiluted.

    Returns ``(side_q · side_kᵀ) / sqrt(D/H)`` per head, for
    :class:`MultiHeadSelfAttention`'s ``score_bias``.
    """

    def __init__(self, *, side_dim: int, d_model: int, num_heads: int) -> None:
        super().__init__()
        side_dim = _check_int("side_dim", side_dim)
        d_model = _check_int("d_model", d_model)
        num_heads = _check_int("num_heads", num_heads)
        _check_heads(d_model, num_heads)
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.query_key = nn.Linear(side_dim, 2 * d_model)

    def forward(self, side: torch.Tensor) -> torch.Tensor:
        """Shapes: side (B, T, S) -> (B, H, T, T)."""
        query_key = self.query_key(side).unflatten(-1, (2, self.num_heads, self.head_dim))
        query, key = query_key.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D/H)
        return query @ key.transpose(-1, -2) / self.head_dim**0.5  # (B, H, T, T)


class Dropout(nn.Module):
    """``nn.Dropout`` with a faster mask on CPU; every recsys model uses it.

    On CPU, ``F.dropout`` draws its mask with ``bernoulli_``, about 25 ns per element on one
    thread: a quarter of a training step of BSARec's recipe on Beauty. Thresholding
    ``torch.rand_like`` gives the same Bernoulli(1 - p) keep mask, scaled by 1 / (1 - p), 2-2.6x
    faster forward and backward (``python -m benchmarks.dropout_benchmark``). Other devices use
    ``F.dropout`` and its fused kernels. The two draw different random numbers, so a seed gives
    other masks on CPU than ``nn.Dropout`` did; the distribution is the same.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = _check_dropout("dropout", p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        scale = (torch.rand_like(x) >= self.p).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scale

    def extra_repr(self) -> str:
        return f"p={self.p}"


class FeedForward(nn.Module):
    """Position-wise MLP: Linear(D, hidden) -> activation -> dropout -> Linear(hidden, D)."""

    def __init__(
        self, *, d_model: int, hidden_dim: int, dropout: float, activation: str = "gelu"
    ) -> None:
        super().__init__()
        d_model = _check_int("d_model", d_model)
        hidden_dim = _check_int("hidden_dim", hidden_dim)
        _check_choice("activation", activation, FFN_ACTIVATIONS)
        self.net = nn.Sequential(
            nn.Linear(d_model, hidden_dim),
            nn.GELU() if activation == "gelu" else nn.ReLU(),
            Dropout(dropout),
            nn.Linear(hidden_dim, d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (..., D) -> (..., D)."""
        return self.net(x)


class TransformerBlock(nn.Module):
    """Self-attention + feed-forward with residual connections and LayerNorm.

    ``norm_first=True`` (modern, pre-norm)::

        x = x + dropout(attention(norm(x)));  x = x + dropout(ffn(norm(x)))

    ``norm_first=False`` (ATRank, post-norm)::

        x = norm(x + dropout(attention(x)));  x = norm(x + dropout(ffn(x)))

    A pre-norm stack needs a final LayerNorm after the last block; the encoder owns it.
    With ``filter_mix = alpha > 0`` the attention branch becomes
    ``alpha * low_pass(x) + (1 - alpha) * attention(x)`` (BSARec; :class:`LowPassFilter`).
    With ``side_dim > 0`` the attention logits also get the scores of the tokens' side
    features passed as ``side`` (DIF-SR; :class:`SideAttentionScores`).
    Rows at padding positions come out as arbitrary (finite) values: real queries never attend
    to them, so they cannot leak, and the encoder multiplies them by zero at the end.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float,
        norm_first: bool = True,
        qkv_activation: str | None = None,
        output_projection: bool = True,
        activation: str = "gelu",
        filter_mix: float = 0.0,
        filter_frequencies: int = 5,
        max_seq_len: int | None = None,
        causal: bool = True,
        side_dim: int = 0,
    ) -> None:
        super().__init__()
        self.norm_first = _check_bool("norm_first", norm_first)
        side_dim = _check_int("side_dim", side_dim, minimum=0, why="0: no side scores")
        self.side_scores = (
            SideAttentionScores(side_dim=side_dim, d_model=d_model, num_heads=num_heads)
            if side_dim
            else None
        )
        self.filter_mix = _check_filter_mix(filter_mix)
        # BSARec's frequency branch beside the attention (alpha = filter_mix); None when off.
        self.low_pass: LowPassFilter | None = None
        if self.filter_mix > 0.0:
            if max_seq_len is None:
                raise ValueError("filter_mix > 0 needs max_seq_len (the filter's window)")
            if isinstance(max_seq_len, int) and max_seq_len < 2:
                # (LowPassFilter's own advice, "a c with c // 2 + 1 below 1", has no answer)
                raise ValueError(
                    f"filter_mix={self.filter_mix} needs windows of at least 2 events: a window "
                    f"of max_seq_len={max_seq_len} has one frequency, which every "
                    "filter_frequencies keeps, so the low-pass branch would pass it unchanged; "
                    "set data.max_seq_len >= 2, or filter_mix=0"
                )
            self.low_pass = LowPassFilter(
                max_seq_len=max_seq_len,
                d_model=d_model,
                frequencies=filter_frequencies,
                causal=causal,
            )
        self.attention = MultiHeadSelfAttention(
            d_model=d_model,
            num_heads=num_heads,
            dropout=dropout,
            qkv_activation=qkv_activation,
            output_projection=output_projection,
        )
        self.feed_forward = FeedForward(
            d_model=d_model, hidden_dim=ffn_dim, dropout=dropout, activation=activation
        )
        self.attention_norm = nn.LayerNorm(d_model)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.residual_dropout = Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        padding_mask: torch.Tensor,
        side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shapes:
        x: (B, T, D)
        attn_mask: (B, 1, T, T) bool from :func:`attention_mask`.
        padding_mask: (B, T) bool, True = real token (read by the low-pass branch only).
        side: (B, T, side_dim) side features of the tokens; required when side_dim > 0.
        returns: (B, T, D); padding rows are not zeroed here (see the class docstring).
        """
        if (side is None) != (self.side_scores is None):
            raise ValueError(
                "side features are passed exactly when the block was built with side_dim > 0: "
                f"got side={'None' if side is None else tuple(side.shape)} for side_dim="
                f"{0 if self.side_scores is None else self.side_scores.query_key.in_features}"
            )
        score_bias = None if self.side_scores is None else self.side_scores(side)
        if self.norm_first:
            mixed = self._mix(self.attention_norm(x), attn_mask, padding_mask, score_bias)
            x = x + self.residual_dropout(mixed)
            x = x + self.residual_dropout(self.feed_forward(self.feed_forward_norm(x)))
        else:
            mixed = self._mix(x, attn_mask, padding_mask, score_bias)
            x = self.attention_norm(x + self.residual_dropout(mixed))
            x = self.feed_forward_norm(x + self.residual_dropout(self.feed_forward(x)))
        return x

    def _mix(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        padding_mask: torch.Tensor,
        score_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """The token-mixing branch: attention, or alpha * low-pass + (1 - alpha) * attention."""
        attended = self.attention(x, attn_mask, score_bias)
        if self.low_pass is None:
            return attended
        alpha = self.filter_mix
        return alpha * self.low_pass(x, padding_mask) + (1.0 - alpha) * attended


def _check_filter_frequencies(value: object) -> int:
    return _check_int("filter_frequencies", value, why="BSARec's c: c // 2 + 1 frequencies kept")


def _check_filter_mix(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(
            f"filter_mix={value!r} is invalid: pass a weight in [0, 1] for the low-pass branch "
            f"(0: attention only, the default; BSARec uses 0.7 on Beauty)"
        )
    return float(value)


class LowPassFilter(nn.Module):
    """BSARec's frequency branch (Shin et al., AAAI 2024, arXiv 2312.10325) over a token window.

    BSARec splits a left-padded window of L tokens into its ``c // 2 + 1`` lowest Fourier
    components (``low``, an FFT over positions) and the rest (``high = x - low``) and returns
    ``low + beta² * high``, beta a learned per-channel scale: a smoothing of the sequence whose
    sharpness each channel learns. Both parts are linear in the window, so ``low = P x`` with a
    fixed (L, L) matrix P (the low-pass projection), which is what is stored.

    BSARec trains one sample per prefix and reads only the last position, so its filter may mix
    the whole window. Trained at every position at once, that would let a position see the
    events after it, so ``causal=True`` (the default) keeps, for every position t, the weights
    BSARec's last position gives the events before it: ``low[t] = sum_{s<=t} P[L-1, L-1-(t-s)]
    x[s]``, the filter of the prefix ending at t, right-aligned in its own window. At the last
    position of a left-padded window that is exactly BSARec's low-pass (with zero padding rows,
    where BSARec has position-embedding rows). ``causal=False`` applies P itself.
    """

    def __init__(
        self, *, max_seq_len: int, d_model: int, frequencies: int = 5, causal: bool = True
    ) -> None:
        super().__init__()
        self.max_seq_len = _check_int("max_seq_len", max_seq_len)
        d_model = _check_int("d_model", d_model)
        frequencies = _check_filter_frequencies(frequencies)
        length = self.max_seq_len
        if frequencies // 2 + 1 >= length // 2 + 1:
            raise ValueError(
                f"filter_frequencies={frequencies} keeps all {length // 2 + 1} frequencies of a "
                f"window of {length} events (max_seq_len), so the low-pass branch would pass the "
                "sequence unchanged: take a c with c // 2 + 1 below that, at most "
                f"{max(2 * (length // 2) - 1, 0)} (BSARec: 5 for windows of 50)"
            )
        spectrum = torch.fft.rfft(torch.eye(length), dim=0, norm="ortho")  # (L//2+1, L)
        spectrum[frequencies // 2 + 1 :] = 0
        # Column s is the low-pass of a unit impulse at s: low[t] = sum_s projection[t, s] x[s].
        projection = torch.fft.irfft(spectrum, n=length, dim=0, norm="ortho")  # (L, L)
        if _check_bool("causal", causal):
            lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # t - s
            kernel = projection[-1].flip(0)  # kernel[d]: weight of the event d steps back
            projection = torch.where(lag >= 0, kernel[lag.clamp(min=0)], 0.0)
        self.register_buffer("projection", projection, persistent=False)  # (L, L)
        # BSARec stores sqrt(beta) ~ N(0, 1) per channel and uses its square.
        self.sqrt_beta = nn.Parameter(torch.randn(d_model))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """Shapes: x (B, T, D), padding_mask (B, T) bool (True = real) -> (B, T, D).
        Padding rows are zeroed first, so they contribute nothing to real rows."""
        seq_len = x.shape[1]
        _check_seq_len(seq_len, self.max_seq_len)
        x = x * padding_mask[..., None]
        window = self.projection[self.max_seq_len - seq_len :, self.max_seq_len - seq_len :]
        low = window @ x  # (T, T) @ (B, T, D)
        return low + self.sqrt_beta**2 * (x - low)


# --- positional encodings ------------------------------------------------------------------


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sin/cos encodings ("Attention Is All You Need", section 3.5).

    ``pe[p, 2i] = sin(p / 10000^(2i/D))`` and ``pe[p, 2i+1] = cos(p / 10000^(2i/D))``.
    Positions count back from the most recent event: a left-padded window of width T gets
    positions ``L-T .. L-1`` (L = max_seq_len), so the most recent event is always L-1 and a
    history means the same in a batch trimmed to its longest row as in a full-width one.
    """

    def __init__(self, *, max_seq_len: int, d_model: int, origin: str = "last") -> None:
        super().__init__()
        self.max_seq_len = _check_int("max_seq_len", max_seq_len)
        self.origin = _check_choice("position_origin", origin, POSITION_ORIGINS)
        d_model = _check_int("d_model", d_model)
        position = torch.arange(max_seq_len, dtype=torch.float32)[:, None]  # (L, 1)
        even = torch.arange(0, d_model, 2, dtype=torch.float32)  # (ceil(D/2),)
        angle = position / torch.pow(10000.0, even / d_model)  # (L, ceil(D/2))
        table = torch.zeros(max_seq_len, d_model)
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd D has one fewer cos column
        # Not persistent: it is a pure function of the constructor arguments.
        self.register_buffer("table", table, persistent=False)

    def forward(self, padding_mask: torch.Tensor) -> torch.Tensor:
        """Shapes: padding_mask (B, T) bool -> (T, D) or (B, T, D); see :func:`position_index`."""
        return self.table[position_index(padding_mask, self.max_seq_len, self.origin)]


class LearnedPositionalEncoding(nn.Module):
    """One trained vector per position 0 .. max_seq_len-1 (counted as in the sinusoidal one).

    The vectors start at unit scale either way. ``std=None`` stores them so (N(0, 1), the
    default), where Adam's steps of ~lr barely move them; a std stores them at that std and
    uses them divided by it, so they learn ~1/std times faster, as the item tables do at
    ``embedding_std`` (the S3-Rec family's code keeps its position table at 0.02 like its
    item table)."""

    def __init__(
        self, *, max_seq_len: int, d_model: int, origin: str = "last", std: float | None = None
    ) -> None:
        super().__init__()
        self.max_seq_len = _check_int("max_seq_len", max_seq_len)
        self.origin = _check_choice("position_origin", origin, POSITION_ORIGINS)
        self.embedding = nn.Embedding(max_seq_len, _check_int("d_model", d_model))
        std = _check_position_std(std)
        self.scale = 1.0
        if std is not None:
            nn.init.normal_(self.embedding.weight, std=std)
            self.scale = 1.0 / std

    def forward(self, padding_mask: torch.Tensor) -> torch.Tensor:
        """Shapes: padding_mask (B, T) bool -> (T, D) or (B, T, D); see :func:`position_index`."""
        index = position_index(padding_mask, self.max_seq_len, self.origin)
        return self.embedding.weight[index] * self.scale


def position_index(padding_mask: torch.Tensor, max_seq_len: int, origin: str) -> torch.Tensor:
    """Which position each token of a left-padded window takes.

    ``origin="last"``: positions count back from the most recent event, which is always
    ``max_seq_len - 1`` (returns (T,)). ``origin="first"``: the window's first real event is 0,
    the next 1, and so on (returns (B, T); padding takes 0). With ``"first"`` a token's
    position depends only on the events before it, so causal training at every position computes
    exactly what a prediction from that prefix computes at evaluation (as when every prefix is a
    training sample, RecBole's and the S3-Rec family's form); with ``"last"`` the position of the
    token a training prediction is made from is not the one evaluation uses.
    """
    seq_len = padding_mask.shape[-1]
    _check_seq_len(seq_len, max_seq_len)
    if origin == "last":
        return torch.arange(max_seq_len - seq_len, max_seq_len, device=padding_mask.device)
    return (padding_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _check_seq_len(seq_len: int, max_seq_len: int) -> None:
    if seq_len > max_seq_len:
        raise ValueError(
            f"sequence length T={seq_len} exceeds max_seq_len={max_seq_len}: clip the sequences "
            f"to the last {max_seq_len} events or build the model with max_seq_len >= {seq_len}"
        )
