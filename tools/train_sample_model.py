"""Train the sample NLLB-format model (M2M100ForConditionalGeneration) on the pre-tokenized sample data.

Inputs (made on the CPU machine, carried to the GPU machine):
    DATA/tokens.npz         from tools/make_sample_tokenizer.py: piece ids [tuples, 5 languages, width]
    DATA/heldout.tsv        the held-out sentences (the evaluation references)
    TOKENIZER_DIR           sentencepiece.bpe.model, tokenizer.json, tokenizer_config.json

Every step draws a batch of (tuple, source language, target language) at random over all 20
directions between the five languages. A source is `[src_lang] pieces </s>`, a label sequence
`[tgt_lang] pieces </s>`, and the decoder input is the labels shifted right behind `</s>` (NLLB's
decoder start), as transformers' NllbTokenizer and shift_tokens_right make them.

The number of steps is --steps, or, with --steps 0, what fits in --train-seconds at the speed measured
over the first steps (the chosen number is printed and written to the results: pass it as --steps to
reproduce the run). At the end the model is saved with bfloat16 weights, loaded back in float32, and
decoded greedily (`generate`, forced target language, one beam) on every held-out sentence in every
direction; exact match and chrF (sacrebleu) per direction go to OUT/results.json, the outputs to
OUT/hypotheses.json and the model directory to OUT/model/.

Usage (GPU): python tools/train_sample_model.py --data .scratch/data --out $OUT
Check (CPU): python tools/train_sample_model.py --data .scratch/data --out /tmp/x --steps 20 --tiny
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration
from transformers.utils import logging as hf_logging

LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
LANG_INDEX = {"eng_Latn": 46, "fra_Latn": 56, "deu_Latn": 41, "spa_Latn": 160, "ita_Latn": 76}  # in FLORES-200 order
BOS, PAD, EOS, UNK = 0, 1, 2, 3
REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ("sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_config(vocab_size: int, tiny: bool) -> M2M100Config:
    d, layers, heads, ffn = (64, 1, 2, 128) if tiny else (256, 3, 4, 1024)
    return M2M100Config(
        vocab_size=vocab_size, d_model=d, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        activation_function="relu", scale_embedding=True, max_position_embeddings=256,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        init_std=0.02, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
        tie_word_embeddings=True, use_cache=True, architectures=["M2M100ForConditionalGeneration"],
    )


def generation_config() -> GenerationConfig:
    return GenerationConfig(bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=EOS,
                            max_length=200)


def with_specials(pieces: torch.Tensor, lang_ids: torch.Tensor) -> torch.Tensor:
    """[lang] pieces </s> <pad>...: pieces (B, W) padded with PAD, lang_ids (B,) -> (B, W + 2)."""
    b, w = pieces.shape
    lengths = (pieces != PAD).sum(1)
    out = torch.full((b, w + 2), PAD, dtype=torch.long, device=pieces.device)
    out[:, 0] = lang_ids
    out[:, 1 : w + 1] = pieces
    out[torch.arange(b, device=pieces.device), lengths + 1] = EOS
    return out


def make_batch(tokens: torch.Tensor, lang_ids: torch.Tensor, directions: torch.Tensor, batch: int,
               gen: torch.Generator):
    """A random batch over all directions: input_ids, attention_mask, decoder_input_ids, labels."""
    dev = tokens.device
    rows = torch.randint(tokens.shape[0], (batch,), device=dev, generator=gen)
    d = directions[torch.randint(directions.shape[0], (batch,), device=dev, generator=gen)]
    src = with_specials(tokens[rows, d[:, 0]].long(), lang_ids[d[:, 0]])
    tgt = with_specials(tokens[rows, d[:, 1]].long(), lang_ids[d[:, 1]])
    widths = torch.stack([(src != PAD).sum(1).max(), (tgt != PAD).sum(1).max()]).tolist()  # one sync
    src, tgt = src[:, : widths[0]], tgt[:, : widths[1]]
    dec = torch.cat([torch.full_like(tgt[:, :1], EOS), tgt[:, :-1]], dim=1)  # shift_tokens_right
    labels = tgt.masked_fill(tgt == PAD, -100)
    return src, (src != PAD).long(), dec, labels


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def decode(sp: spm.SentencePieceProcessor, ids: list[int]) -> str:
    size = sp.get_piece_size()
    return sp.decode([i - 1 for i in ids if 3 < i <= size])


@torch.no_grad()
def translate(model, sp, src_pieces: torch.Tensor, src_lang: str, tgt_lang: str, lang_ids, batch: int = 512):
    """Greedy translations of pre-tokenized sources (N, W) as text."""
    out = []
    dev = next(model.parameters()).device
    for i in range(0, src_pieces.shape[0], batch):
        chunk = src_pieces[i : i + batch].to(dev).long()
        src = with_specials(chunk, torch.full((chunk.shape[0],), lang_ids[LANGS.index(src_lang)], device=dev))
        width = int((src != PAD).sum(1).max())
        src = src[:, :width]
        gen = model.generate(input_ids=src, attention_mask=(src != PAD).long(),
                             forced_bos_token_id=int(lang_ids[LANGS.index(tgt_lang)]), num_beams=1,
                             do_sample=False, max_new_tokens=64)
        out += [decode(sp, row.tolist()) for row in gen]
    return out


def chrf(hyps: list[str], refs: list[str]) -> float | None:
    try:
        import sacrebleu
    except ImportError:  # computed afterwards on the CPU machine from hypotheses.json
        return None
    return round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)


def evaluate(model, sp, held: torch.Tensor, refs: list[list[str]], lang_ids, limit: int | None = None):
    """Exact match and chrF per direction on the held-out set."""
    model.eval()
    results, hyps_all = {}, {}
    n = held.shape[0] if limit is None else min(limit, held.shape[0])
    for si, s in enumerate(LANGS):
        for ti, t in enumerate(LANGS):
            if si == ti:
                continue
            hyps = translate(model, sp, held[:n, si], s, t, lang_ids)
            gold = [r[ti] for r in refs[:n]]
            exact = sum(h == g for h, g in zip(hyps, gold)) / n
            results[f"{s}-{t}"] = {"exact": round(100 * exact, 2), "chrf": chrf(hyps, gold), "n": n}
            hyps_all[f"{s}-{t}"] = hyps
    return results, hyps_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(REPO / ".scratch" / "data"))
    ap.add_argument("--tokenizer-dir", default=str(REPO / "data" / "samples" / "model"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0, help="0: as many as fit in --train-seconds")
    ap.add_argument("--train-seconds", type=float, default=360.0)
    ap.add_argument("--batch", type=int, default=2048, help="sentence pairs per step")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, to check the script on a CPU")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out tuples to evaluate (default: all)")
    args = ap.parse_args()
    t_start = time.time()
    hf_logging.set_verbosity_error()  # generate() warns once per call that max_new_tokens overrides max_length
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    npz = np.load(Path(args.data) / "tokens.npz")
    sp_size = int(npz["sp_size"])
    tokens = torch.from_numpy(npz["train"].astype(np.int32)).to(dev)  # (N, 5, W)
    held = torch.from_numpy(npz["heldout"].astype(np.int32))
    with open(Path(args.data) / "heldout.tsv", encoding="utf-8") as f:
        refs = [line.rstrip("\n").split("\t") for line in f]
    sp = spm.SentencePieceProcessor(model_file=str(Path(args.tokenizer_dir) / "sentencepiece.bpe.model"))
    assert sp.get_piece_size() == sp_size
    for r in range(held.shape[0]):  # the references are what the pieces decode to
        for j in range(len(LANGS)):
            assert decode(sp, [int(x) for x in held[r, j] if x != PAD]) == refs[r][j], refs[r][j]
    lang_ids = torch.tensor([sp_size + 1 + LANG_INDEX[lang] for lang in LANGS], device=dev)
    directions = torch.tensor([(s, t) for s in range(5) for t in range(5) if s != t], device=dev)
    vocab_size = (sp_size + 204 + 7) // 8 * 8  # langs and <mask> after the pieces, rounded up to 8

    config = make_config(vocab_size, args.tiny)
    model = M2M100ForConditionalGeneration(config).to(dev)
    model.generation_config = generation_config()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"device {dev} ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}); torch {torch.__version__}; "
          f"{n_params:,} parameters; vocab {vocab_size}; train {tuple(tokens.shape)}; held-out {tuple(held.shape)}",
          flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8, fused=dev.type == "cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    total = args.steps if args.steps > 0 else 10**9
    calib = (20, 120)  # steps between which the speed is measured when --steps 0
    t0 = time.time()
    log_loss, log_tokens, log_t = 0.0, 0, time.time()
    history = []
    step = 0
    model.train()
    while step < total:
        if step == calib[0]:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_calib = time.time()
        if step == calib[1] and args.steps <= 0:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / (calib[1] - calib[0])
            left = args.train_seconds - (time.time() - t0)
            total = max(calib[1] + 100, int(calib[1] + left / per_step) // 100 * 100)
            print(f"speed {1 / per_step:.1f} steps/s: training {total} steps", flush=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)
        src, mask, dec, labels = make_batch(tokens, lang_ids, directions, args.batch, gen)
        with autocast:
            logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               label_smoothing=args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        log_loss += loss.detach()
        log_tokens += int(labels.numel())
        if step % 250 == 0 or step == total:
            n = 250 if step % 250 == 0 else step % 250
            avg = float(log_loss) / n
            rate = log_tokens / (time.time() - log_t)
            print(f"step {step:5d}/{total}  loss {avg:.4f}  lr {opt.param_groups[0]['lr']:.2e}  "
                  f"{rate:,.0f} target tokens/s (padded)  {time.time() - t0:.0f}s", flush=True)
            history.append({"step": step, "loss": round(avg, 4), "seconds": round(time.time() - t0, 1)})
            log_loss, log_tokens, log_t = 0.0, 0, time.time()
        if step % 2500 == 0 and step < total:
            res, _ = evaluate(model, sp, held, refs, lang_ids, limit=100)
            ex = [v["exact"] for v in res.values()]
            print(f"  eval@{step} (100 held-out, 20 directions): exact mean {np.mean(ex):.1f} min {min(ex):.1f}",
                  flush=True)
            model.train()
    train_seconds = time.time() - t0

    # Ship bfloat16 weights, and score what ships: load them back in float32.
    model_dir = out / "model"
    model.to(torch.bfloat16).save_pretrained(str(model_dir), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (Path(args.tokenizer_dir) / name).is_file():
            shutil.copy(Path(args.tokenizer_dir) / name, model_dir / name)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    shipped = M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).to(dev)
    t_eval = time.time()
    results, hyps = evaluate(shipped, sp, held, refs, lang_ids, limit=args.eval_limit)
    eval_seconds = time.time() - t_eval
    for k, v in results.items():
        print(f"{k}: exact {v['exact']:6.2f}%  chrF {v['chrf']}", flush=True)
    ex = [v["exact"] for v in results.values()]
    summary = {
        "steps": step, "batch": args.batch, "lr": args.lr, "warmup": args.warmup, "seed": args.seed,
        "label_smoothing": args.label_smoothing, "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
        "parameters": n_params, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "exact_min": min(ex), "exact_mean": round(float(np.mean(ex)), 2),
        "history": history, "directions": results,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    (out / "hypotheses.json").write_text(json.dumps(hyps, ensure_ascii=False))
    print(f"exact match: min {min(ex):.2f}% mean {np.mean(ex):.2f}%; trained {step} steps in {train_seconds:.0f}s; "
          f"total {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
