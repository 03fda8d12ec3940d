"""Make the tiny NLLB-format test models under tests/models/ and their goldens under tests/golden/.

Run where PyTorch and transformers are installed (they are not runtime or test dependencies):

    python tools/make_test_models.py            # writes tests/models/tiny-{a,b} and tests/golden/*.json

Everything is seeded, so a second run writes the same files. The goldens are transformers' own outputs:
NllbTokenizer's ids and decoded text, and `generate` (greedy and beam search, float32 on the CPU, eager
attention) on batches of padded sources. The test suite compares nllbcli against them exactly.

tiny-a: float32, one model.safetensors with the tied embedding stored once, tokenizer.json shipped.
tiny-b: other dimensions (1 encoder layer, 3 decoder layers, other head counts and FFN sizes), bfloat16
weights in two shards with an index, the tied embedding stored under all four names, no tokenizer.json
(ids come from NLLB's rules alone).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

ROOT = Path(__file__).resolve().parent.parent

# A little text in several scripts, enough for a few hundred BPE pieces and for tokenizer parity checks.
CORPUS = """\
The quick brown fox jumps over the lazy dog.
She sells sea shells by the sea shore on Monday morning.
We will meet at the station at seven o'clock in the evening.
How many people live in this city? More than two million.
Le renard brun saute par-dessus le chien paresseux.
Nous nous retrouverons à la gare à sept heures du soir.
Combien de personnes vivent dans cette ville ? Plus de deux millions.
Der schnelle braune Fuchs springt über den faulen Hund.
Wir treffen uns um sieben Uhr abends am Bahnhof.
Wie viele Menschen leben in dieser Stadt? Mehr als zwei Millionen.
El rápido zorro marrón salta sobre el perro perezoso.
Nos veremos en la estación a las siete de la tarde.
¿Cuántas personas viven en esta ciudad? Más de dos millones.
Быстрая коричневая лиса прыгает через ленивую собаку.
Мы встретимся на вокзале в семь часов вечера.
敏捷的棕色狐狸跳过了懒狗。我们晚上七点在车站见面。
这个城市有多少人？超过两百万。
الثعلب البني السريع يقفز فوق الكلب الكسول.
سنلتقي في المحطة في الساعة السابعة مساءً.
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।
हम शाम सात बजे स्टेशन पर मिलेंगे।
Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.
素早い茶色の狐がのろまな犬を飛び越える。
빠른 갈색 여우가 게으른 개를 뛰어넘는다.
Numbers: 1, 2, 3, 42, 1999, 2026; prices €5.99 and $12.50; 50% off!
"""

TOKENIZER_TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "several   spaces\tand a tab",
    "Nous nous retrouverons à la gare à sept heures.",
    "Wie viele Menschen leben in dieser Stadt?",
    "Мы встретимся на вокзале.",
    "我们晚上七点在车站见面。",
    "سنلتقي في المحطة",
    "हम शाम सात बजे स्टेशन पर मिलेंगे।",
    "Full-width ＡＢＣ１２３ and ligature ﬁ (NFKC)",
    "unseen letters: ßø ŧħ ꙮ 🙂 done",
    "",
    "a",
    "Numbers: 1, 2, 3, 42, 1999; €5.99!",
    "zero width space at the end\u200b",
    "trailing tab\t",
    "\u00a0no-break spaces\u00a0",
    "ideographic\u3000space\u3000",
    " ",
    "line\nbreaks\r\ninside",
]

GENERATION_TEXTS = [  # different lengths, batched together, so padding is exercised
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "We will meet at the station at seven o'clock in the evening, not at eight.",
    "Combien de personnes vivent dans cette ville ?",
    "Мы встретимся на вокзале в семь часов вечера.",
    "我们晚上七点在车站见面。",
]


def train_sentencepiece(out_dir: Path, vocab_size: int) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        rng = random.Random(0)
        lines = CORPUS.splitlines()
        words = " ".join(lines).split()
        extra = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(400)]
        corpus.write_text("\n".join(lines * 4 + extra) + "\n", encoding="utf-8")
        prefix = Path(tmp) / "sp"
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size, model_type="bpe",
            character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            normalization_rule_name="nmt_nfkc", hard_vocab_limit=False, seed_sentencepiece_size=10000,
            num_threads=1, minloglevel=2,
        )
        target = out_dir / "sentencepiece.bpe.model"
        shutil.copy(prefix.with_suffix(".model"), target)
    return target


def make_model(out_dir: Path, sp_size: int, seed: int, dims: dict, dtype: torch.dtype, shards: int, store_all_ties: bool,
               eos_push: float) -> M2M100ForConditionalGeneration:
    vocab_size = sp_size + 1 + 202 + 1 + 2  # pieces, 202 languages, <mask>, and 2 spare rows as NLLB has
    config = M2M100Config(
        vocab_size=vocab_size, scale_embedding=True, activation_function="relu", pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        tie_word_embeddings=True, **dims,
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    with torch.no_grad():
        # Not the 0.02 init: small embeddings and large layer weights, so the output is not a copy of the input
        # token, and a push towards </s> in the final LayerNorm's bias, so that some outputs end before
        # max_length and some do not.
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.normal_(0.0, 0.1 if "shared" in name or "embed" in name else 0.5)
            elif "layer_norm" in name and name.endswith("weight"):
                p.uniform_(0.6, 1.4)
            else:
                p.normal_(0.0, 0.05)
        eos = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias += eos_push * eos / (eos @ eos)
        # round to the stored dtype, so transformers computes with exactly the weights the files hold
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    model.eval()
    model.config._attn_implementation = "eager"

    state = {"model." + k if not k.startswith(("model.", "lm_head")) else k: v for k, v in model.state_dict().items()}
    state = {k: v.to(dtype).contiguous() for k, v in state.items() if "embed_positions" not in k}
    tied = ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"]
    if store_all_ties:
        state = {k: (v.clone() if k in tied else v) for k, v in state.items()}
    else:
        for k in tied:
            state.pop(k, None)
    names = sorted(state)
    if shards == 1:
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        per = (len(names) + shards - 1) // shards
        for s in range(shards):
            part = names[s * per : (s + 1) * per]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: state[k] for k in part}, str(out_dir / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in part})
        index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config_dict = config.to_dict()
    config_dict["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    for k in ("transformers_version", "_attn_implementation_autoset", "output_attentions", "dtype"):
        config_dict.pop(k, None)
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, max_length=200).save_pretrained(out_dir)
    return model


def write_tokenizer_files(model_dir: Path, keep_tokenizer_json: bool) -> NllbTokenizer:
    """transformers' NllbTokenizer in NLLB's id layout, and its files in `model_dir` when asked.

    transformers 5 converts a bare sentencepiece.bpe.model without the 202 language codes (and puts <mask>
    right after the pieces), unlike the tokenizer.json of the real NLLB checkpoints. So convert, then lay the
    added tokens out as NLLB's hub files do: the language codes after the pieces, <mask> last.
    """
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory() as tmp:
        bare, fixed = Path(tmp) / "bare", Path(tmp) / "fixed"
        bare.mkdir()
        shutil.copy(model_dir / "sentencepiece.bpe.model", bare)
        NllbTokenizer.from_pretrained(str(bare)).save_pretrained(str(fixed))
        data = json.loads((fixed / "tokenizer.json").read_text(encoding="utf-8"))
        first_lang = len(data["model"]["vocab"])
        mask = next(t for t in data["added_tokens"] if t["content"] == "<mask>")
        added = [t for t in data["added_tokens"] if t["content"] != "<mask>"]
        for i, code in enumerate(FAIRSEQ_LANGUAGE_CODES):
            added.append({"id": first_lang + i, "content": code, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
        mask["id"] = first_lang + len(FAIRSEQ_LANGUAGE_CODES)
        data["added_tokens"] = added + [mask]
        (fixed / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        shutil.copy(model_dir / "sentencepiece.bpe.model", fixed)
        tok = NllbTokenizer.from_pretrained(str(fixed), additional_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
        assert tok.convert_tokens_to_ids("eng_Latn") == first_lang + 46 and tok.convert_tokens_to_ids("<mask>") == first_lang + 202
        if keep_tokenizer_json:
            tok.save_pretrained(str(model_dir))
            shutil.copy(fixed / "sentencepiece.bpe.model", model_dir / "sentencepiece.bpe.model")
    return tok


def decode_golden(tok: NllbTokenizer) -> list[dict]:
    """Id lists that mix pieces with <s>, <pad>, </s>, <unk>, language codes and <mask>: what decode skips."""
    rng = random.Random(3)
    cases = []
    for _ in range(40):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 12))]
        cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
    return cases


def tokenizer_golden(tok: NllbTokenizer) -> list[dict]:
    cases = []
    for lang in ("eng_Latn", "zho_Hans"):
        for text in TOKENIZER_TEXTS:
            tok.src_lang = lang
            ids = tok(text)["input_ids"]
            cases.append({"text": text, "src_lang": lang, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
    return cases


def forced_generate(model, batch, tgt_id: int, **settings) -> tuple[list[list[int]], "torch.Tensor"]:
    """transformers' `generate` with NLLB's special ids and `tgt_id` forced after the decoder start (settings:
    num_beams, max_new_tokens, length_penalty, ...). Returns each row's ids after the decoder start and the
    language token, cut at </s> (a row that never ends: max_new_tokens - 1 ids), and generate's own output."""
    gen = GenerationConfig(early_stopping=False, do_sample=False, forced_bos_token_id=tgt_id, bos_token_id=0,
                           pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, **settings)
    with torch.no_grad():
        out = model.generate(**batch, generation_config=gen)
    outputs = []
    for row in out.tolist():
        assert row[0] == 2 and row[1] == tgt_id, row[:2]
        ids = row[2:]
        outputs.append(ids[: ids.index(2)] if 2 in ids else ids[: settings["max_new_tokens"] - 1])
    return outputs, out


def unpadded_ids(batch) -> list[list[int]]:
    """The tokenizer's batch without its padding."""
    return [[i for i, m in zip(ids, mask) if m] for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist())]


def generation_golden(model, tok: NllbTokenizer, max_new_tokens: int) -> list[dict]:
    settings = [
        {"num_beams": 1, "length_penalty": 1.0},
        {"num_beams": 4, "length_penalty": 1.0},
        {"num_beams": 2, "length_penalty": 1.0},
        {"num_beams": 4, "length_penalty": 0.6},
        {"num_beams": 4, "length_penalty": 2.0},
    ]
    cases = []
    for src, tgt in (("eng_Latn", "fra_Latn"), ("fra_Latn", "deu_Latn"), ("rus_Cyrl", "zho_Hans")):
        tok.src_lang = src
        batch = tok(GENERATION_TEXTS, padding=True, return_tensors="pt")
        tgt_id = tok.convert_tokens_to_ids(tgt)
        for s in settings:
            for max_new in (max_new_tokens, 5):
                outputs, out = forced_generate(model, batch, tgt_id, num_beams=s["num_beams"],
                                               length_penalty=s["length_penalty"], max_new_tokens=max_new)
                cases.append({
                    "src_lang": src, "tgt_lang": tgt, "beam_size": s["num_beams"], "length_penalty": s["length_penalty"],
                    "max_length": max_new, "texts": GENERATION_TEXTS,
                    "input_ids": unpadded_ids(batch),
                    "output_ids": outputs,
                    "output_texts": tok.batch_decode(out, skip_special_tokens=True),
                })
    return cases


PROCESSOR_SETTINGS = [  # --repetition-penalty and --no-repeat-ngram-size, in greedy and beam search
    {"num_beams": 1, "repetition_penalty": 1.3, "no_repeat_ngram_size": 0},
    {"num_beams": 1, "repetition_penalty": 0.8, "no_repeat_ngram_size": 0},
    {"num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 2},
    {"num_beams": 1, "repetition_penalty": 1.5, "no_repeat_ngram_size": 3},
    {"num_beams": 4, "repetition_penalty": 1.2, "no_repeat_ngram_size": 0},
    {"num_beams": 4, "repetition_penalty": 1.0, "no_repeat_ngram_size": 2},
    {"num_beams": 3, "repetition_penalty": 0.7, "no_repeat_ngram_size": 3},
]


def processor_golden(model_dir: Path, max_new_tokens: int) -> list[dict]:
    """transformers' `generate` with the repetition penalty and the n-gram ban, on a model already on disk.

    Written to tests/golden/<model>-processors.json, apart from the first goldens, so that adding these cases
    needs neither a new model nor a rewrite of the first goldens (sentencepiece training is not byte-for-byte
    repeatable across versions)."""
    tok = write_tokenizer_files(model_dir, keep_tokenizer_json=False)
    model = M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cases = []
    for src, tgt in (("eng_Latn", "fra_Latn"), ("rus_Cyrl", "zho_Hans")):
        tok.src_lang = src
        batch = tok(GENERATION_TEXTS, padding=True, return_tensors="pt")
        tgt_id = tok.convert_tokens_to_ids(tgt)
        for s in PROCESSOR_SETTINGS:
            outputs, _ = forced_generate(model, batch, tgt_id, num_beams=s["num_beams"],
                                         repetition_penalty=s["repetition_penalty"],
                                         no_repeat_ngram_size=s["no_repeat_ngram_size"], length_penalty=1.0,
                                         max_new_tokens=max_new_tokens)
            cases.append({
                "src_lang": src, "tgt_lang": tgt, "beam_size": s["num_beams"], "max_length": max_new_tokens,
                "repetition_penalty": s["repetition_penalty"], "no_repeat_ngram_size": s["no_repeat_ngram_size"],
                "texts": GENERATION_TEXTS,
                "input_ids": unpadded_ids(batch),
                "output_ids": outputs,
            })
    return cases


MODELS = {
    "tiny-a": dict(
        seed=1, vocab=400, dtype=torch.float32, shards=1, store_all_ties=False, keep_tokenizer_json=True, eos_push=2.5,
        dims=dict(d_model=64, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=8,
                  encoder_ffn_dim=128, decoder_ffn_dim=96, max_position_embeddings=64),
    ),
    "tiny-b": dict(
        seed=2, vocab=300, dtype=torch.bfloat16, shards=2, store_all_ties=True, keep_tokenizer_json=False, eos_push=1.2,
        dims=dict(d_model=48, encoder_layers=1, decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=6,
                  encoder_ffn_dim=80, decoder_ffn_dim=112, max_position_embeddings=48),
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--processors-only", action="store_true",
                        help="keep the models and first goldens; write only tests/golden/<model>-processors.json")
    args = parser.parse_args()
    golden_dir = args.out / "golden"
    golden_dir.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        if args.processors_only:
            break
        model_dir = args.out / "models" / name
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        train_sentencepiece(model_dir, spec["vocab"])
        sp_size = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.bpe.model")).get_piece_size()
        tok = write_tokenizer_files(model_dir, spec["keep_tokenizer_json"])
        model = make_model(model_dir, sp_size, spec["seed"], spec["dims"], spec["dtype"], spec["shards"],
                           spec["store_all_ties"], spec["eos_push"])
        golden = {"model": name, "tokenizer": tokenizer_golden(tok), "decode": decode_golden(tok), "generate": generation_golden(model, tok, args.max_new_tokens)}
        (golden_dir / f"{name}.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: sentencepiece {sp_size} pieces, vocab {model.config.vocab_size}, {sum(p.numel() for p in model.parameters()):,} parameters")
    for name in MODELS:
        cases = processor_golden(args.out / "models" / name, 32)
        (golden_dir / f"{name}-processors.json").write_text(json.dumps({"model": name, "generate": cases}, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {len(cases)} repetition-penalty and n-gram cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
