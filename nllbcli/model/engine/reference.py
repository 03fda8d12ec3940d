"""The NumPy float32 reference model: M2M-100/NLLB's math, one small function per operation.

It is the oracle for the GPU engine and what runs where there is no GPU. The operations follow
transformers' M2M100ForConditionalGeneration step by step (same order of float32 operations where it matters).

A sentence's arithmetic does not depend on its batch, so neither do its translation and scores, to the last bit:
the encoder takes the sources of each length together, unpadded (encode); every matrix product goes through
products.Products (onnxruntime's MLAS on a packed weight), which gives a row the bits it gives the row alone; and
the decoder attends over a padded source in an order the padding leaves alone (attention_over_padding). NumPy's
own matrix product over several sentences' rows would let BLAS pick its kernels and blockings by their number
(and a row's bits follow its place among them), and NumPy's pairwise sums group their terms by the length summed,
padding included. Nor does it depend on the number of threads: the engine shares a product's output columns among
its own threads (ProductThreads), each part's sums those of the whole product.

Letters: B sources, S source length, N decoder rows (one per live sequence or beam), T decoder positions,
D d_model, H heads, E head size (D / H), F FFN size, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
from threadpoolctl import ThreadpoolController

from ..checkpoint import ModelConfig
from . import OnHost, RowPositions
from .products import Int8Products, Products
from .numerics import (E4M3Matrix, dequantize_e4m3, dequantize_heads, gumbel_noise, inverse_temperature, log_softmax,
                       quantize_e4m3, quantize_heads, sinusoidal_positions, step_keys, to_host, topk_desc)

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which M2M-100 uses everywhere
FIRST_ROOM = 32  # decoder positions a cache holds at least to begin with (DecoderState.room)
ROWS_A_THREAD = 32  # a decoder step's rows each thread takes at least for the step to be shared out by rows


# ------------------------------------------------------------------------------------------------ operations


def layernorm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """LayerNorm over the last axis with bias (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * weight + bias


@dataclass(frozen=True)
class Spread:
    """How work is spread: over `threads` threads, by `map` (the results in order)."""

    threads: int = 1
    map: Callable = map


ALONE = Spread()  # on the calling thread


class ProductThreads:
    """The threads of the engine's matrix products: each product's output columns shared among as many Python
    threads as BLAS was given (--threads holds BLAS to that number while a job runs; else the library's own), each
    part on one thread, and BLAS held to one thread meanwhile (NumPy's attention products). A library splitting a
    product among its own threads may split the sums by their number, and the result's last bits would follow:
    --threads 1 and 2, or --devices workers given a share of the threads, would give other scores."""

    def __init__(self):
        self.blas = ThreadpoolController().select(user_api="blas")
        self.executor: ThreadPoolExecutor | None = None
        self.workers = 0

    @contextmanager
    def spreading(self):
        """BLAS held to one thread while the block runs, which gets the Spread to run the products by."""
        threads = max((library["num_threads"] for library in self.blas.info()), default=1)
        with self.blas.limit(limits=1):
            if threads == 1:
                yield ALONE
                return
            if self.workers != threads:
                if self.executor is not None:
                    self.executor.shutdown()
                self.executor, self.workers = ThreadPoolExecutor(threads, "nllb-products"), threads
            yield Spread(threads, self.executor.map)


def split_evenly(count: int, parts: int) -> list[slice]:
    """range(count) in `parts` slices of sizes within one of each other (fewer where count is smaller)."""
    bounds = np.linspace(0, count, min(max(parts, 1), count) + 1).astype(int)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def linear(x: np.ndarray, weight, bias: np.ndarray | None = None, products: Products | None = None,
           spread: Spread = ALONE) -> np.ndarray:
    """x (..., K) @ weight.T + bias by `products` (a model's Products; a new one where None), the output columns
    shared among the spread's threads where the work is worth handing out (products.spread_work). An E4M3Matrix
    weight (--compute-type float8) takes x rounded to E4M3 with a scale a row, as the GPU's FP8 product takes its
    input."""
    if isinstance(weight, E4M3Matrix):
        x, weight = dequantize_e4m3(*quantize_e4m3(x)), weight.values
    products = products or Products()
    rows = x.reshape(-1, x.shape[-1])
    if spread.threads == 1 or rows.shape[0] * weight.size < products.spread_work:
        return products(x, weight, bias)
    y = np.empty((rows.shape[0], weight.shape[0]), np.float32)

    def multiply(columns: slice) -> None:
        y[:, columns] = products(rows, weight, bias, columns)

    list(spread.map(multiply, split_evenly(weight.shape[0], spread.threads)))
    return y.reshape(x.shape[:-1] + (weight.shape[0],))


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32).reshape(x.shape)


def unrounded(x: np.ndarray) -> np.ndarray:
    """float32 values as they are (the engine's rounding where bf16 activations are off)."""
    return x


def e4m3_heads_round(x: np.ndarray, head_size: int) -> np.ndarray:
    """K or V rows (..., D) as an FP8 K/V cache holds them (--kv-cache-type float8): E4M3 codes with a scale a head
    of head_size values (numerics.quantize_heads), as float32 values."""
    return dequantize_heads(*quantize_heads(x, head_size))


def activation(x: np.ndarray, name: str) -> np.ndarray:
    if name == "relu":
        return np.maximum(x, np.float32(0))
    # exact (erf) GELU, torch's default
    from math import erf, sqrt

    return (0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))).astype(np.float32)


def embed(ids: np.ndarray, positions: np.ndarray, table, scale: float, pos_table: np.ndarray) -> np.ndarray:
    """Token embedding times sqrt(D) (when the model scales) plus the sinusoidal position rows. (..., D)"""
    rows = table.rows(ids) if isinstance(table, E4M3Matrix) else table[ids]
    return rows * np.float32(scale) + pos_table[positions]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, key_mask: np.ndarray | None, heads: int) -> np.ndarray:
    """Scaled dot-product attention over all keys a query may see.

    q (N, Tq, D), k and v (N, Tk, D), key_mask (N, Tk) True where a key may be attended (None: all). -> (N, Tq, D)
    """
    n, tq, d = q.shape
    tk = k.shape[1]
    e = d // heads
    qh = q.reshape(n, tq, heads, e).transpose(0, 2, 1, 3)  # (N, H, Tq, E)
    kh = k.reshape(n, tk, heads, e).transpose(0, 2, 3, 1)  # (N, H, E, Tk)
    vh = v.reshape(n, tk, heads, e).transpose(0, 2, 1, 3)  # (N, H, Tk, E)
    scores = (qh @ kh) * np.float32(e**-0.5)  # (N, H, Tq, Tk)
    if key_mask is not None:
        scores = np.where(key_mask[:, None, None, :], scores, np.float32(-np.inf))
    out = softmax(scores) @ vh  # (N, H, Tq, E)
    return out.transpose(0, 2, 1, 3).reshape(n, tq, d)


def attention_e4m3(q: np.ndarray, k_codes: np.ndarray, k_scales: np.ndarray, v_codes: np.ndarray,
                   v_scales: np.ndarray, key_mask: np.ndarray | None, heads: int) -> np.ndarray:
    """attention() over keys and values held as an FP8 K/V cache holds them: E4M3 codes (N, Tk, D) with a scale a
    head (N, Tk, H) (numerics.quantize_heads), their values taken as codes' values times scales. The model of
    kernels.attention over Fp8Rows (attention.cu's attention_e4m3_kernel, attention_decode_e4m3_*), which take the
    scales out of the sums: a score is k's scale times q's dot product with the codes' values, a weight times v's
    scale multiplies the codes' values; the same up to float32 rounding. -> (N, Tq, D)"""
    return attention(q, dequantize_heads(k_codes, k_scales), dequantize_heads(v_codes, v_scales), key_mask, heads)


def copy_rows_e4m3(src: np.ndarray, src_rows: np.ndarray, codes: np.ndarray, scales: np.ndarray,
                   dst_rows: np.ndarray) -> None:
    """kernels.copy_rows into Fp8Rows (cache.cu's copy_rows_e4m3_kernel), in place: row src_rows[r] of src (R', W)
    float32 quantized a head at a time (numerics.quantize_heads, head size W / scales.shape[1]) into codes[dst_rows[r]]
    (W,) uint8 and scales[dst_rows[r]] (G,) float32."""
    head_size = src.shape[1] // scales.shape[1]
    codes[dst_rows], scales[dst_rows] = quantize_heads(src[src_rows], head_size)


def attention_over_padding(q: np.ndarray, k: np.ndarray, v: np.ndarray, key_mask: np.ndarray, heads: int) -> np.ndarray:
    """attention() of one query a row over keys right-padded to a common length, each row's result that of its
    own keys alone, whatever the padding: a score sums its head's E products (a length the model fixes), and
    the softmax's total and the weighted sum of the values add the keys one after another, in order, so that
    the keys past a row's end (weight 0) add exact zeros at the end. (A matrix product over the keys and
    NumPy's pairwise sum along them group the terms by the padded length; einsum adds along an axis that is
    not the innermost one term after another, which tests/test_reference.py holds it to.)

    q (N, 1, D), k and v (N, Tk, D), key_mask (N, Tk) True at each row's own keys. -> (N, 1, D)
    """
    n, _, d = q.shape
    tk, e = k.shape[1], d // heads
    vh = v.reshape(n, tk, heads, e)
    scores = np.einsum("nkhe,nhe->nkh", k.reshape(n, tk, heads, e), q.reshape(n, heads, e)) * np.float32(e**-0.5)
    scores = np.where(key_mask[:, :, None], scores, np.float32(-np.inf))  # (N, Tk, H)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= np.einsum("nkh->nh", weights)[:, None, :]
    return np.einsum("nkh,nkhe->nhe", weights, vh).reshape(n, 1, d)


def attention_prefill_mma(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, split_p: bool = True,
                          chunk: int = 64) -> np.ndarray:
    """attention.cu's attention_prefill_mma kernels' numerics, one sequence's self-attention: scores in f32
    (bf16 products are exact, the tensor cores add in f32), keys in chunks of `chunk` with a running max m, sum l
    and output O rescaled by exp(m_old - m_new), P = exp(s - m) in f32 taken into P V as bf16 hi = bf16(P) plus
    lo = bf16(P - hi) (split_p False: hi alone, P to 2^-8 of itself), l the sum of those weights, O / l rounded to
    bf16. reference.attention's softmax divides exact P instead: this differs from it by at most about
    max|v - out| * 2^-16 (split) or 2^-8 (hi alone), besides the output's rounding.
    q, k, v (S, D) float32 holding bf16 values. -> (S, D) float32 holding bf16 values."""
    s_len, d = q.shape
    e = d // heads
    out = np.empty((s_len, d), np.float32)
    for h in range(heads):
        cols = slice(h * e, (h + 1) * e)
        scores = (q[:, cols] @ k[:, cols].T) * np.float32(e**-0.5)  # (S, S) f32
        m = np.full((s_len, 1), -np.inf, np.float32)
        total = np.zeros((s_len, 1), np.float32)
        acc = np.zeros((s_len, e), np.float32)
        for c0 in range(0, s_len, chunk):
            sc = scores[:, c0 : c0 + chunk]
            top = np.maximum(m, sc.max(axis=1, keepdims=True))
            alpha = np.exp(m - top)  # 0 at the first chunk
            p = np.exp(sc - top)
            hi = bf16_round(p)
            w = hi + bf16_round(p - hi) if split_p else hi
            total = total * alpha + w.sum(axis=1, keepdims=True)
            acc = acc * alpha + w @ v[c0 : c0 + chunk, cols]
            m = top
        out[:, cols] = acc * (np.float32(1) / total)
    return bf16_round(out)


# ------------------------------------------------------------------------------------------------ the model


@dataclass
class EncoderOutput:
    """What the decoder needs from the encoder, per source."""

    mask: np.ndarray  # (B, S) True at real tokens
    cross_k: list[np.ndarray]  # per decoder layer (B, S, D): projected once, they depend only on the encoder output
    cross_v: list[np.ndarray]


@dataclass
class DecoderState(RowPositions):
    """The decoder's cache for N rows, each reading one source, all at the same position (RowPositions)."""

    source_rows: np.ndarray  # (N,) which source each row reads: rows with equal values read the same cross K/V
    self_k: list[np.ndarray]  # per layer (N, T_room, D): room for T_room positions, grown as the rows need more
    self_v: list[np.ndarray]
    cross_k: list[np.ndarray]  # per layer (N, S, D): each row's source K/V, gathered when the rows change
    cross_v: list[np.ndarray]
    src_mask: np.ndarray  # (N, S)
    t: np.ndarray  # (N,) positions filled, per row
    max_positions: int  # the most positions a row may fill: the cache never grows past it
    keys: np.ndarray | None = None  # (N,) uint32 each row's random stream, for sampling (set_keys)

    @property
    def room(self) -> int:
        """Positions each row's cache holds now."""
        return self.self_k[0].shape[1]


class ReferenceEngine:
    """The float32 model on NumPy, behind the calls the search makes."""

    xp = np  # where the search keeps its beam arrays

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray], bf16_activations: bool = False,
                 int8: bool = False, kv_float8: bool = False):
        self.config = config
        self.w = weights
        # bf16_activations: round every GEMM input and every stored K/V to bfloat16 where the GPU engine does,
        # so that the GPU can be checked against the same numbers, not only against float32.
        self.r = bf16_round if bf16_activations else unrounded
        # kv_float8 (--kv-cache-type float8): every K and V the decoder keeps (a step's self-attention K/V, the cross
        # K/V at encode) rounded to E4M3 with a scale a (row, head) as it is kept, as the GPU's FP8 pool holds them
        self.kv_float8 = kv_float8
        head_size = config.d_model // config.decoder_attention_heads
        self.kv = partial(e4m3_heads_round, head_size=head_size) if kv_float8 else unrounded
        # positions run to max_position_embeddings + 2 (fairseq's offset); more are made if a sequence needs them
        self.pos_table = sinusoidal_positions(config.max_position_embeddings + 2, config.d_model, config.pad_token_id)
        self.threads = ProductThreads()
        # int8 (--compute-type int8): every matrix product with the weight in int8 and its input a row at a time
        self.products = Int8Products() if int8 else Products()

    def positions_for(self, length: int) -> np.ndarray:
        if length + self.config.pad_token_id + 1 > self.pos_table.shape[0]:
            self.pos_table = sinusoidal_positions(length + self.config.pad_token_id + 3, self.config.d_model, self.config.pad_token_id)
        return self.pos_table

    def capacity(self, max_length: int, beams: int = 1, sentences: int | None = None,
                 source_tokens: int | None = None) -> tuple[int, int]:
        """Decoder rows and source tokens at once: unbounded here (host memory)."""
        return 1 << 62, 1 << 62

    def release(self, state: "DecoderState") -> None:
        """Nothing to give back: the arrays go with the state."""

    def release_sources(self, encoded: "EncoderOutput") -> None:
        """Nothing to give back."""

    def product(self, x: np.ndarray, weight, bias: np.ndarray | None = None, spread: Spread = ALONE) -> np.ndarray:
        return linear(x, weight, bias, self.products, spread)

    # -- encoder

    def encode(self, sources: list[list[int]]) -> EncoderOutput:
        """Run the encoder over the sources and project every decoder layer's cross K/V, right-padded to the
        longest source with zeros. The sources of each length go through together, unpadded: a source's
        arithmetic is then that of it alone, whatever the batch (padding would change the shapes of its matrix
        products and the length of its attention's sums)."""
        c = self.config
        lengths = np.array([len(x) for x in sources])
        b, s = len(sources), int(lengths.max())
        mask = np.zeros((b, s), dtype=bool)
        padded = lambda: np.zeros((b, s, c.d_model), np.float32)  # noqa: E731
        cross_k, cross_v = [padded() for _ in range(c.decoder_layers)], [padded() for _ in range(c.decoder_layers)]

        def encode_part(rows: np.ndarray) -> None:
            length = lengths[rows[0]]
            ids = np.array([sources[i] for i in rows], dtype=np.int64)  # (B', S')
            mask[rows, :length], keys, values = self.encode_unpadded(ids)
            for i in range(c.decoder_layers):
                cross_k[i][rows, :length], cross_v[i][rows, :length] = keys[i], values[i]

        with self.threads.spreading() as spread:  # each length's sources in as many parts as there are threads
            groups = [np.flatnonzero(lengths == length) for length in np.unique(lengths)]
            list(spread.map(encode_part, [rows[at] for rows in groups for at in split_evenly(len(rows), spread.threads)]))
        return EncoderOutput(mask, cross_k, cross_v)

    def encode_unpadded(self, ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """The encoder over sources of one length (B', S'): their mask (True but at pad tokens) and every decoder
        layer's cross K and V (B', S', D)."""
        c, w = self.config, self.w
        mask = ids != c.pad_token_id  # (B', S')
        # positions start past the padding index; pad tokens take the zero row (transformers' create_position_ids)
        positions = np.where(mask, np.cumsum(mask, axis=1) + c.pad_token_id, c.pad_token_id)
        h = embed(ids, positions, w["encoder.embed_tokens.weight"], c.embed_scale, self.positions_for(ids.shape[1]))
        for i in range(c.encoder_layers):
            p = f"encoder.layers.{i}."
            x = self.r(layernorm(h, w[p + "self_attn_layer_norm.weight"], w[p + "self_attn_layer_norm.bias"]))
            h = h + self.attention_block(p + "self_attn.", x, x, mask, c.encoder_attention_heads)
            x = self.r(layernorm(h, w[p + "final_layer_norm.weight"], w[p + "final_layer_norm.bias"]))
            h = h + self.ffn(p, x)
        h = self.r(layernorm(h, w["encoder.layer_norm.weight"], w["encoder.layer_norm.bias"]))
        cross_k, cross_v = [], []
        for i in range(c.decoder_layers):
            p = f"decoder.layers.{i}.encoder_attn."
            cross_k.append(self.kv(self.r(self.product(h, w[p + "k_proj.weight"], w[p + "k_proj.bias"]))))  # (B', S', D)
            cross_v.append(self.kv(self.r(self.product(h, w[p + "v_proj.weight"], w[p + "v_proj.bias"]))))
        return mask, cross_k, cross_v

    def attention_block(self, prefix: str, x: np.ndarray, kv: np.ndarray, key_mask: np.ndarray, heads: int) -> np.ndarray:
        w = self.w
        q = self.r(self.product(x, w[prefix + "q_proj.weight"], w[prefix + "q_proj.bias"]))
        k = self.r(self.product(kv, w[prefix + "k_proj.weight"], w[prefix + "k_proj.bias"]))
        v = self.r(self.product(kv, w[prefix + "v_proj.weight"], w[prefix + "v_proj.bias"]))
        out = self.r(attention(q, k, v, key_mask, heads))
        return self.product(out, w[prefix + "out_proj.weight"], w[prefix + "out_proj.bias"])

    def ffn(self, prefix: str, x: np.ndarray, product=None) -> np.ndarray:
        """The feed-forward block, its matrix products by `product` (self.product on the calling thread, or
        spread over the threads)."""
        w = self.w
        product = product or self.product
        hidden = self.r(activation(product(x, w[prefix + "fc1.weight"], w[prefix + "fc1.bias"]), self.config.activation_function))
        return product(hidden, w[prefix + "fc2.weight"], w[prefix + "fc2.bias"])

    # -- decoder

    def start(self, encoded: EncoderOutput, source_rows: np.ndarray, max_positions: int) -> DecoderState:
        """An empty cache for len(source_rows) decoder rows that may fill `max_positions` positions each. It holds
        the longest source's length to begin with (at least FIRST_ROOM) and doubles when the rows need more
        (make_room): most translations end long before --max-length, and memory goes with what they fill."""
        n, d = len(source_rows), self.config.d_model
        rows = np.asarray(source_rows, dtype=np.int64)
        room = min(max_positions, max(FIRST_ROOM, encoded.mask.shape[1]))
        zeros = lambda: np.zeros((n, room, d), np.float32)  # noqa: E731
        layers = range(self.config.decoder_layers)
        return DecoderState(
            rows, [zeros() for _ in layers], [zeros() for _ in layers],
            [k[rows] for k in encoded.cross_k], [v[rows] for v in encoded.cross_v], encoded.mask[rows],
            np.zeros(n, np.int64), max_positions,
        )

    def make_room(self, state: DecoderState, positions: int) -> None:
        """Grow the cache to hold `positions` positions per row: double its room (at most max_positions), the
        filled positions copied as they are, so attention reads the same values as from a cache made whole."""
        if positions <= state.room:
            return
        room = max(positions, min(2 * state.room, state.max_positions))
        for cache in (state.self_k, state.self_v):
            for i, old in enumerate(cache):  # layer by layer: one layer's old and new arrays alive at once
                cache[i] = np.zeros((old.shape[0], room) + old.shape[2:], old.dtype)
                cache[i][:, : state.length] = old[:, : state.length]

    def step(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray, want_logits: bool = True):
        """Feed one token per row at position state.t; return the next-token logits (N, V) float32.
        (`encoded` is not read: each row's source K/V are in the state.)"""
        done = self.step_then(state, tokens, lambda logits: logits, want_logits)
        return done[0] if len(done) == 1 or not want_logits else np.concatenate(done)

    def step_then(self, state: DecoderState, tokens: np.ndarray, then: Callable, want_logits: bool = True) -> list:
        """A step, and then(logits) of its rows: one item for all of them, or with several threads and at least
        ROWS_A_THREAD rows for each, an item a part of the rows in order, each part stepped (and `then` run) on a
        thread of its own, as the encoder shares out its sources. With fewer rows each product's output columns
        are shared instead (a few rows read the weights once, whatever the threads). A row's arithmetic is the
        same either way."""
        with self.threads.spreading() as spread:
            if spread.threads == 1 or len(state.t) < ROWS_A_THREAD * spread.threads:
                return [then(self.step_rows(state, tokens, want_logits, partial(self.product, spread=spread)))]
            tokens = np.asarray(tokens, dtype=np.int64)
            self.make_room(state, state.length + 1)
            self.positions_for(state.length + 1)  # grown here, not by the parts at once
            done = list(spread.map(lambda part: then(self.step_rows(state_rows(state, part), tokens[part],
                                                                    want_logits, self.product)),
                                   split_evenly(len(state.t), spread.threads)))
            state.t = state.t + 1
            return done

    def step_rows(self, state: DecoderState, tokens: np.ndarray, want_logits: bool, product) -> np.ndarray | None:
        """step(), its products by `product` (self.product spread over the threads)."""
        c, w = self.config, self.w
        t, heads = state.t, c.decoder_attention_heads
        n = len(t)
        tokens = np.asarray(tokens, dtype=np.int64)
        # position t+2 (past the padding index), except a pad token, which takes the zero row as in transformers
        positions = np.where(tokens == c.pad_token_id, c.pad_token_id, t + c.pad_token_id + 1)
        h = embed(tokens, positions, w["decoder.embed_tokens.weight"], c.embed_scale,
                  self.positions_for(state.length + 1))[:, None, :]
        every, keys = np.arange(n), state.length + 1
        self.make_room(state, keys)
        for i in range(c.decoder_layers):
            p = f"decoder.layers.{i}."
            x = self.r(layernorm(h, w[p + "self_attn_layer_norm.weight"], w[p + "self_attn_layer_norm.bias"]))
            a = p + "self_attn."
            q = self.r(product(x, w[a + "q_proj.weight"], w[a + "q_proj.bias"]))  # (N, 1, D)
            state.self_k[i][every, t] = self.kv(self.r(product(x, w[a + "k_proj.weight"], w[a + "k_proj.bias"])))[:, 0]
            state.self_v[i][every, t] = self.kv(self.r(product(x, w[a + "v_proj.weight"], w[a + "v_proj.bias"])))[:, 0]
            # every row has filled the same positions: its keys are as many in any batch, none of them padding
            k_keys, v_keys = state.self_k[i][:, :keys], state.self_v[i][:, :keys]
            out = self.r(attention(q, k_keys, v_keys, None, heads))
            h = h + product(out, w[a + "out_proj.weight"], w[a + "out_proj.bias"])

            x = self.r(layernorm(h, w[p + "encoder_attn_layer_norm.weight"], w[p + "encoder_attn_layer_norm.bias"]))
            a = p + "encoder_attn."
            q = self.r(product(x, w[a + "q_proj.weight"], w[a + "q_proj.bias"]))
            out = self.r(attention_over_padding(q, state.cross_k[i], state.cross_v[i], state.src_mask, heads))
            h = h + product(out, w[a + "out_proj.weight"], w[a + "out_proj.bias"])

            x = self.r(layernorm(h, w[p + "final_layer_norm.weight"], w[p + "final_layer_norm.bias"]))
            h = h + self.ffn(p, x, product)
        state.t = t + 1
        if not want_logits:
            return None
        h = self.r(layernorm(h[:, 0], w["decoder.layer_norm.weight"], w["decoder.layer_norm.bias"]))  # (N, D)
        return product(h, w["lm_head.weight"])  # (N, V)

    def step_argmax(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray) -> np.ndarray:
        """Greedy: feed one token per row and return each row's most likely next token (N,); ties: lower id."""
        return self.step(encoded, state, tokens).argmax(axis=-1)

    def step_argmax_ahead(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray,
                          log_probs: bool = False) -> OnHost:
        """step_argmax's ids (and their log-probs) as the search queues them: here they are on the host at once."""
        logits = self.step(encoded, state, tokens)
        ids = logits.argmax(axis=-1)
        if not log_probs:
            return OnHost(ids)
        return OnHost(ids, log_softmax(logits)[np.arange(len(ids)), ids])

    def set_keys(self, state: DecoderState, keys: np.ndarray) -> None:
        """Each row's random stream (N,) uint32, for step_sample; the rows' keys follow them through select."""
        state.keys = np.asarray(keys, dtype=np.uint32)

    def step_sample(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray, temperature: float,
                    banned: int | None = None, log_probs: bool = False) -> OnHost:
        """Sampling over the whole vocabulary: feed one token per row and draw each row's next token from
        softmax(logits / temperature) (`banned` left out), by the Gumbel-max trick with the noise of the rows'
        streams at this step (numerics.gumbel_noise); with log_probs, the tokens' log-probabilities too."""
        keys = step_keys(state.keys, state.t - 1)  # the step: the index of the token drawn after the language token
        logits = self.step(encoded, state, tokens)
        z = logits * inverse_temperature(temperature) + gumbel_noise(keys, np.broadcast_to(np.arange(logits.shape[1]),
                                                                                           logits.shape))
        if banned is not None:
            z[:, banned] = -np.inf
        ids = z.argmax(axis=-1)
        return OnHost(ids, log_softmax(logits)[np.arange(len(ids)), ids] if log_probs else None)

    def step_topk(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray, k: int):
        """Beam search: feed one token per row and return each row's k best next tokens by log-probability,
        best first (ties: lower id), as (log-probs (N, k) float32, ids (N, k))."""
        def best(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            log_probs = log_softmax(logits)
            return (log_probs, *topk_desc(log_probs, k))

        parts = self.step_then(state, tokens, best)
        if len(parts) == 1:
            self.last_log_probs_of, values, ids = parts[0]
            return values, ids
        self.last_log_probs_of, values, ids = (np.concatenate(each) for each in zip(*parts))
        return values, ids

    def step_log_probs(self, encoded: EncoderOutput, state: DecoderState, tokens: np.ndarray, ids) -> np.ndarray:
        """Forced decoding: feed one token per row and return each row's log-probability of ids[row] as its next
        token (N,): numerics.log_softmax's arithmetic at the token alone, so that a translation scores to the bit
        what greedy search's scores gave it."""
        shifted = self.step(encoded, state, tokens)
        shifted -= shifted.max(axis=1, keepdims=True)
        return shifted[np.arange(len(shifted)), to_host(ids)] - np.log(np.exp(shifted).sum(axis=1))

    def last_log_probs(self, state: DecoderState, ids) -> np.ndarray:
        """Each row's log-probability of ids[row] (N,) at the last step_topk."""
        ids = to_host(ids)
        return self.last_log_probs_of[np.arange(len(ids)), ids]

    def fetch_later(self, a: np.ndarray) -> OnHost:
        """An array the search will want on the host: it is there already."""
        return OnHost(to_host(a))

    def reorder(self, state: DecoderState, parents: np.ndarray) -> None:
        """Beams follow their parents: row i continues row parents[i]'s history."""
        self.select(state, parents)

    def select(self, state: DecoderState, rows: np.ndarray) -> None:
        """Keep decoder rows `rows`, in that order (repeats allowed): beams follow their parents, finished rows leave."""
        rows = np.asarray(rows, dtype=np.int64)
        sources = state.source_rows[rows]
        if not np.array_equal(sources, state.source_rows):  # beams that swap within a sentence read the same source
            state.cross_k = [k[rows] for k in state.cross_k]
            state.cross_v = [v[rows] for v in state.cross_v]
            state.src_mask = state.src_mask[rows]
        state.source_rows = sources
        for cache in (state.self_k, state.self_v):
            for i, old in enumerate(cache):  # layer by layer: one layer's old and new arrays alive at once
                cache[i] = gather_rows(old, rows, state.length)
        state.t = state.t[rows]
        if state.keys is not None:
            state.keys = state.keys[rows]


def state_rows(state: DecoderState, rows: slice) -> DecoderState:
    """The state of a slice of its rows, as views: what a step writes into it lands in `state`'s arrays (its `t`
    is the caller's to advance)."""
    return replace(state, source_rows=state.source_rows[rows], self_k=[k[rows] for k in state.self_k],
                   self_v=[v[rows] for v in state.self_v], cross_k=[k[rows] for k in state.cross_k],
                   cross_v=[v[rows] for v in state.cross_v], src_mask=state.src_mask[rows], t=state.t[rows],
                   keys=None if state.keys is None else state.keys[rows])


def gather_rows(cache: np.ndarray, rows: np.ndarray, filled: int) -> np.ndarray:
    """cache[rows] (len(rows) <= len(cache)) in place, as its first len(rows) rows: only the rows that take
    another row's history are written (about half of a beam search's a step), and only their `filled`
    positions (the rest is written before it is read). The rows read are copied out before any is written, so
    rows may swap or repeat."""
    rows = np.asarray(rows, dtype=np.int64)
    moved = np.flatnonzero(rows != np.arange(len(rows)))
    if len(moved):
        cache[moved, :filled] = cache[rows[moved], :filled]
    return cache[: len(rows)]
