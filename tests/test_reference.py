"""The NumPy reference model's operations against plain float64 formulas, and its cache against a full recompute."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from nllbcli.model.checkpoint import load_checkpoint
from nllbcli.model.engine import numerics
from nllbcli.model.engine import reference as ref
from nllbcli.model.engine.products import Products

HERE = Path(__file__).parent
rng = np.random.default_rng(0)


def test_layernorm_matches_float64():
    x = rng.normal(3.0, 2.0, (5, 7, 48)).astype(np.float32)
    w, b = rng.normal(1, 0.2, 48).astype(np.float32), rng.normal(0, 0.2, 48).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(ref.layernorm(x, w, b), expected, rtol=1e-5, atol=1e-5)


def test_sinusoidal_positions_follow_fairseq():
    table = numerics.sinusoidal_positions(20, 10, padding_idx=1)
    half = 5
    freqs = np.exp(np.arange(half) * -(np.log(10000) / (half - 1)))
    angles = np.arange(20)[:, None] * freqs[None]
    expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    expected[1] = 0
    np.testing.assert_allclose(table, expected, atol=2e-6)
    assert numerics.sinusoidal_positions(6, 7, padding_idx=1).shape == (6, 7)  # odd width: a zero column


def test_attention_ignores_masked_keys():
    q, k, v = (rng.normal(size=(2, 3, 16)).astype(np.float32) for _ in range(3))
    mask = np.array([[True, True, False], [True, True, True]])
    out = ref.attention(q, k, v, mask, heads=4)
    alone = ref.attention(q[:1], k[:1, :2], v[:1, :2], None, heads=4)
    np.testing.assert_allclose(out[:1], alone, rtol=1e-6, atol=1e-6)
    # float64, head by head
    e = 4
    for h in range(4):
        s = q[1, :, h * e:(h + 1) * e].astype(np.float64) @ k[1, :, h * e:(h + 1) * e].T.astype(np.float64) / 2.0
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(out[1, :, h * e:(h + 1) * e], p @ v[1, :, h * e:(h + 1) * e], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split_p", [True, False])
@pytest.mark.parametrize("e", [64, 128])
@pytest.mark.parametrize("n", [1, 2, 17, 33, 64, 65, 200, 256])
def test_attention_prefill_mma_is_within_its_bound_of_float64(n, e, split_p):
    """The tensor-core kernel's numerics against float64 attention: each output within its bf16 rounding,
    2^-8 of itself, plus the error of P's weights, u max|v - out| <= 2 u max|v| for weights within u of themselves:
    u = 2^-16 for P as bf16 hi + lo (lo within 2^-8 of P - hi, itself within 2^-8 of P), u = 2^-8 for bf16 P.
    Sharp scores (queries 4x) and flat ones; 65 keys and more take the running max over several 64-key chunks."""
    heads = 2
    for sharpness in (1.0, 4.0):
        q = ref.bf16_round((rng.normal(size=(n, heads * e)) * sharpness).astype(np.float32))
        k, v = (ref.bf16_round(rng.normal(size=(n, heads * e)).astype(np.float32)) for _ in range(2))
        want = ref.attention(q[None].astype(np.float64), k[None].astype(np.float64), v[None].astype(np.float64), None, heads)[0]
        got = ref.attention_prefill_mma(q, k, v, heads, split_p=split_p)
        weights = 2.0**-15 if split_p else 2.0**-7
        assert (np.abs(got - want) <= 2.0**-8 * np.abs(want) + weights * np.abs(v).max()).all()
        if n == 1:  # one key: P = 1 exactly, the output is v's row
            np.testing.assert_array_equal(got, v)


def test_log_softmax_matches_float64():
    x = rng.normal(0, 5, (3, 50)).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 - x64.max(-1, keepdims=True) - np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True))
    np.testing.assert_allclose(numerics.log_softmax(x), expected, rtol=1e-5, atol=1e-5)


def sorted_topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """topk_desc's meaning: a stable sort of each row, largest first (ties: lower id)."""
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=1), order


@pytest.mark.parametrize("seed", range(40))
def test_topk_desc_is_a_stable_sorts_first_k_with_ties_and_long_rows(seed):
    """The partitioned path (rows longer than 4k) as a sort would give it: the k best, best first, a tie to the
    lower id, also where the k-th value is shared beyond the k, a row is all one value, or -inf."""
    rng = np.random.default_rng(seed)
    n, v = int(rng.integers(1, 40)), int(rng.integers(40, 4000))
    k = int(rng.integers(1, v // 4))
    x = rng.standard_normal((n, v)).astype(np.float32)
    x = [x, np.round(x * 2), np.round(x * 30), np.full_like(x, 0.5)][seed % 4]
    if seed % 5 == 0:
        x[0] = -np.inf
    values, ids = numerics.topk_desc(x, k)
    expected_values, expected_ids = sorted_topk(x, k)
    assert np.array_equal(ids, expected_ids) and np.array_equal(values, expected_values)


@pytest.fixture(scope="module")
def engine():
    config, weights = load_checkpoint(HERE / "models" / "tiny-a")
    return ref.ReferenceEngine(config, weights)


def test_padding_does_not_change_a_source(engine):
    """A source's cross K/V are those of it alone, bit for bit, beside longer and shorter sources and sources of
    its own length; zeros past its end."""
    short, long = [400 + 47, 20, 30, 40, 2], [400 + 47] + list(range(10, 30)) + [2]
    alone = engine.encode([short])
    batch = engine.encode([long, short, [447, 5, 2], [447, 50, 60, 70, 2]])
    assert batch.mask.sum(axis=1).tolist() == [len(long), len(short), 3, 5]
    for layer in range(engine.config.decoder_layers):
        for name in ("cross_k", "cross_v"):
            padded = getattr(batch, name)[layer]
            np.testing.assert_array_equal(padded[1, : len(short)], getattr(alone, name)[layer][0])
            assert not padded[1, len(short) :].any()


def test_a_rows_product_does_not_depend_on_the_other_rows():
    """linear gives each row what it gives the row alone, bit for bit, whatever the number of rows and the row's
    place (x @ w.T need not: BLAS picks its kernels by the number of rows), at K past MLAS's K stride and N past
    its N stride, on one thread and with the columns shared among 2 and 3 threads; and it is the product, as
    float64 says."""
    w = rng.normal(size=(3 * 128 + 5, 300)).astype(np.float32)
    bias = rng.normal(size=w.shape[0]).astype(np.float32)
    x = rng.normal(size=(40, 300)).astype(np.float32)
    products = Products()
    products.spread_work = 0  # the columns shared among the threads at any size
    alone = np.stack([ref.linear(row[None], w, bias, products)[0] for row in x])
    with ThreadPoolExecutor(3) as pool:
        for spread in (ref.ALONE, ref.Spread(2, pool.map), ref.Spread(3, pool.map)):
            for rows in ([0], [3, 1], list(range(7)), list(range(40)), [5] * 9 + [2], list(range(39, -1, -1))):
                np.testing.assert_array_equal(ref.linear(x[rows], w, bias, products, spread), alone[rows])
    np.testing.assert_array_equal(ref.linear(x.reshape(8, 5, 300), w, bias, products), alone.reshape(8, 5, -1))
    np.testing.assert_allclose(alone, x.astype(np.float64) @ w.T.astype(np.float64) + bias, rtol=1e-5, atol=1e-4)


def test_attention_over_padding_gives_each_row_its_own_keys_result():
    """Keys padded to any length with anything (masked) give each row the bits of its own keys alone, and
    attention()'s values (float64 there)."""
    heads, e = 4, 16
    lengths = [1, 2, 5, 8, 9, 13]
    n, longest = len(lengths), max(lengths) + 7
    q = rng.normal(size=(n, 1, heads * e)).astype(np.float32)
    k, v = (rng.normal(size=(n, longest, heads * e)).astype(np.float32) for _ in range(2))
    mask = np.arange(longest)[None, :] < np.array(lengths)[:, None]
    for pad in (0, 1, 3, 7):
        out = ref.attention_over_padding(q, k[:, : max(lengths) + pad], v[:, : max(lengths) + pad],
                                         mask[:, : max(lengths) + pad], heads)
        for r, length in enumerate(lengths):
            alone = ref.attention_over_padding(q[r : r + 1], k[r : r + 1, :length], v[r : r + 1, :length],
                                               mask[r : r + 1, :length], heads)
            np.testing.assert_array_equal(out[r], alone[0])
            want = ref.attention(q[r : r + 1].astype(np.float64), k[r : r + 1, :length].astype(np.float64),
                                 v[r : r + 1, :length].astype(np.float64), None, heads)
            np.testing.assert_allclose(out[r], want[0], rtol=1e-5, atol=1e-6)


def full_decoder_logits(engine, encoded, row, tokens):
    """The decoder without a cache: every position at once with a causal mask; logits of the last one."""
    c, w = engine.config, engine.w
    t = len(tokens)
    ids = np.array(tokens)[None]
    positions = np.arange(t)[None] + c.pad_token_id + 1
    h = ref.embed(ids, positions, w["decoder.embed_tokens.weight"], c.embed_scale, engine.pos_table)
    src_mask = encoded.mask[row : row + 1]
    for i in range(c.decoder_layers):
        p = f"decoder.layers.{i}."
        x = ref.layernorm(h, w[p + "self_attn_layer_norm.weight"], w[p + "self_attn_layer_norm.bias"])
        out = np.concatenate([
            engine.attention_block(p + "self_attn.", x[:, j : j + 1], x[:, : j + 1], None, c.decoder_attention_heads)
            for j in range(t)
        ], axis=1)
        h = h + out
        x = ref.layernorm(h, w[p + "encoder_attn_layer_norm.weight"], w[p + "encoder_attn_layer_norm.bias"])
        a = p + "encoder_attn."
        q = ref.linear(x, w[a + "q_proj.weight"], w[a + "q_proj.bias"])
        att = ref.attention(q, encoded.cross_k[i][row : row + 1], encoded.cross_v[i][row : row + 1], src_mask, c.decoder_attention_heads)
        h = h + ref.linear(att, w[a + "out_proj.weight"], w[a + "out_proj.bias"])
        x = ref.layernorm(h, w[p + "final_layer_norm.weight"], w[p + "final_layer_norm.bias"])
        h = h + engine.ffn(p, x)
    h = ref.layernorm(h[:, -1], w["decoder.layer_norm.weight"], w["decoder.layer_norm.bias"])
    return ref.linear(h, w["lm_head.weight"])[0]


def test_cached_steps_equal_a_full_recompute(engine):
    sources = [[447, 20, 30, 40, 50, 2], [447, 60, 2]]
    encoded = engine.encode(sources)
    state = engine.start(encoded, np.array([0, 1, 1]), 8)  # two rows read source 1, as beams do
    prefixes = [[], [], []]
    for tokens in ([2, 2, 2], [470, 470, 470], [5, 9, 11], [100, 200, 300]):
        logits = engine.step(encoded, state, np.array(tokens))
        prefixes = [p + [t] for p, t in zip(prefixes, tokens)]
        for r, row in enumerate([0, 1, 1]):
            np.testing.assert_allclose(logits[r], full_decoder_logits(engine, encoded, row, prefixes[r]), rtol=1e-4, atol=1e-4)
    # beams follow their parents: after select, row 0 continues row 2's cache
    engine.select(state, np.array([2, 0]))
    logits = engine.step(encoded, state, np.array([7, 7]))
    np.testing.assert_allclose(logits[0], full_decoder_logits(engine, encoded, 1, prefixes[2] + [7]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1], full_decoder_logits(engine, encoded, 0, prefixes[0] + [7]), rtol=1e-4, atol=1e-4)


def test_bf16_round_is_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.005859375, 1.01171875, -3.14159, 0.0], dtype=np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one, 1.0
    np.testing.assert_array_equal(ref.bf16_round(x), np.array([1.0, 1.0, 1.0078125, 1.015625, -3.140625, 0.0], np.float32))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_decoder_cache_holds_what_the_rows_fill(monkeypatch, beam_size):
    """--max-length 200 on translations of a dozen tokens: the cache holds a few dozen positions, not 201, and
    every step's logits are bit for bit those of a cache made whole at the start."""
    from nllbcli.options import DecodeOptions
    from nllbcli.model.search import generate_ids
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    sample = HERE.parent / "data" / "samples" / "model"
    config, weights = load_checkpoint(sample)
    tokenizer = tokenizer_from_model_dir(sample, config)
    lines = (HERE.parent / "data" / "samples" / "heldout" / "eng_Latn.txt").read_text().splitlines()[:6]
    sources = [tokenizer.encode(line, "eng_Latn") for line in lines]
    engine = ref.ReferenceEngine(config, weights)
    step = engine.step

    def run() -> tuple[list, list, list]:
        rooms, logits = [], []

        def spy(encoded, state, tokens, want_logits=True):
            out = step(encoded, state, tokens, want_logits)
            rooms.append(state.self_k[0].shape[1])
            logits.append(out)
            return out

        monkeypatch.setattr(engine, "step", spy)
        ids = generate_ids(engine, sources, tokenizer.lang_id("fra_Latn"), config, DecodeOptions(beam_size, 200))
        return ids, rooms, logits

    grown, rooms, logits = run()
    assert max(len(ids) for ids in grown) < 30
    assert max(rooms) <= 64
    monkeypatch.setattr(ref, "FIRST_ROOM", 10**6)  # room for every position from the start
    whole, whole_rooms, whole_logits = run()
    assert set(whole_rooms) == {201}
    assert whole == grown
    assert len(whole_logits) == len(logits)
    assert all(np.array_equal(a, b) for a, b in zip(logits, whole_logits) if a is not None)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [1, 0, 2, 2, 5, 3], [5, 5, 5, 5, 5, 5], [0, 2, 5], [4, 1], [], [3]])
def test_gather_rows_gives_the_rows_asked_for_in_place(rows):
    """Beams following their parents (swaps, repeats) and rows leaving: the cache's first len(rows) rows hold
    what cache[rows] held, in its filled positions, whatever row another row overwrote before."""
    cache = rng.normal(size=(6, 9, 4)).astype(np.float32)
    before = cache.copy()
    kept = ref.gather_rows(cache, np.array(rows, dtype=np.int64), 7)
    assert kept.shape == (len(rows), 9, 4) and (not rows or np.shares_memory(kept, cache))
    np.testing.assert_array_equal(kept[:, :7], before[rows, :7])
    untouched = [n for n, row in enumerate(rows) if row == n]
    np.testing.assert_array_equal(kept[untouched], before[untouched])  # the rows that keep their place: not copied
