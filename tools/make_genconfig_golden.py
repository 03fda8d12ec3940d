"""Make tests/golden/tiny-a-genconfig.json: transformers' `generate` with no decoding settings but the target
language, on tests/models/tiny-a with each of GENERATION_CONFIGS as its generation_config.json (what a model
directory's file makes `generate` do, which `nllb translate` follows where its options are not given).

Run where PyTorch and transformers are installed (the GPU machine has both):

    python tools/make_genconfig_golden.py [--out tests/golden/tiny-a-genconfig.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import M2M100ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import GENERATION_TEXTS, unpadded_ids, write_tokenizer_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPECIAL = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}
GENERATION_CONFIGS = [  # with NLLB's special ids; the options nllb follows, and the length both ways
    {"max_length": 9, "num_beams": 3, "length_penalty": 0.6, "no_repeat_ngram_size": 2},
    {"max_length": 50, "max_new_tokens": 6, "repetition_penalty": 1.3},
    {"max_length": 12},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "tiny-a-genconfig.json")
    args = parser.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-a"
        shutil.copytree(ROOT / "tests" / "models" / "tiny-a", model_dir)
        tok = write_tokenizer_files(model_dir, keep_tokenizer_json=False)
        for settings in GENERATION_CONFIGS:
            (model_dir / "generation_config.json").write_text(json.dumps({**SPECIAL, **settings}), encoding="utf-8")
            model = M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32,
                                                                   attn_implementation="eager")
            model.eval()
            for src, tgt in (("eng_Latn", "fra_Latn"), ("rus_Cyrl", "zho_Hans")):
                tok.src_lang = src
                batch = tok(GENERATION_TEXTS, padding=True, return_tensors="pt")
                tgt_id = tok.convert_tokens_to_ids(tgt)
                with torch.no_grad():
                    out = model.generate(**batch, forced_bos_token_id=tgt_id)  # the rest from the file
                outputs = []
                for row in out.tolist():
                    assert row[0] == 2 and row[1] == tgt_id, row[:2]
                    ids = row[2:]
                    outputs.append(ids[: ids.index(2)] if 2 in ids else ids)
                cases.append({"generation_config": settings, "src_lang": src, "tgt_lang": tgt,
                              "texts": GENERATION_TEXTS, "input_ids": unpadded_ids(batch), "output_ids": outputs,
                              "output_texts": tok.batch_decode(out, skip_special_tokens=True)})
    args.out.write_text(json.dumps({"model": "tiny-a", "special": SPECIAL, "cases": cases}, ensure_ascii=False,
                                   indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
