"""The published NLLB-200 and M2M-100 sizes as ModelConfig presets, for the benchmarks and the tests.

    from nllbcli.model.shapes import PRESETS
    preset = PRESETS["nllb-200-3.3B"]     # preset.config: a ModelConfig; preset.tgt_lang_id: fra_Latn's id

    python -m bench.harness --preset nllb-200-3.3B         # the harness on that shape (default: 600M)

random_weights(config, ...) makes seeded random weights of a shape, fast enough for the 3.3B one (the GPU
tests and bench/e2e.py).

Numbers from each hub repository's config.json (facebook/NAME); the parameter counts follow from them
(parameter_count) and are the published ones, which tests/test_shapes.py checks:

| preset                  | d_model | layers  | heads (size) | FFN   | vocabulary | parameters    |
|-------------------------|---------|---------|--------------|-------|------------|---------------|
| nllb-200-distilled-600M | 1,024   | 12 + 12 | 16 (64)      | 4,096 | 256,206    | 615,073,792   |
| nllb-200-1.3B           | 1,024   | 24 + 24 | 16 (64)      | 8,192 | 256,206    | 1,370,638,336 |
| nllb-200-distilled-1.3B | 1,024   | 24 + 24 | 16 (64)      | 8,192 | 256,206    | 1,370,638,336 |
| nllb-200-3.3B           | 2,048   | 24 + 24 | 16 (128)     | 8,192 | 256,206    | 3,344,863,232 |
| m2m100_418M             | 1,024   | 12 + 12 | 16 (64)      | 4,096 | 128,112    | 483,905,536   |
| m2m100_1.2B             | 1,024   | 24 + 24 | 16 (64)      | 8,192 | 128,112    | 1,239,470,080 |

Every one: max_position_embeddings 1,024, ReLU, embeddings scaled by sqrt(d_model), one embedding matrix
shared by the encoder, the decoder and the output projection. The two 1.3B models have the same shape (one
is distilled from the 3.3B); nllb-200-3.3B is the only size whose head size is 128, not 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checkpoint import ModelConfig


@dataclass(frozen=True)
class Preset:
    name: str  # the hub repository, facebook/NAME
    config: ModelConfig
    src_lang_id: int  # English's language token in this vocabulary (eng_Latn, __en__): sources start with it
    tgt_lang_id: int  # French's (fra_Latn, __fr__): the forced first generated token
    pieces: int  # ids below this are sentencepiece pieces; the language tokens follow them


def model_config(vocab_size: int, d_model: int, layers: int, ffn: int, heads: int = 16) -> ModelConfig:
    """An M2M-100/NLLB shape with as many encoder as decoder layers; the rest are M2M100Config's defaults."""
    return ModelConfig(vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                       encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                       decoder_ffn_dim=ffn, max_position_embeddings=1024)


NLLB_VOCAB, M2M_VOCAB = 256206, 128112


def nllb(name: str, d_model: int, layers: int, ffn: int) -> Preset:
    # 256,001 pieces and specials, then FLORES-200's 202 codes: eng_Latn the 47th, fra_Latn the 57th
    return Preset(name, model_config(NLLB_VOCAB, d_model, layers, ffn), 256047, 256057, 256001)


def m2m(name: str, d_model: int, layers: int, ffn: int) -> Preset:
    # 128,004 pieces and specials (vocab.json), then the 100 `__xx__` codes: __en__ the 19th, __fr__ the 25th
    return Preset(name, model_config(M2M_VOCAB, d_model, layers, ffn), 128022, 128028, 128004)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    nllb("nllb-200-distilled-600M", 1024, 12, 4096),
    nllb("nllb-200-1.3B", 1024, 24, 8192),
    nllb("nllb-200-distilled-1.3B", 1024, 24, 8192),
    nllb("nllb-200-3.3B", 2048, 24, 8192),
    m2m("m2m100_418M", 1024, 12, 4096),
    m2m("m2m100_1.2B", 1024, 24, 8192),
]}
DEFAULT = "nllb-200-distilled-600M"  # the benchmarks' shape unless told otherwise (docs/PERFORMANCE.md's figures)
NLLB_600M = PRESETS[DEFAULT].config


def parameter_count(config: ModelConfig) -> int:
    """Parameters of the model, the shared embedding counted once (sinusoidal positions have none)."""
    d = config.d_model

    def linear(n_in: int, n_out: int) -> int:
        return n_in * n_out + n_out

    attention = 4 * linear(d, d)
    norm = 2 * d
    encoder_layer = attention + 2 * norm + linear(d, config.encoder_ffn_dim) + linear(config.encoder_ffn_dim, d)
    decoder_layer = 2 * attention + 3 * norm + linear(d, config.decoder_ffn_dim) + linear(config.decoder_ffn_dim, d)
    return (config.vocab_size * d + config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer
            + 2 * norm)  # + the encoder's and the decoder's final LayerNorm


def random_weights(config: ModelConfig, seed: int, scale: float, embed_scale: float, share_layers: bool = False,
                   tied: bool = True) -> dict[str, np.ndarray]:
    """Random weights of a shape, bf16 values so that the GPU holds exactly these: matrices and biases of
    standard deviation `scale`, LayerNorms 1 + that and that; one embedding of deviation `embed_scale` for the
    encoder, the decoder and (tied) the output projection, as NLLB has. Uniform values cut to bf16 in place:
    the 3.3B shape's 525M-value embedding takes 2 s that way, 10 s with normal values rounded by bf16_round.
    share_layers: every layer of a side holds the same arrays, so that a 3.3B shape is made in seconds (the
    engine still copies each layer to the GPU: full-size memory and work there)."""
    rng = np.random.default_rng(seed)
    d = config.d_model

    def bf16_values(a: np.ndarray) -> np.ndarray:
        a.view(np.uint32)[...] &= np.uint32(0xFFFF0000)  # keep the top 16 bits: a bf16 value, rounded to zero
        return a

    def uniform(*shape: int, std: float = scale) -> np.ndarray:
        a = rng.random(shape, dtype=np.float32)
        a -= np.float32(0.5)
        a *= np.float32(2 * 3**0.5 * std)  # uniform on [-std √3, std √3]: standard deviation std
        return bf16_values(a)

    def norm() -> tuple[np.ndarray, np.ndarray]:
        return bf16_values(1 + uniform(d)), uniform(d)

    def layer(ffn: int, cross: bool) -> dict[str, np.ndarray]:
        w = {}
        for attn in ("self_attn", "encoder_attn") if cross else ("self_attn",):
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                w[f"{attn}.{proj}.weight"], w[f"{attn}.{proj}.bias"] = uniform(d, d), uniform(d)
            w[f"{attn}_layer_norm.weight"], w[f"{attn}_layer_norm.bias"] = norm()
        w["fc1.weight"], w["fc1.bias"] = uniform(ffn, d), uniform(ffn)
        w["fc2.weight"], w["fc2.bias"] = uniform(d, ffn), uniform(d)
        w["final_layer_norm.weight"], w["final_layer_norm.bias"] = norm()
        return w

    shared = uniform(config.vocab_size, d, std=embed_scale)
    out = {"encoder.embed_tokens.weight": shared, "decoder.embed_tokens.weight": shared,
           "lm_head.weight": shared if tied else uniform(config.vocab_size, d, std=embed_scale)}
    for side, layers, ffn in (("encoder", config.encoder_layers, config.encoder_ffn_dim),
                              ("decoder", config.decoder_layers, config.decoder_ffn_dim)):
        one = layer(ffn, side == "decoder") if share_layers else None
        for i in range(layers):
            arrays = one if share_layers else layer(ffn, side == "decoder")
            out.update({f"{side}.layers.{i}.{name}": a for name, a in arrays.items()})
        out[f"{side}.layer_norm.weight"], out[f"{side}.layer_norm.bias"] = norm()
    return out
