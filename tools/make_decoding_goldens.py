"""Make tests/golden/decoding.json: transformers' `generate` with the decoding controls nllb has beside its
beam size and length (scores, n-best lists, min_new_tokens, a length limit per sentence), on tests/models/tiny-a
and the sample model.

Each case holds the settings as nllb's DecodeOptions names them, the source ids, and each sentence's
hypotheses best first: ids after the language token up to </s>, the sum of their log-probabilities and the
score the search ranked them by; where a case has prefixes, each sentence's translation is forced to start
with its prefix's pieces (nllb's --prefix-field) through prefix_allowed_tokens_fn. Greedy search: the log-softmax of each step's processed scores at the chosen token
(compute_transition_scores(normalize_logits=True)), summed up to </s> (both). Beam search: sequences_scores (the score) and that times length ** length_penalty (the sum; length
counts the generated tokens, language token and </s> included). A limit of a * source tokens + b generated
tokens (nllb's --max-length-a/b) is max_new_tokens for each sentence alone.

Run where PyTorch and transformers are installed (the GPU machine has both):

    python tools/make_decoding_goldens.py [--out tests/golden/decoding.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig, M2M100ForConditionalGeneration, NllbTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import GENERATION_TEXTS, unpadded_ids, write_tokenizer_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
EOS = 2
SETTINGS = [  # DecodeOptions' names; max_length is max_new_tokens
    {"beam_size": 1, "max_length": 24, "scores": True},
    {"beam_size": 1, "max_length": 24, "scores": True, "repetition_penalty": 1.4},
    {"beam_size": 4, "max_length": 24, "scores": True, "num_hypotheses": 4},
    {"beam_size": 4, "max_length": 24, "scores": True, "num_hypotheses": 2, "length_penalty": 0.6},
    {"beam_size": 3, "max_length": 24, "scores": True, "num_hypotheses": 3, "length_penalty": 1.5, "no_repeat_ngram_size": 2},
    {"beam_size": 1, "max_length": 24, "min_length": 6},
    {"beam_size": 4, "max_length": 24, "scores": True, "min_length": 8, "num_hypotheses": 2},
    {"beam_size": 1, "max_length": 40, "scores": True, "max_length_a": 0.5, "max_length_b": 2},
    {"beam_size": 4, "max_length": 12, "scores": True, "max_length_a": 1.2, "max_length_b": 1, "num_hypotheses": 4},
    {"beam_size": 1, "max_length": 24, "scores": True, "prefix": True},
    {"beam_size": 4, "max_length": 24, "scores": True, "num_hypotheses": 2, "prefix": True},
]
PREFIXES = ["La réunion", "", "Nous", "Ils ont trouvé", "Le", "Je suis"]  # sentence i's: PREFIXES[i % 6]


def limit(settings: dict, source_tokens: int) -> int:
    """DecodeOptions.length_limit."""
    a, b = settings.get("max_length_a"), settings.get("max_length_b")
    if a is None and b is None:
        return settings["max_length"]
    return max(1, min(settings["max_length"], int((a or 0.0) * source_tokens + (b or 0))))


def run(model, tok, batch: dict, settings: dict, tgt_id: int, max_new_tokens: int,
        prefixes: list[list[int]] | None = None) -> list[list[dict]]:
    """Each sentence's hypotheses, best first, from one call of generate; each starting with its prefix (after
    the language token) where given, as prefix_allowed_tokens_fn forces it."""
    beams = settings["beam_size"]
    n_best = settings.get("num_hypotheses", 1)
    lp = settings.get("length_penalty", 1.0)
    gen = GenerationConfig(
        num_beams=beams, num_return_sequences=n_best, length_penalty=lp, early_stopping=False,
        max_new_tokens=max_new_tokens, min_new_tokens=settings.get("min_length") or None, do_sample=False,
        repetition_penalty=settings.get("repetition_penalty", 1.0),
        no_repeat_ngram_size=settings.get("no_repeat_ngram_size", 0), forced_bos_token_id=tgt_id,
        bos_token_id=0, pad_token_id=1, eos_token_id=EOS, decoder_start_token_id=EOS,
        output_scores=True, return_dict_in_generate=True)
    every = list(range(model.config.vocab_size))

    def allowed(sentence: int, so_far) -> list[int]:
        at = len(so_far) - 2  # the position after the decoder start and the language token
        prefix = prefixes[sentence] if prefixes else []
        return [prefix[at]] if 0 <= at < len(prefix) else every

    with torch.no_grad():
        out = model.generate(**batch, generation_config=gen, prefix_allowed_tokens_fn=allowed if prefixes else None)
    sequences = out.sequences.tolist()
    if beams == 1:  # compute_transition_scores(normalize_logits=True), in float64: its float32 one strays by 1e-4
        logs = torch.stack([torch.log_softmax(s.double(), dim=-1) for s in out.scores], dim=1)  # (B, T, V)
        steps = logs.gather(2, out.sequences[:, 1 : 1 + logs.shape[1], None]).squeeze(2).tolist()
    found = []
    for row, seq in enumerate(sequences):
        assert seq[0] == EOS and seq[1] == tgt_id, seq[:2]
        tokens = seq[1:]  # the generated tokens, the language token first
        length = tokens.index(EOS) + 1 if EOS in tokens else len(tokens)
        tokens = tokens[:length]
        ids = tokens[1:-1] if tokens[-1] == EOS else tokens[1:]
        if beams == 1:
            total = float(sum(steps[row][:length]))  # the forced language token's is 0
            found.append({"ids": ids, "log_prob": total, "score": total})
        else:
            score = float(out.sequences_scores[row])
            found.append({"ids": ids, "log_prob": score * length ** lp, "score": score})
    return [found[i : i + n_best] for i in range(0, len(found), n_best)]


def cases_of(name: str, model, tok, directions: list[tuple[str, str, list[str]]]) -> list[dict]:
    cases = []
    for settings in SETTINGS:
        for src, tgt, texts in directions:
            tok.src_lang = src
            batch = tok(texts, padding=True, return_tensors="pt")
            inputs = unpadded_ids(batch)
            tgt_id = tok.convert_tokens_to_ids(tgt)
            prefixes = None
            if settings.get("prefix"):
                prefixes = [tok.convert_tokens_to_ids(tok.tokenize(PREFIXES[i % len(PREFIXES)])) for i in range(len(texts))]
            if "max_length_a" in settings or "max_length_b" in settings:  # each sentence alone, its own max_new_tokens
                hypotheses = []
                for ids in inputs:
                    one = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
                    hypotheses += run(model, tok, one, settings, tgt_id, limit(settings, len(ids)))
            else:
                hypotheses = run(model, tok, batch, settings, tgt_id, settings["max_length"], prefixes)
            cases.append({"model": name, "settings": {k: v for k, v in settings.items() if k != "prefix"},
                          "src_lang": src, "tgt_lang": tgt, "input_ids": inputs, "prefixes": prefixes,
                          "hypotheses": hypotheses})
    return cases


def load(model_dir: Path) -> M2M100ForConditionalGeneration:
    return M2M100ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32,
                                                          attn_implementation="eager").eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "decoding.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-a"  # with the tokenizer files transformers reads
        shutil.copytree(ROOT / "tests" / "models" / "tiny-a", model_dir)
        tok = write_tokenizer_files(model_dir, keep_tokenizer_json=False)
        cases = cases_of("tiny-a", load(model_dir), tok, [("eng_Latn", "fra_Latn", GENERATION_TEXTS)])
    tok, model = NllbTokenizer.from_pretrained(str(SAMPLE)), load(SAMPLE)
    texts = (HELDOUT / "eng_Latn.txt").read_text(encoding="utf-8").splitlines()[:12]
    cases += cases_of("sample", model, tok, [("eng_Latn", "fra_Latn", texts)])
    args.out.write_text(json.dumps({"cases": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
