"""Make a tiny PEFT LoRA adapter for tests/models/tiny-a under tests/models/tiny-a-lora, and its goldens in
tests/golden/tiny-a-lora.json.

Run where PyTorch, transformers and peft are installed (none is a runtime or test dependency):

    /opt/ref/bin/python tools/make_lora_fixtures.py

The adapter is what `PeftModel.save_pretrained` writes: adapter_config.json and adapter_model.safetensors. It
targets every projection nllbcli merges (q/k/v/out_proj of all three attentions, fc1, fc2), with a rank and an
alpha pattern so that modules differ in rank and scale, and its B matrices random (PEFT starts them at zero,
which would make the adapter a no-op and the test empty). The goldens are PeftModel's `generate` with the
adapter *not* merged (LoRA computed beside the base weights), greedy and beam 4, float32 on the CPU.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import M2M100ForConditionalGeneration, NllbTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import GENERATION_TEXTS, forced_generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "tests" / "models" / "tiny-a"
OUT = ROOT / "tests" / "models" / "tiny-a-lora"


def main() -> int:
    torch.manual_seed(11)
    model = M2M100ForConditionalGeneration.from_pretrained(str(BASE), dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, bias="none", init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"],
        rank_pattern={"fc1": 2}, alpha_pattern={"encoder_attn.v_proj": 3.0},
    )
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)
    model.eval()
    shutil.rmtree(OUT, ignore_errors=True)
    model.save_pretrained(str(OUT))

    tok = NllbTokenizer.from_pretrained(str(BASE))
    cases = []
    for src, tgt in (("eng_Latn", "fra_Latn"), ("rus_Cyrl", "zho_Hans")):
        tok.src_lang = src
        batch = tok(GENERATION_TEXTS, padding=True, return_tensors="pt")
        tgt_id = tok.convert_tokens_to_ids(tgt)
        for beams in (1, 4):
            outputs, _ = forced_generate(model, batch, tgt_id, num_beams=beams, length_penalty=1.0, max_new_tokens=24)
            cases.append({"src_lang": src, "tgt_lang": tgt, "beam_size": beams, "max_length": 24, "texts": GENERATION_TEXTS,
                          "output_ids": outputs})
    golden = {"model": "tiny-a", "adapter": "tiny-a-lora", "generate": cases}
    (ROOT / "tests" / "golden" / "tiny-a-lora.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(sorted(p.name for p in OUT.iterdir()), json.loads((OUT / "adapter_config.json").read_text())["target_modules"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
