"""Check `nllb translate --device cpu` against transformers on a model directory it has never seen.

Makes a fresh NLLB-format model with transformers' own initialisation (seeded; dimensions from the options,
encoder and decoder depths that differ), saves it with `save_pretrained`, then translates the same lines
with transformers' `generate` and with the `nllb` command, greedy and beam, and compares the texts exactly.
Needs PyTorch and transformers (not dependencies of nllbcli):

    python tools/check_parity.py --d-model 96 --encoder-layers 2 --decoder-layers 5 --heads 4 --ffn 160
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import CORPUS, train_sentencepiece, write_tokenizer_files  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--decoder-layers", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--max-length", type=int, default=30)
    parser.add_argument("--src", default="eng_Latn")
    parser.add_argument("--tgt", default="deu_Latn")
    parser.add_argument("--nllb", default="nllb", help="the nllb command to test")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        train_sentencepiece(model_dir, args.vocab)
        sp_size = spm.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.bpe.model")).get_piece_size()
        tok = write_tokenizer_files(model_dir, keep_tokenizer_json=True)
        config = M2M100Config(
            vocab_size=sp_size + 206, d_model=args.d_model, encoder_layers=args.encoder_layers,
            decoder_layers=args.decoder_layers, encoder_attention_heads=args.heads, decoder_attention_heads=args.heads * 2,
            encoder_ffn_dim=args.ffn, decoder_ffn_dim=args.ffn + 32, max_position_embeddings=128,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        )
        torch.manual_seed(args.seed)
        model = M2M100ForConditionalGeneration(config).eval()
        dtype = getattr(torch, args.dtype)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).to(torch.float32))  # compute with exactly the stored values
        saved = M2M100ForConditionalGeneration(config)
        saved.load_state_dict(model.state_dict())
        saved.to(dtype).save_pretrained(str(model_dir))

        lines = [line for line in CORPUS.splitlines() if line][:12]
        source = Path(tmp) / "in.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        failures = 0
        for beams in (1, 4):
            tok.src_lang = args.src
            batch = tok(lines, padding=True, return_tensors="pt")
            gen = GenerationConfig(
                num_beams=beams, max_new_tokens=args.max_length, early_stopping=False, length_penalty=1.0,
                forced_bos_token_id=tok.convert_tokens_to_ids(args.tgt), decoder_start_token_id=2, eos_token_id=2,
                pad_token_id=1, bos_token_id=0, do_sample=False,
            )
            with torch.no_grad():
                expected = tok.batch_decode(model.generate(**batch, generation_config=gen), skip_special_tokens=True)
            result = subprocess.run(
                [args.nllb, "translate", "--src", args.src, "--tgt", args.tgt, "--model", str(model_dir), "--device", "cpu",
                 "--beam-size", str(beams), "--max-length", str(args.max_length), str(source), "-"],
                capture_output=True, text=True,
            )
            if result.returncode:
                print(result.stderr, file=sys.stderr)
                return 1
            got = result.stdout.split("\n")[:-1]
            same = sum(a == b for a, b in zip(got, expected))
            print(f"beam {beams}: {same}/{len(lines)} lines identical to transformers, e.g. {expected[0][:40]!r}")
            for a, b in zip(got, expected):
                if a != b:
                    print(f"  nllb:         {a!r}\n  transformers: {b!r}")
            failures += len(lines) - same
        print(f"model: d_model {args.d_model}, {args.encoder_layers}+{args.decoder_layers} layers, {args.dtype}; "
              f"{sum(p.numel() for p in model.parameters()):,} parameters")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
