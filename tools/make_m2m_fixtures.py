"""Make the tiny M2M-100-format test model under tests/models/tiny-m2m and its goldens in tests/golden/tiny-m2m.json.

Run where PyTorch and transformers are installed (they are not runtime or test dependencies):

    /opt/ref/bin/python tools/make_m2m_fixtures.py

The directory has the file layout of facebook/m2m100_418M's hub repo: config.json, generation_config.json,
a float32 pytorch_model.bin, vocab.json, sentencepiece.bpe.model, tokenizer_config.json and
special_tokens_map.json, and no tokenizer.json. vocab.json is fairseq's dictionary as M2M100Tokenizer's
save_vocabulary writes it: `<s>` `<pad>` `</s>` `<unk>` then the pieces, here in a shuffled order (fairseq's
dictionary is ordered by frequency, not by sentencepiece id) and with two pieces left out (they become `<unk>`),
so a tokenizer that assumed NLLB's `id = piece + 1` rule would fail the goldens. The model's vocab_size is
len(vocab.json) + 100 language tokens + 8 madeup words, as M2M-100's 128,112 = 128,004 + 100 + 8.

The goldens are transformers' own outputs: M2M100Tokenizer's ids and decoded text, and `generate` (greedy and
beam search, float32 on the CPU, eager attention, an explicit GenerationConfig with forced_bos_token_id).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import M2M100Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import (  # noqa: E402
    GENERATION_TEXTS, TOKENIZER_TEXTS, forced_generate, make_model, train_sentencepiece, unpadded_ids,
)

ROOT = Path(__file__).resolve().parent.parent
NAME = "tiny-m2m"
EOS_PUSH = 1.3  # some translations end before max_length, some do not
NLLB_EXTRA_ROWS = 1 + 202 + 1 + 2  # what make_model adds to the piece count for NLLB's layout
DIMS = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=2,
            encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64)


def write_vocab(model_dir: Path) -> dict[str, int]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.bpe.model"))
    pieces = [sp.IdToPiece(i) for i in range(3, sp.GetPieceSize())]
    rng = random.Random(5)
    rng.shuffle(pieces)
    left_out = pieces[-2:]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in pieces[:-2]:
        vocab[piece] = len(vocab)
    with open(model_dir / "vocab.json", "w", encoding="utf-8") as f:  # as transformers' save_json does
        json.dump(vocab, f, indent=2)
    print(f"vocab.json: {len(vocab)} entries; left out {left_out}")
    return vocab


def main() -> int:
    model_dir = ROOT / "tests" / "models" / NAME
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    train_sentencepiece(model_dir, 500)
    vocab = write_vocab(model_dir)
    tok = M2M100Tokenizer(str(model_dir / "vocab.json"), str(model_dir / "sentencepiece.bpe.model"))
    tok.save_pretrained(str(model_dir))
    vocab_size = len(vocab) + 100 + 8
    assert tok.get_lang_id("en") == len(vocab) + 18, tok.get_lang_id("en")

    model = make_model(model_dir, vocab_size - NLLB_EXTRA_ROWS, 7, DIMS, torch.float32, 1, False, EOS_PUSH)
    assert model.config.vocab_size == vocab_size
    # the hub repo's weights: pytorch_model.bin, every tensor under transformers' names (the tie stored once)
    state = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    torch.save(state, model_dir / "pytorch_model.bin")
    for extra in ("tokenizer.json",):
        (model_dir / extra).unlink(missing_ok=True)

    # transformers 5.24's M2M100Tokenizer keeps `__xx__` tokens (and madeup words, as "<unk>") in decoded text even
    # with skip_special_tokens (transformers 4 dropped them); nllbcli drops them, so the goldens decode without them.
    def decode(ids):
        return tok.decode([i for i in ids if i < len(vocab)], skip_special_tokens=True)

    tokenizer_cases = []
    for lang in ("en", "zh"):
        tok.src_lang = lang
        for text in TOKENIZER_TEXTS:
            ids = tok(text)["input_ids"]
            tokenizer_cases.append({"text": text, "src_lang": lang, "ids": ids, "decoded": decode(ids)})
    rng = random.Random(3)
    decode_cases = []
    for _ in range(40):
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(0, 12))]
        decode_cases.append({"ids": ids, "decoded": decode(ids)})

    generate_cases = []
    for src, tgt in (("en", "fr"), ("ru", "zh")):
        tok.src_lang = src
        batch = tok(GENERATION_TEXTS, padding=True, return_tensors="pt")
        tgt_id = tok.get_lang_id(tgt)
        for beams, max_new in ((1, 24), (4, 24), (4, 6)):
            outputs, _ = forced_generate(model, batch, tgt_id, num_beams=beams, length_penalty=1.0, max_new_tokens=max_new)
            generate_cases.append({
                "src_lang": src, "tgt_lang": tgt, "beam_size": beams, "max_length": max_new, "texts": GENERATION_TEXTS,
                "input_ids": unpadded_ids(batch),
                "output_ids": outputs,
                "output_texts": [decode(ids) for ids in outputs],
            })
    golden = {"model": NAME, "tokenizer": tokenizer_cases, "decode": decode_cases, "generate": generate_cases}
    path = ROOT / "tests" / "golden" / f"{NAME}.json"
    path.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{NAME}: vocab {vocab_size}, {sum(p.numel() for p in model.parameters()):,} parameters; files: "
          f"{sorted(p.name for p in model_dir.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
