"""Train the sample model's sentencepiece BPE, write the Hugging Face tokenizer files, pre-tokenize the data.

Reads the data of tools/make_sample_data.py (train.tsv, heldout.tsv), then

1. trains a sentencepiece BPE on the training sentences of all five languages, with NLLB's settings
   (unk 0, bos 1, eos 2, no pad, nmt_nfkc, no byte fallback, full character coverage), and saves it as
   MODEL_DIR/sentencepiece.bpe.model;
2. lets transformers' NllbTokenizer convert it and save tokenizer.json and tokenizer_config.json (and
   special_tokens_map.json where it writes one) beside it, then checks its ids follow NLLB's rules:
   <s>=0 <pad>=1 </s>=2 <unk>=3, piece i>=3 at i+1, the 202 FLORES-200 codes from sp_size+1, <mask> last;
3. writes DATA/tokens.npz: every sentence's piece ids (NLLB ids, without language code or </s>) as an
   int16 array [tuples, 5 languages, max length] padded with <pad>, for train and held-out, checked to
   equal what the Hugging Face tokenizer produces.

Usage: /opt/ref/bin/python tools/make_sample_tokenizer.py [--data .scratch/data] [--model-dir data/samples/model]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece as spm
from transformers import AddedToken, NllbTokenizer
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
REPO = Path(__file__).resolve().parent.parent
PAD = 1


def read_tsv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


def train_spm(sentences: list[str], prefix: Path, vocab_size: int, seed: int) -> None:
    rng = random.Random(seed)
    rng.shuffle(sentences)
    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), model_type="bpe", vocab_size=vocab_size,
        character_coverage=1.0, normalization_rule_name="nmt_nfkc", byte_fallback=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, input_sentence_size=len(sentences),
        shuffle_input_sentence=False, num_threads=2, minloglevel=2,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / ".scratch" / "data"))
    ap.add_argument("--model-dir", default=str(REPO / "data" / "samples" / "model"))
    ap.add_argument("--vocab-size", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    data, model_dir = Path(args.data), Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    train, held = read_tsv(data / "train.tsv"), read_tsv(data / "heldout.tsv")

    # 1. sentencepiece
    prefix = data / "spm"
    train_spm([s for row in train for s in row], prefix, args.vocab_size, args.seed)
    shutil.copy(prefix.with_suffix(".model"), model_dir / "sentencepiece.bpe.model")
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.bpe.model"))
    size = sp.get_piece_size()
    assert [sp.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]

    # 2. Hugging Face files, converted by transformers from the sentencepiece model alone
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(model_dir / "sentencepiece.bpe.model", Path(tmp) / "sentencepiece.bpe.model")
        # transformers 5.24 converts the model but, loading a bare sentencepiece file, neither adds the
        # language codes nor puts <mask> after them: add the codes first, then <mask>, as NLLB numbers them.
        tok = NllbTokenizer.from_pretrained(tmp, extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES), mask_token=None)
        tok.add_special_tokens({"mask_token": AddedToken("<mask>", normalized=True, lstrip=True, special=True)})
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (model_dir / name).unlink(missing_ok=True)
        tok.save_pretrained(str(model_dir))
    tok = NllbTokenizer.from_pretrained(str(model_dir))
    assert len(tok) == size + 204, len(tok)
    assert [tok.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    for i in range(3, size):
        assert tok.convert_tokens_to_ids(sp.id_to_piece(i)) == i + 1, i
    for i, code in enumerate(FAIRSEQ_LANGUAGE_CODES):
        assert tok.convert_tokens_to_ids(code) == size + 1 + i, code
    assert tok.convert_tokens_to_ids("<mask>") == size + 1 + len(FAIRSEQ_LANGUAGE_CODES)
    assert tok.convert_tokens_to_ids("eng_Latn") == size + 1 + 46
    print(f"sentencepiece: {size} pieces; ids: langs {size + 1}..{size + 202}, <mask> {size + 203}; "
          f"len(tokenizer) = {len(tok)}")

    # 3. pre-tokenized data: NLLB ids of the pieces, from sentencepiece by the rules
    def encode(rows: list[list[str]]) -> np.ndarray:
        ids = [[[i + 1 if i >= 3 else 3 for i in sp.encode(s)] for s in row] for row in rows]
        width = max(len(x) for row in ids for x in row)
        arr = np.full((len(rows), len(LANGS), width), PAD, dtype=np.int16)
        for r, row in enumerate(ids):
            for j, x in enumerate(row):
                arr[r, j, : len(x)] = x
        return arr

    train_ids, held_ids = encode(train), encode(held)
    # The transformers tokenizer must give [lang] + the same ids + </s>, with src_lang set (non-legacy).
    rng = random.Random(args.seed)
    checks = [(held_ids, r, held[r]) for r in range(len(held))]
    checks += [(train_ids, r, train[r]) for r in rng.sample(range(len(train)), 5000)]
    for arr, r, row in checks:
        for j, lang in enumerate(LANGS):
            tok.src_lang = lang
            got = tok(row[j])["input_ids"]
            want = [tok.convert_tokens_to_ids(lang)] + [int(x) for x in arr[r, j] if x != PAD] + [2]
            assert got == want, (row[j], got, want)
            assert tok.decode(got, skip_special_tokens=True) == row[j], (row[j], tok.decode(got, skip_special_tokens=True))
    assert (train_ids == 3).sum() == 0 and (held_ids == 3).sum() == 0, "unknown pieces in the data"
    lengths = (train_ids != PAD).sum(-1)
    np.savez_compressed(data / "tokens.npz", train=train_ids, heldout=held_ids, sp_size=np.int64(size))
    print(f"tokens.npz: train {train_ids.shape}, heldout {held_ids.shape}; pieces per sentence: "
          f"mean {lengths.mean():.1f}, max {lengths.max()}; per language mean "
          + ", ".join(f"{lang} {m:.1f}" for lang, m in zip(LANGS, lengths.mean(0))))


if __name__ == "__main__":
    main()
