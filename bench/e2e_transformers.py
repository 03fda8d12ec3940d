"""The transformers side of bench/e2e.py's job A: translate a text file as a user of transformers would.

    python -m bench.e2e_transformers --model DIR --src eng_Latn --tgt fra_Latn [--device cuda] [--batch-size 256]
                                     [--max-new-tokens 40] [--lengths FILE] [--timings FILE] in.txt out.txt

NllbTokenizer (src_lang), M2M100ForConditionalGeneration.from_pretrained in bf16 (float32 on the CPU) straight
onto the device, lines sorted by token count and cut into batches, greedy `generate` with
forced_bos_token_id = the target language and max_new_tokens (the language token included, as nllb's
--max-length), batch_decode(skip_special_tokens=True), the translations written in input order.

--lengths FILE: a JSON list of each line's length (bench/lengths.py: generated tokens, the language token and
</s> counted): its </s> forced there and banned before (bench.lengths.forced_end), within --max-new-tokens.

--timings FILE: time.time() at the script's start, after the imports, after the load, after the first batch,
after generation and after writing; the generated tokens (after the language token, up to </s>: what nllb's
summary counts), versions, the load's missing and unexpected keys. --tokenize-only N: no model; FILE gets
the ids of the first N lines and of the --langs codes' tokens (bench/e2e.py compares them with nllbcli's).
"""

import time

START = time.time()

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import LogitsProcessorList, M2M100ForConditionalGeneration, NllbTokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="auto: bf16 on a GPU, float32 on the CPU")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--lengths")
    parser.add_argument("--timings")
    parser.add_argument("--tokenize-only", type=int, metavar="N")
    parser.add_argument("--langs", default="")
    parser.add_argument("input")
    parser.add_argument("output")
    args = parser.parse_args()
    times = {"start": START, "imported": time.time()}
    with open(args.input, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    tokenizer = NllbTokenizer.from_pretrained(args.model, src_lang=args.src)
    if args.tokenize_only is not None:
        ids = [tokenizer(line)["input_ids"] for line in lines[: args.tokenize_only]]
        langs = {code: tokenizer.convert_tokens_to_ids(code) for code in args.langs.split(",") if code}
        write_json(args.timings, {"ids": ids, "lang_ids": langs, "tokenizer_class": type(tokenizer).__name__})
        return 0

    device = torch.device("cuda" if args.device.startswith("cuda") and ":" not in args.device else args.device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(args.dtype)
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    try:  # straight onto the device; transformers 5 names the dtype `dtype`
        model, info = M2M100ForConditionalGeneration.from_pretrained(args.model, dtype=dtype, device_map=device,
                                                                     output_loading_info=True)
        how = "from_pretrained(dtype, device_map)"
    except Exception as error:  # transformers 4 (torch_dtype), or device_map wanting accelerate
        print(f"from_pretrained(dtype=..., device_map=...) failed ({error}); loading, then .to({device})", file=sys.stderr)
        model, info = M2M100ForConditionalGeneration.from_pretrained(args.model, torch_dtype=dtype, output_loading_info=True)
        model = model.to(device)
        how = "from_pretrained(torch_dtype).to(device)"
    model.eval()
    times["loaded"] = time.time()
    tgt_id = tokenizer.convert_tokens_to_ids(args.tgt)
    eos, pad = model.generation_config.eos_token_id, tokenizer.pad_token_id

    ends = None
    if args.lengths:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench.lengths import forced_end

        with open(args.lengths, encoding="utf-8") as f:
            ends = json.load(f)
    lengths = [len(ids) for ids in tokenizer(lines)["input_ids"]]
    order = sorted(range(len(lines)), key=lambda i: -lengths[i])  # longest first, as nllb batches
    translations = [""] * len(lines)
    tokens = 0
    with torch.inference_mode():
        for first in range(0, len(order), args.batch_size):
            rows = order[first : first + args.batch_size]
            batch = tokenizer([lines[i] for i in rows], return_tensors="pt", padding=True).to(device)
            ending = None if ends is None else LogitsProcessorList([forced_end([ends[i] for i in rows], args.num_beams, eos)])
            out = model.generate(**batch, forced_bos_token_id=tgt_id, num_beams=args.num_beams, do_sample=False,
                                 max_new_tokens=args.max_new_tokens, logits_processor=ending)
            out = out.cpu()
            for i, ids in zip(rows, out.tolist()):
                generated = ids[2:]  # after the decoder start and the language token
                if eos in generated:
                    generated = generated[: generated.index(eos)]
                tokens += sum(1 for t in generated if t != pad)
            for i, text in zip(rows, tokenizer.batch_decode(out, skip_special_tokens=True)):
                translations[i] = text
            times.setdefault("first_batch_end", time.time())
    times["generated"] = time.time()
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(t.replace("\n", " ") + "\n" for t in translations))
    times["written"] = time.time()
    write_json(args.timings, {"times": times, "load": how, "generated_tokens": tokens, "sentences": len(lines), "dtype": str(dtype),
                              "torch": torch.__version__, "transformers": transformers.__version__,
                              "missing_keys": sorted(info.get("missing_keys", [])),
                              "unexpected_keys": sorted(info.get("unexpected_keys", [])),
                              "mismatched_keys": [str(k) for k in info.get("mismatched_keys", [])]})
    return 0


def write_json(path, data) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)


if __name__ == "__main__":
    sys.exit(main())
