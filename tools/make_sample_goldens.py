"""Record transformers' translations of held-out sentences with the sample model: tests/golden/sample.json.

    python tools/make_sample_goldens.py      # needs PyTorch and transformers

For each direction below, the first 40 held-out sentences go through transformers' NllbTokenizer and
`generate` (float32 on the CPU, eager attention), greedy and beam 4, batched with padding. The test suite
checks that nllbcli's reference model gives exactly these ids and texts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import GenerationConfig, M2M100ForConditionalGeneration, NllbTokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
DIRECTIONS = [("eng_Latn", "fra_Latn"), ("eng_Latn", "deu_Latn"), ("deu_Latn", "ita_Latn"), ("spa_Latn", "eng_Latn"),
              ("fra_Latn", "spa_Latn")]
SENTENCES = 40
MAX_NEW_TOKENS = 64


def main() -> int:
    tok = NllbTokenizer.from_pretrained(str(MODEL))
    model = M2M100ForConditionalGeneration.from_pretrained(str(MODEL), dtype=torch.float32, attn_implementation="eager").eval()
    cases = []
    for src, tgt in DIRECTIONS:
        texts = (HELDOUT / f"{src}.txt").read_text(encoding="utf-8").splitlines()[:SENTENCES]
        tok.src_lang = src
        batch = tok(texts, padding=True, return_tensors="pt")
        for beams in (1, 4):
            gen = GenerationConfig(num_beams=beams, length_penalty=1.0, early_stopping=False, max_new_tokens=MAX_NEW_TOKENS,
                                   do_sample=False, forced_bos_token_id=tok.convert_tokens_to_ids(tgt), bos_token_id=0,
                                   pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
            with torch.no_grad():
                out = model.generate(**batch, generation_config=gen)
            ids = []
            for row in out.tolist():
                gen_ids = row[2:]
                ids.append(gen_ids[: gen_ids.index(2)] if 2 in gen_ids else gen_ids[: MAX_NEW_TOKENS - 1])
            cases.append({"src_lang": src, "tgt_lang": tgt, "beam_size": beams, "max_length": MAX_NEW_TOKENS,
                          "texts": texts, "output_ids": ids, "output_texts": tok.batch_decode(out, skip_special_tokens=True)})
    path = ROOT / "tests" / "golden" / "sample.json"
    path.write_text(json.dumps({"model": "data/samples/model", "generate": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
