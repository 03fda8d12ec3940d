"""Make tests/golden/score.json: transformers' forward pass with `labels` over given translations (forced
decoding), the reference for `nllb score`, on tests/models/tiny-a, tests/models/tiny-m2m and the sample model.

Each case holds the source ids and the translation's ids as transformers' tokenizer gives them (the target
language token, the pieces, </s>: the `labels`), and the log-probability of each label from the log-softmax of
the logits of `model(input_ids, attention_mask, labels=labels)` (transformers shifts the labels right behind
the decoder start to make the decoder's input), in float64 from float32 logits; and the pass's loss, the mean of
the labels' negative log-probabilities, which the test checks the log-probabilities against. A batch mixes
lengths, so that padding of sources and labels (-100) is exercised.

Run where PyTorch and transformers are installed (the GPU machine has both):

    python tools/make_score_goldens.py [--out tests/golden/score.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer, NllbTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import GENERATION_TEXTS, unpadded_ids, write_tokenizer_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
TRANSLATIONS = [  # French for GENERATION_TEXTS, and lines that are no translation of them (a low score's cases)
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Bonjour !",
    "Nous nous retrouverons à la gare à sept heures du soir, pas à huit.",
    "How many people live in this city?",
    "",
    "我们晚上七点在车站见面。我们晚上七点在车站见面。",
]


def cases_of(name: str, model, tok, src: str, tgt: str, sources: list[str], targets: list[str]) -> list[dict]:
    """One batch of (source, translation) pairs through the forward pass with labels."""
    tok.src_lang, tok.tgt_lang = src, tgt
    batch = tok(sources, text_target=targets, padding=True, return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == tok.pad_token_id, -100)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
    log_probs = torch.log_softmax(out.logits.double(), dim=-1)  # (B, T, V)
    cases = []
    for row, source_ids in enumerate(unpadded_ids(batch)):
        kept = labels[row][labels[row] != -100]
        scored = log_probs[row, : len(kept)].gather(1, kept[:, None]).squeeze(1)
        cases.append({"model": name, "src_lang": src, "tgt_lang": tgt, "input_ids": source_ids,
                      "labels": kept.tolist(), "label_log_probs": scored.tolist()})
    count = sum(len(case["labels"]) for case in cases)
    return [{**case, "batch_loss": float(out.loss), "batch_labels": count} for case in cases]


def load(model_dir: Path) -> M2M100ForConditionalGeneration:
    return M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          attn_implementation="eager").eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "score.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-a"  # with the tokenizer files transformers reads
        shutil.copytree(ROOT / "tests" / "models" / "tiny-a", model_dir)
        tok = write_tokenizer_files(model_dir, keep_tokenizer_json=False)
        cases = cases_of("tiny-a", load(model_dir), tok, "eng_Latn", "fra_Latn", GENERATION_TEXTS, TRANSLATIONS)
    m2m = ROOT / "tests" / "models" / "tiny-m2m"
    cases += cases_of("tiny-m2m", load(m2m), M2M100Tokenizer.from_pretrained(str(m2m)), "en", "fr",
                      GENERATION_TEXTS, TRANSLATIONS)
    english = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:8]
    french = (HELDOUT / "fra_Latn.txt").read_text(encoding="utf-8").splitlines()[:8]
    french[5], french[6] = french[6], french[5]  # two translations of other sentences
    cases += cases_of("sample", load(SAMPLE), NllbTokenizer.from_pretrained(str(SAMPLE)), "eng_Latn", "fra_Latn",
                      english, french)
    args.out.write_text(json.dumps({"cases": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
