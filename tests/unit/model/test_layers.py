"""Masks, attention, blocks and positional encodings in recsys.model.layers."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.model.layers import (
    Dropout,
    FeedForward,
    LearnedPositionalEncoding,
    LowPassFilter,
    MultiHeadSelfAttention,
    SideAttentionScores,
    SinusoidalPositionalEncoding,
    TransformerBlock,
    attention_mask,
    position_index,
)

F, T = False, True


def test_attention_mask_worked_example_causal() -> None:
    mask = attention_mask(torch.tensor([[F, F, T, T]]), causal=True)
    expected = torch.tensor(
        [
            [T, F, F, F],  # padding query: only its own diagonal, so SDPA has no empty row
            [F, T, F, F],
            [F, F, T, F],
            [F, F, T, T],
        ]
    )
    assert mask.shape == (1, 1, 4, 4)
    assert mask.dtype == torch.bool
    assert torch.equal(mask[0, 0], expected)


def test_attention_mask_worked_example_not_causal() -> None:
    mask = attention_mask(torch.tensor([[F, F, T, T]]), causal=False)
    expected = torch.tensor(
        [
            [T, F, T, T],
            [F, T, T, T],
            [F, F, T, T],
            [F, F, T, T],
        ]
    )
    assert torch.equal(mask[0, 0], expected)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_mask_every_row_allows_a_key_and_real_rows_only_real_keys(causal: bool) -> None:
    padding_mask = torch.tensor([[F, F, F, T, T, T], [F, F, F, F, F, F], [T, T, T, T, T, T]])
    mask = attention_mask(padding_mask, causal=causal)[:, 0]  # (B, T, T)
    assert mask.any(dim=-1).all()
    real_rows = mask[padding_mask]  # (real tokens, T)
    key_is_real = padding_mask[:, None, :].expand_as(mask)[padding_mask]
    assert not (real_rows & ~key_is_real).any()


def test_attention_mask_rejects_non_bool() -> None:
    with pytest.raises(ValueError, match="pass a bool tensor"):
        attention_mask(torch.ones(2, 3), causal=True)


def _reference_attention(
    layer: MultiHeadSelfAttention,
    x: torch.Tensor,
    allowed: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain softmax attention, head by head, to check the reshapes in the layer; ``bias``
    (B, H, T, T) is added to each head's logits."""
    d_model, num_heads = layer.d_model, layer.num_heads
    head_dim = d_model // num_heads
    q, k, v = layer.qkv_activation(layer.qkv(x)).split(d_model, dim=-1)
    heads = []
    for h in range(num_heads):
        part = slice(h * head_dim, (h + 1) * head_dim)
        logits = q[..., part] @ k[..., part].transpose(1, 2) / math.sqrt(head_dim)
        if bias is not None:
            logits = logits + bias[:, h]
        logits = logits.masked_fill(~allowed[:, 0], float("-inf"))
        heads.append(logits.softmax(-1) @ v[..., part])
    return layer.output(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("qkv_activation", [None, "relu"])
@pytest.mark.parametrize("output_projection", [True, False])
def test_self_attention_matches_reference(
    qkv_activation: str | None, output_projection: bool
) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(
        d_model=8,
        num_heads=2,
        dropout=0.5,
        qkv_activation=qkv_activation,
        output_projection=output_projection,
    ).eval()
    x = torch.randn(2, 5, 8)
    allowed = attention_mask(torch.tensor([[F, F, T, T, T], [T, T, T, T, T]]), causal=True)
    torch.testing.assert_close(layer(x, allowed), _reference_attention(layer, x, allowed))


def test_side_scores_are_per_head_scaled_dot_products_of_the_side_features() -> None:
    torch.manual_seed(0)
    scores = SideAttentionScores(side_dim=3, d_model=8, num_heads=2)
    side = torch.randn(2, 5, 3)
    query, key = scores.query_key(side).split(8, dim=-1)  # (B, T, D) each
    for head in range(2):
        part = slice(4 * head, 4 * (head + 1))
        expected = query[..., part] @ key[..., part].transpose(1, 2) / 2.0  # sqrt(D/H) = 2
        torch.testing.assert_close(scores(side)[:, head], expected)


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_adds_the_score_bias_to_its_logits(causal: bool) -> None:
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(d_model=8, num_heads=2, dropout=0.5).eval()
    x = torch.randn(2, 5, 8)
    bias = 3.0 * torch.randn(2, 2, 5, 5)
    allowed = attention_mask(torch.tensor([[F, F, T, T, T], [T, T, T, T, T]]), causal=causal)
    biased = layer(x, allowed, bias)
    torch.testing.assert_close(biased, _reference_attention(layer, x, allowed, bias))
    assert not torch.allclose(biased, layer(x, allowed))
    # a bias on keys the mask forbids changes nothing: they stay excluded
    forbidden = bias.masked_fill(~allowed, 1e4)
    torch.testing.assert_close(layer(x, allowed, forbidden), biased)


def test_block_takes_side_features_exactly_when_built_for_them() -> None:
    padding_mask = torch.ones(2, 4, dtype=torch.bool)
    mask = attention_mask(padding_mask, causal=True)
    x, side = torch.randn(2, 4, 8), torch.randn(2, 4, 3)
    plain = TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.0)
    with_side = TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.0, side_dim=3)
    assert with_side(x, mask, padding_mask, side).shape == (2, 4, 8)
    with pytest.raises(ValueError, match=r"got side=\(2, 4, 3\) for side_dim=0"):
        plain(x, mask, padding_mask, side)
    with pytest.raises(ValueError, match=r"got side=None for side_dim=3"):
        with_side(x, mask, padding_mask)
    with pytest.raises(ValueError, match=r"side_dim=-1 is invalid: pass an integer >= 0"):
        TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.0, side_dim=-1)


@pytest.mark.parametrize("norm_first", [True, False])
def test_transformer_block_shape_and_finite(norm_first: bool) -> None:
    torch.manual_seed(0)
    block = TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.1, norm_first=norm_first)
    x = torch.randn(3, 6, 8)
    padding_mask = torch.zeros(3, 6, dtype=torch.bool)
    padding_mask[:, -1] = True
    out = block(x, attention_mask(padding_mask, causal=True), padding_mask)
    assert out.shape == (3, 6, 8)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("norm_first", [True, False])
def test_transformer_block_is_its_documented_residual_and_norm_order(norm_first: bool) -> None:
    """Pre-norm: x + attn(norm(x)), then + ffn(norm(.)); post-norm: norm(x + attn(x)), then
    norm(. + ffn(.)), each LayerNorm where the docstring puts it (dropout 0)."""
    torch.manual_seed(0)
    block = TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.0, norm_first=norm_first)
    with torch.no_grad():  # norms that are not the identity, so a missing one shows
        for norm in (block.attention_norm, block.feed_forward_norm):
            norm.weight.uniform_(0.5, 2.0)
            norm.bias.normal_()
    x = torch.randn(2, 4, 8) * 3 + 1
    padding_mask = torch.ones(2, 4, dtype=torch.bool)
    mask = attention_mask(padding_mask, causal=True)
    with torch.no_grad():
        out = block(x, mask, padding_mask)
        if norm_first:
            h = x + block.attention(block.attention_norm(x), mask)
            expected = h + block.feed_forward(block.feed_forward_norm(h))
        else:
            h = block.attention_norm(x + block.attention(x, mask))
            expected = block.feed_forward_norm(h + block.feed_forward(h))
    torch.testing.assert_close(out, expected)


# --- BSARec's low-pass branch ----------------------------------------------------------------


def _bsarec_low_pass(window: torch.Tensor, frequencies: int) -> torch.Tensor:
    """BSARec's FrequencyLayer without beta: keep the c // 2 + 1 lowest rfft bins of the window."""
    spectrum = torch.fft.rfft(window, dim=1, norm="ortho")
    spectrum[:, frequencies // 2 + 1 :] = 0
    return torch.fft.irfft(spectrum, n=window.shape[1], dim=1, norm="ortho")


def _low_pass_only(**kwargs: object) -> LowPassFilter:
    layer = LowPassFilter(**kwargs)
    with torch.no_grad():
        layer.sqrt_beta.zero_()  # beta = 0: the output is the low-pass part alone
    return layer


@pytest.mark.parametrize("frequencies", [1, 3, 5, 9])
def test_causal_low_pass_is_bsarec_on_every_prefix(frequencies: int) -> None:
    """Position t of the causal filter equals BSARec's FFT low-pass at the last position of the
    prefix ending at t, right-aligned in a zero-padded window of max_seq_len."""
    torch.manual_seed(0)
    length, d_model = 10, 3
    layer = _low_pass_only(max_seq_len=length, d_model=d_model, frequencies=frequencies)
    x = torch.randn(2, 7, d_model)
    padding_mask = _window("..xxxxx", "xxxxxxx")
    out = layer(x, padding_mask)
    for t in range(7):
        prefix = (x * padding_mask[..., None])[:, : t + 1]
        window = torch.zeros(2, length, d_model)
        window[:, length - t - 1 :] = prefix
        expected = _bsarec_low_pass(window, frequencies)[:, -1]
        torch.testing.assert_close(out[:, t], expected, atol=1e-6, rtol=0)


def test_non_causal_low_pass_is_bsarec_on_the_window() -> None:
    torch.manual_seed(0)
    layer = _low_pass_only(max_seq_len=6, d_model=4, frequencies=3, causal=False)
    x = torch.randn(2, 6, 4)
    padding_mask = _window("...xxx", "xxxxxx")
    expected = _bsarec_low_pass(x * padding_mask[..., None], 3)
    torch.testing.assert_close(layer(x, padding_mask), expected, atol=1e-6, rtol=0)
    # every frequency kept would make the projection the identity: a branch that filters
    # nothing, refused by name (an audit passed filter_frequencies=1000 for windows of 20)
    for causal in (False, True):
        with pytest.raises(ValueError, match=r"filter_frequencies=6 keeps all 4 frequencies"):
            _low_pass_only(max_seq_len=6, d_model=4, frequencies=6, causal=causal)
    _low_pass_only(max_seq_len=6, d_model=4, frequencies=5, causal=False)  # 3 of 4: a filter


def test_low_pass_adds_beta_squared_high_pass_and_ignores_padding_rows() -> None:
    torch.manual_seed(0)
    layer = LowPassFilter(max_seq_len=8, d_model=4, frequencies=5)
    x = torch.randn(1, 5, 4)
    padding_mask = _window("..xxx")
    junk = torch.where(padding_mask[..., None], x, torch.randn(1, 5, 4) * 100)
    low = _low_pass_only(max_seq_len=8, d_model=4, frequencies=5)(x, padding_mask)
    expected = low + layer.sqrt_beta**2 * (x * padding_mask[..., None] - low)
    torch.testing.assert_close(layer(x, padding_mask), expected)
    torch.testing.assert_close(layer(junk, padding_mask)[:, 2:], expected[:, 2:])


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_mixes_low_pass_and_attention_by_filter_mix(norm_first: bool) -> None:
    torch.manual_seed(0)
    kwargs = {"d_model": 8, "num_heads": 2, "ffn_dim": 4, "dropout": 0.0, "norm_first": norm_first}
    block = TransformerBlock(**kwargs, filter_mix=0.7, max_seq_len=6).eval()
    x = torch.randn(2, 5, 8)
    padding_mask = _window(".xxxx", "xxxxx")
    mask = attention_mask(padding_mask, causal=True)
    h = block.attention_norm(x) if norm_first else x
    mixed = 0.7 * block.low_pass(h, padding_mask) + 0.3 * block.attention(h, mask)
    assert torch.allclose(block._mix(h, mask, padding_mask, None), mixed)
    out = block(x, mask, padding_mask)
    assert out.shape == (2, 5, 8) and torch.isfinite(out).all()
    assert TransformerBlock(**kwargs).low_pass is None  # filter_mix=0: attention only


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"filter_mix": 1.5}, r"filter_mix=1.5 is invalid: pass a weight in \[0, 1\]"),
        ({"filter_mix": True}, r"filter_mix=True is invalid"),
        ({"filter_mix": 0.5}, r"filter_mix > 0 needs max_seq_len"),
        ({"filter_mix": 0.5, "max_seq_len": 6, "filter_frequencies": 0}, r"filter_frequencies=0"),
    ],
)
def test_block_filter_validation(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformerBlock(d_model=8, num_heads=2, ffn_dim=4, dropout=0.0, **overrides)


def test_feed_forward_shape() -> None:
    ffn = FeedForward(d_model=8, hidden_dim=2, dropout=0.0, activation="relu")
    assert ffn(torch.randn(2, 3, 8)).shape == (2, 3, 8)


def _window(*rows: str) -> torch.Tensor:
    """Padding masks from strings: '.' = padding, 'x' = real token (left-padded)."""
    return torch.tensor([[c == "x" for c in row] for row in rows])


def test_sinusoidal_values() -> None:
    encoding = SinusoidalPositionalEncoding(max_seq_len=4, d_model=6)
    table = encoding(_window("xxxx"))
    assert table.shape == (4, 6)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    torch.testing.assert_close(table[3, 0], torch.tensor(math.sin(3.0)))
    torch.testing.assert_close(table[3, 3], torch.tensor(math.cos(3.0 / 10000 ** (2 / 6))))
    # a narrower window gets the last positions: the most recent event keeps position L-1
    torch.testing.assert_close(encoding(_window(".x")), table[2:])
    assert "table" not in encoding.state_dict()  # derived from the arguments, not a weight


def test_sinusoidal_odd_width() -> None:
    mask = _window("xxxx")
    assert SinusoidalPositionalEncoding(max_seq_len=4, d_model=5)(mask).shape == (4, 5)


def test_learned_positional_shape_and_length_check() -> None:
    encoding = LearnedPositionalEncoding(max_seq_len=4, d_model=3)
    assert encoding(_window("xx")).shape == (2, 3)
    torch.testing.assert_close(encoding(_window("xx")), encoding(_window("xxxx"))[2:])
    with pytest.raises(ValueError, match="T=5 exceeds max_seq_len=4"):
        encoding(_window("xxxxx"))


def test_position_index_origins() -> None:
    mask = _window("..xx", "xxxx", "...x")
    # last: the most recent event is always L-1, whatever the padding (one row for all)
    assert position_index(mask, 6, "last").tolist() == [2, 3, 4, 5]
    # first: the window's first real event is 0; padding takes 0
    assert position_index(mask, 6, "first").tolist() == [[0, 0, 0, 1], [0, 1, 2, 3], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="position_origin='middle' is not supported"):
        LearnedPositionalEncoding(max_seq_len=4, d_model=3, origin="middle")


def test_first_origin_makes_a_token_independent_of_later_events() -> None:
    """With origin "first" a token's position is the same in the whole window and in any prefix
    of it, which is what makes causal training at every position match evaluation."""
    encoding = LearnedPositionalEncoding(max_seq_len=5, d_model=3, origin="first")
    full = encoding(_window(".xxxx"))  # events e0..e3
    prefix = encoding(_window("...xx"))  # events e0..e1, left-padded to the same width
    torch.testing.assert_close(full[0, 1:3], prefix[0, 3:5])
    last = LearnedPositionalEncoding(max_seq_len=5, d_model=3, origin="last")
    last.load_state_dict(encoding.state_dict())
    assert not torch.allclose(last(_window(".xxxx"))[1:3], last(_window("...xx"))[3:5])


def test_constructor_messages() -> None:
    with pytest.raises(ValueError, match="d_model=100 is not divisible by num_heads=3"):
        MultiHeadSelfAttention(d_model=100, num_heads=3, dropout=0.0)
    with pytest.raises(ValueError, match=r"qkv_activation='tanh' is not supported"):
        MultiHeadSelfAttention(d_model=8, num_heads=2, dropout=0.0, qkv_activation="tanh")
    with pytest.raises(ValueError, match=r"dropout=1.0 is invalid"):
        FeedForward(d_model=8, hidden_dim=4, dropout=1.0)
    with pytest.raises(ValueError, match=r"activation='swish' is not supported"):
        FeedForward(d_model=8, hidden_dim=4, dropout=0.0, activation="swish")


def test_dropout_keeps_each_value_with_probability_1_minus_p_scaled_up() -> None:
    """The CPU mask (uniform draws >= p) is nn.Dropout's Bernoulli(1 - p), scaled by 1/(1-p)."""
    torch.manual_seed(0)
    x = torch.rand(200, 500) + 1.0  # no zeros of its own
    x.requires_grad_(True)
    dropout = Dropout(0.3).train()
    out = dropout(x)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005  # 100 k draws: ~0.0015 std
    torch.testing.assert_close(out[kept], x[kept] / 0.7)
    out.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.7)  # the gradient takes the same mask
    # a seed gives the same mask; evaluation mode and p 0 change nothing
    torch.manual_seed(1)
    first = dropout(x)
    torch.manual_seed(1)
    assert torch.equal(dropout(x), first)
    assert dropout.eval()(x) is x and Dropout(0.0).train()(x) is x
    for wrong in (1.0, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="dropout="):
            Dropout(wrong)


def test_dropout_off_the_cpu_is_torch_dropout() -> None:
    """Other devices take F.dropout (fused kernels): on the meta device, shapes only."""
    x = torch.empty(4, 8, device="meta")
    out = Dropout(0.5).train()(x)
    assert out.device.type == "meta" and out.shape == x.shape


@pytest.mark.gpu
def test_dropout_on_the_gpu_keeps_1_minus_p() -> None:
    x = torch.ones(1000, 1000, device="cuda")
    out = Dropout(0.25).train()(x)
    assert abs((out != 0).float().mean().item() - 0.75) < 0.005
    torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / 0.75))
