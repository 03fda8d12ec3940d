"""The published model shapes (nllbcli/model/shapes.py): the published sizes, language ids where the tokenizers put them."""

import pytest

from nllbcli.model.checkpoint import ModelConfig
from nllbcli.model.langs import FLORES_200_CODES, M2M100_CODES
from nllbcli.model.shapes import DEFAULT, NLLB_600M, PRESETS, parameter_count

# the parameter counts transformers reports for each hub model (model.num_parameters())
PUBLISHED = {
    "nllb-200-distilled-600M": 615_073_792,
    "nllb-200-1.3B": 1_370_638_336,
    "nllb-200-distilled-1.3B": 1_370_638_336,
    "nllb-200-3.3B": 3_344_863_232,
    "m2m100_418M": 483_905_536,
    "m2m100_1.2B": 1_239_470_080,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_have_the_published_sizes(name):
    assert parameter_count(PRESETS[name].config) == PUBLISHED[name]


def test_only_the_largest_nllb_has_128_wide_heads():
    head = {name: p.config.d_model // p.config.decoder_attention_heads for name, p in PRESETS.items()}
    assert head == {name: 128 if name == "nllb-200-3.3B" else 64 for name in PRESETS}


def test_the_default_preset_is_the_shape_measured_so_far():
    assert DEFAULT == "nllb-200-distilled-600M"
    assert NLLB_600M == ModelConfig(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
                                    encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                                    decoder_ffn_dim=4096, max_position_embeddings=1024)


@pytest.mark.parametrize("name", list(PRESETS))
def test_language_ids_are_where_the_tokenizers_put_them(name):
    preset = PRESETS[name]
    m2m = name.startswith("m2m")
    codes, src, tgt = (M2M100_CODES, "en", "fr") if m2m else (FLORES_200_CODES, "eng_Latn", "fra_Latn")
    assert preset.src_lang_id == preset.pieces + codes.index(src)
    assert preset.tgt_lang_id == preset.pieces + codes.index(tgt)
    assert preset.pieces + len(codes) <= preset.config.vocab_size
