"""End-to-end measurements of issue 5 that bench/harness.py does not make: whole `nllb translate` jobs, timed
from outside the process, against a transformers script doing the same job.

(A) small job: N sentences (default 1,000) through `nllb translate` (process start to exit, warm CuPy kernel
    cache) against bench/e2e_transformers.py (M2M100ForConditionalGeneration in bf16 on cuda, NllbTokenizer,
    greedy, batches sorted by length, decode, write), model load included on both sides. Goal: 3x.
(B) start-up: from the command's start to its first batch on the GPU, warm cache (goal 5 s) and cold cache
    (CUPY_CACHE_DIR an empty directory; goal 60 s).
(C) whole job: `nllb translate` over 100,000 sentences against the engine alone (the Translator's generate on
    the same pre-tokenized ids, no reading, tokenizing, decoding or writing). Goal: at least 90%.
(R) real lengths: the same job (--sentences) through `nllb translate` and bench/e2e_transformers.py, each with
    every sentence --new-tokens long (forced) and with each ending at its own length (real: bench/lengths.py,
    the sample model's held-out length ratios, at most 200 tokens): each engine's generated tokens/s (the
    language token and the last token counted, the same count on both sides) after its model load, how much of
    its forced-length speed it keeps, and nllb / transformers at each.
(D) one JSONL job several ways (--ways): plain, --devices 0 (a worker process), --ray (a local Ray started by
    the job, one GPU actor) and --ray joining a Ray started before (cluster): wall time of each, outputs
    compared byte for byte, and for Ray the span of its blocks from Ray Data's log. Goal: each within 10% of
    plain.

On the H200 (from the repository root; python3 has CuPy, torch and transformers there). Each command fits the
device tool's 10 minutes; --timeout bounds every process it starts:

    # A and B, 600M shape, 1,000 sentences: about 2-4 minutes (model build ~15 s; tokenizer check ~10 s; the
    # cold nllb run, i.e. the kernel compile, 30-90 s (unmeasured so far); a warm nllb run ~10 s; transformers
    # warm-up on 64 lines + one timed run ~20 s each)
    python3 -m bench.e2e --measure A,B --model-dir /tmp/e2e-model --cache-dir /tmp/e2e-cupy --timeout 280 \
        --out $OUT/e2e_ab.jsonl

    # C, 100,000 sentences: about 3-5 minutes (input ~12 s; reuses /tmp/e2e-model and the warm kernel cache if
    # the machine is still held, else rebuilds them first; a warm-up nllb run on the first chunk; the nllb job
    # and the engine alone on the CLI's batches ~0.5-2 min each, depending on the CLI's GPU batch defaults; the
    # engine alone on 4,096-sentence batches, as the harness, ~0.5 min)
    python3 -m bench.e2e --measure C --sentences 100000 --model-dir /tmp/e2e-model --cache-dir /tmp/e2e-cupy \
        --timeout 280 --out $OUT/e2e_c.jsonl

    # more transformers batch sizes for A (one more process each, ~20 s): --tf-batch 128,256,1000

Here, on the CPU (reference engine; transformers from another interpreter, float32 on the CPU):

    .venv/bin/python -m bench.e2e --device cpu --shape tiny --sentences 50 --measure A,B,C \
        --transformers-python /opt/ref/bin/python

The model: a directory in the hub layout (config.json as NLLB's, bf16 model.safetensors with the tied embedding
stored once as model.shared.weight, generation_config.json) with seeded random weights of a nllbcli/model/shapes.py
shape, and the tokenizer of data/samples/model (sentencepiece.bpe.model, tokenizer.json,
tokenizer_config.json): its ids stop at 3,203, far below the 600M vocabulary, which random weights do not
mind. Both tokenizers are checked to give the same ids (--no-check skips it).

Fixed output length: the weights make </s> (and every id that is not a sentencepiece piece of that tokenizer)
unreachable, so both sides always generate exactly --new-tokens tokens (the language token included:
nllbcli's --max-length, transformers' max_new_tokens) and the decoded text is real pieces. How: embedding
column 0 is +1/16 for the piece ids 4..pieces-1 and -1/16 for all others, and the decoder's final LayerNorm
has weight 0 and bias 128 in dimension 0, so every logit gets +-8 on top of random noise of about 0.6; every
other value is random (uniform, 0.02 deviation, bf16 values). The computation (and its cost) is that of any
weights: the config's eos_token_id stays 2, as in NLLB's config. Measured on the 600M shape with transformers
on the CPU: the best piece's logit at least 9.9, every other id's at most -4.8, in float32 and in bf16; the
outputs repeat one piece or a few, as random tied embeddings do (cost does not depend on the values), and
nllbcli's reference engine gives transformers' float32 ids and text exactly.

Start-up (B) without touching nllbcli: every nllb run is `python -m bench.e2e __probe__ translate ...`, which
wraps nllbcli.model.translator's load_translator and Translator.generate with timestamps (time.time(), the clock
the parent reads before starting the process) and then runs nllbcli.cli.main() as the `nllb` script does.
"first batch start" is the first call of Translator.generate (weights on the GPU, the first chunk read and
tokenized, the batch handed to the engine); "first batch end" its return (ids back on the host: that batch
encoded and all its decoding steps done, every kernel it uses compiled). `--progress json` gives no earlier
sign: its first line comes 5 s after the job starts. --plain runs `python -m nllbcli.cli` instead (no
timestamps; A and C unchanged within noise).

Results are JSON lines on stdout (and --out FILE): setup, check, one per process run, then A, B, C.
"""

import json
import os
import sys
import time


def spans_into(calls: dict, name: str, fn):
    """fn, recording each call's [start, end] (wall clock) into calls[name]."""
    def call(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.setdefault(name, []).append([start, time.time()])

    return call


def instrument(calls: dict) -> None:
    """[start, end] of the engine's own parts into `calls`: "encode" (the encoder's launches, host time), "search"
    (the decoding loop, fetching the ids included) and "fetch" (the host waiting for a step's ids: the GPU's
    time it did not hide); inside the search, "start" (the decoder's set-up: its copies to the device wait for
    the encoder's work queued before them) and "select" (rows that ended leave the state: copies too). In a
    job against the engine alone they show where the job's generate loses time."""
    import nllbcli.model.search as search
    from nllbcli.model.engine import cuda

    def timed(name, fn):
        return spans_into(calls, name, fn)

    copy = cuda.copy_to_host_later

    def copy_timed(a):
        return timed("fetch", copy(a))

    cuda.copy_to_host_later = copy_timed
    cuda.CudaEngine.encode = timed("encode", cuda.CudaEngine.encode)
    cuda.CudaEngine.start = timed("start", cuda.CudaEngine.start)
    cuda.CudaEngine.select = timed("select", cuda.CudaEngine.select)
    search.greedy_search = timed("search", search.greedy_search)
    search.beam_search = timed("search", search.beam_search)


def probe(argv: list[str]) -> None:
    """`nllb` with timestamps: run in the child process, before anything else is imported."""
    events = {"probe_start": time.time()}
    path = os.environ["NLLB_E2E_PROBE"]
    import atexit

    def dump() -> None:
        events["exit"] = time.time()
        with open(path + ".tmp", "w") as f:
            json.dump(events, f)
        os.replace(path + ".tmp", path)

    atexit.register(dump)
    import nllbcli.model.translator as translator

    events["imported"] = time.time()
    load, generate = translator.load_translator, translator.Translator.generate

    def timed_load(*args, **kwargs):
        events.setdefault("load_start", time.time())
        result = load(*args, **kwargs)
        events.setdefault("load_end", time.time())
        return result

    calls: dict[str, list] = {"generate": [], "prepare": [], "write": [], "translate": [], "commit": []}  # [start, end]
    events["calls"] = calls

    def timed_generate(self, *args, **kwargs):
        start = time.time()
        events.setdefault("first_batch_start", start)
        result = generate(self, *args, **kwargs)
        events.setdefault("first_batch_end", time.time())
        calls["generate"].append([start, time.time()])
        return result

    translator.load_translator, translator.Translator.generate = timed_load, timed_generate
    try:
        instrument(calls)
    except ImportError:  # no CuPy: the CPU's engine
        pass
    import nllbcli.job.chunks as chunks
    import nllbcli.job.loop as loop

    def timed(name, fn):
        return spans_into(calls, name, fn)

    # the reader thread's tokenizing, the main thread's translating, and the finisher's writing and committing
    for where, name, attr in ((chunks.ChunkWorker, "prepare", "prepare"), (chunks.ChunkWorker, "translate", "translate"),
                              (loop, "write", "write_chunk"), (loop, "commit", "save_state")):
        if hasattr(where, attr):
            setattr(where, attr, timed(name, getattr(where, attr)))
    if os.environ.get("NLLB_E2E_LENGTHS"):  # measure R: each sentence ends at its own length
        from bench import lengths

        lengths.install(lengths.held_out_ratios())
    from nllbcli.cli import main

    sys.argv = ["nllb", *argv]
    main()


if __name__ == "__main__" and sys.argv[1:2] == ["__probe__"]:
    probe(sys.argv[2:])
    sys.exit(0)

import argparse
import datetime
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
from nllbcli.model.shapes import DEFAULT, PRESETS, parameter_count
from nllbcli.model.shapes import random_weights as shape_weights
from nllbcli.model.checkpoint import ModelConfig, write_safetensors

from bench.lengths import CAP, GUARD

SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
TOKENIZER_FILES = ("sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json")
TINY = ModelConfig(vocab_size=8000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=1024)
SHAPES = {**{name: p.config for name, p in PRESETS.items()}, "tiny": TINY}
CHECK_LANGS = ("eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn", "ace_Arab", "zho_Hant", "zul_Latn")
BIAS, COLUMN = 128.0, 1 / 16  # the decoder's final LayerNorm bias in dimension 0, embedding column 0: +-8 per logit


def emit(record: dict, out) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


# ------------------------------------------------------------------------------------------------------ model


def random_weights(config: ModelConfig, seed: int, pieces: int) -> dict[str, np.ndarray]:
    """transformers' names -> float32 arrays holding bf16 values (nllbcli/model/shapes.py's random weights, deviation
    0.02, every layer of a side sharing its arrays: the file still holds each layer), the tied embedding stored
    once as model.shared.weight. Ids 4..pieces-1 only can win the argmax (see the module's docstring)."""
    ties = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
    weights = shape_weights(config, seed, scale=0.02, embed_scale=0.02, share_layers=True)
    shared = weights[ties[0]]
    shared[:, 0] = -COLUMN
    shared[4:pieces, 0] = COLUMN
    out = {"model.shared.weight": shared}
    out.update({f"model.{name}": a for name, a in weights.items() if name not in ties})
    out["model.decoder.layer_norm.weight"][0] = 0.0
    out["model.decoder.layer_norm.bias"][0] = BIAS
    return out


def hub_config(c: ModelConfig) -> dict:
    """config.json as facebook/nllb-200-distilled-600M's, with this shape and bf16."""
    return {
        "activation_dropout": 0.0, "activation_function": c.activation_function,
        "architectures": ["M2M100ForConditionalGeneration"], "attention_dropout": 0.1, "bos_token_id": c.bos_token_id,
        "d_model": c.d_model, "decoder_attention_heads": c.decoder_attention_heads, "decoder_ffn_dim": c.decoder_ffn_dim,
        "decoder_layerdrop": 0, "decoder_layers": c.decoder_layers, "decoder_start_token_id": c.decoder_start_token_id,
        "dropout": 0.1, "encoder_attention_heads": c.encoder_attention_heads, "encoder_ffn_dim": c.encoder_ffn_dim,
        "encoder_layerdrop": 0, "encoder_layers": c.encoder_layers, "eos_token_id": c.eos_token_id, "init_std": 0.02,
        "is_encoder_decoder": True, "max_position_embeddings": c.max_position_embeddings, "model_type": "m2m_100",
        "num_hidden_layers": c.encoder_layers, "pad_token_id": c.pad_token_id, "scale_embedding": c.scale_embedding,
        "tie_word_embeddings": True, "tokenizer_class": "NllbTokenizer", "torch_dtype": "bfloat16",
        "transformers_version": "4.21.0.dev0", "use_cache": True, "vocab_size": c.vocab_size,
    }


def sample_pieces() -> int:
    """Ids below this are <s> <pad> </s> <unk> and the sample tokenizer's pieces; its language codes follow."""
    from nllbcli.model.tokenizer import NllbTokenizer

    return min(NllbTokenizer.from_model_dir(SAMPLE).lang_ids.values())


def build_model(model_dir: Path, shape: str, seed: int) -> dict:
    """Make (or reuse, when its stamp matches) a model directory of `shape` with random weights."""
    stamp = {"shape": shape, "seed": seed, "bias": BIAS, "column": COLUMN}
    stamp_file = model_dir / "e2e.json"
    if stamp_file.is_file():
        found = json.loads(stamp_file.read_text())
        if found != stamp:
            raise SystemExit(f"{model_dir} holds another e2e model ({found}), not {stamp}: remove it or pick another --model-dir")
        return {"model_dir": str(model_dir), "built": False, "build_s": 0.0}
    if model_dir.exists() and any(model_dir.iterdir()):
        raise SystemExit(f"{model_dir} exists, is not empty and is not an e2e model: pick another --model-dir")
    t = time.perf_counter()
    config = SHAPES[shape]
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    os.chmod(staging, 0o755)
    try:
        write_safetensors(staging / "model.safetensors", random_weights(config, seed, sample_pieces()), "BF16",
                          metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(hub_config(config), indent=2, sort_keys=True) + "\n")
        generation = {"bos_token_id": 0, "decoder_start_token_id": 2, "eos_token_id": 2, "max_length": 200, "pad_token_id": 1}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            shutil.copyfile(SAMPLE / name, staging / name)
        (staging / "e2e.json").write_text(json.dumps(stamp) + "\n")
        if model_dir.exists():
            model_dir.rmdir()
        os.rename(staging, model_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"model_dir": str(model_dir), "built": True, "build_s": time.perf_counter() - t}


def model_and_cache(args, work: Path, model: Path | None = None) -> tuple[Path, dict, Path, object]:
    """A run's model directory (`model` as it is, else args.model_dir or one in `work`, built of args.shape with
    random weights or reused), what build_model said of it, the kernel cache (args.cache_dir or one in `work`)
    and the model's tokenizer."""
    from nllbcli.model.tokenizer import tokenizer_from_model_dir

    if model is not None:
        model_dir, built = model.resolve(), {"model_dir": str(model.resolve()), "built": False}
    else:
        model_dir = args.model_dir or work / "model"
        built = build_model(model_dir, args.shape, args.seed)
    cache_dir = args.cache_dir or work / "cupy-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    return model_dir, built, cache_dir, tokenizer_from_model_dir(model_dir)


# ------------------------------------------------------------------------------------------------------ input


def make_sentences(n: int, seed: int, tokenizer, src: str) -> list[str]:
    """n English lines of one sentence each, 10 to 60 source ids (language token and </s> included), lengths
    drawn uniformly: held-out sentences, shuffled, full stops dropped, joined with ", and", cut at a word."""
    rng = random.Random(seed)
    path = HELDOUT / f"{src}.txt"
    clauses = [line.strip().rstrip(".") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []
    if not clauses:
        raise SystemExit(f"no held-out sentences for {src} in {HELDOUT}")
    words: list[str] = []
    starts: list[int] = []  # where each clause begins
    while len(words) < 100_000:
        order = clauses[:]
        rng.shuffle(order)
        for clause in order:
            starts.append(len(words))
            words += clause.split() + ["and"]
            words[-2] += ","
    starts = [i for i in starts if i < len(words) - 100]
    cost: dict[str, int] = {}
    lines = []
    for _ in range(n):
        target = rng.randint(10, 60)
        position = rng.choice(starts)
        taken, tokens = [], 3  # the language token, </s> and the full stop
        while True:
            word = words[position]
            if word not in cost:
                cost[word] = len(tokenizer.encode_pieces(word))
            if tokens + cost[word] > target and tokens >= 12:  # 12: room for a dropped "and" and ","
                break
            taken.append(word)
            tokens += cost[word]
            position += 1
        while len(taken) > 1 and taken[-1] == "and":
            taken.pop()
        line = " ".join(taken).rstrip(",") + "."
        while len(tokenizer.encode(line, src)) > 60 and len(taken) > 1:  # the estimate is a piece or two off at times
            taken.pop()
            line = " ".join(taken).rstrip(",") + "."
        lines.append(line)
    return lines


def write_input(work: Path, lines: list[str]) -> tuple[Path, Path]:
    text, jsonl = work / "in.txt", work / "in.jsonl"
    text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    jsonl.write_text("".join(json.dumps({"text": line}, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    return text, jsonl


def input_stats(lines: list[str], tokenizer, src: str) -> dict:
    from nllbcli.model.split import split_text

    lengths = [len(tokenizer.encode(line, src)) for line in lines]
    sentences = sum(len(split_text(line)[0]) for line in lines)
    return {"lines": len(lines), "sentences": sentences, "src_ids_min": min(lengths), "src_ids_mean": statistics.mean(lengths),
            "src_ids_max": max(lengths), "src_ids_total": sum(lengths)}


# -------------------------------------------------------------------------------------------------- processes


def run_process(command: list[str], env: dict, timeout: float, stdout_path: Path, stderr_path: Path,
                stdin_path: Path | None = None) -> dict:
    """Run, time with a wall clock around it, kill its process group past `timeout`; stdin from `stdin_path`."""
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err, \
            (open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb")) as given:
        t0 = time.time()
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err, stdin=given,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = "timeout"
        t1 = time.time()
    return {"t0": t0, "wall_s": t1 - t0, "exit": code}


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def summary_of(stderr_path: Path) -> dict | None:
    """The `--progress json` summary line of an nllb run."""
    for line in reversed(tail(stderr_path, 1 << 20).splitlines()):
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "summary":
                return record
    return None


class Runner:
    def __init__(self, args, model_dir: Path, work: Path, cache_dir: Path, out):
        self.args, self.model_dir, self.work, self.cache_dir, self.out = args, model_dir, work, cache_dir, out
        self.count = 0

    def env(self, cache_dir: Path | None = None, **extra: str) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env["CUPY_CACHE_DIR"] = str(cache_dir or self.cache_dir)
        env.update(extra)
        return env

    def nllb(self, label: str, source: Path, cache_dir: Path | None = None, timeout: float | None = None,
             real_lengths: bool = False) -> dict:
        """One `nllb translate` job; returns its record (wall, exit, summary, start-up timestamps). real_lengths:
        each sentence ends at its own length (bench/lengths.py, installed by the probe), within the limits of
        lengths.GUARD."""
        a = self.args
        self.count += 1
        tag = f"nllb{self.count}"
        output = self.work / f"{tag}.out{source.suffix}"
        probe_file = self.work / f"{tag}.probe.json"
        options = ["translate", "--src", a.src, "--tgt", a.tgt, "--model", str(self.model_dir), "--device", a.device,
                   "--beam-size", str(a.beam_size), "--max-length", str(CAP if real_lengths else a.new_tokens),
                   "--progress", "json"]
        if real_lengths:  # the limits a job gives (docs/DECODING.md), which the pool is planned by
            options += ["--max-length-a", str(GUARD["max_length_a"]), "--max-length-b", str(GUARD["max_length_b"])]
        if a.max_batch_tokens:
            options += ["--max-batch-tokens", str(a.max_batch_tokens)]
        if a.chunk_rows:
            options += ["--chunk-rows", str(a.chunk_rows)]
        # --nllb-stdin: the input through a pipe, which nllb reads and tokenizes on its main thread (no reader thread)
        options += shlex.split(a.nllb_args) + ["-" if a.nllb_stdin else str(source), str(output)]
        if a.plain and not real_lengths:
            command = [a.nllb_python, "-m", "nllbcli.cli", *options]
        else:
            command = [a.nllb_python, "-m", "bench.e2e", "__probe__", *options]
        extra = {"NLLB_E2E_LENGTHS": "1"} if real_lengths else {}
        run = run_process(command, self.env(cache_dir, NLLB_E2E_PROBE=str(probe_file), **extra), timeout or a.timeout,
                          self.work / f"{tag}.stdout", self.work / f"{tag}.stderr", source if a.nllb_stdin else None)
        record = {"what": "nllb_run", "label": label, "input": source.name, "cache_dir": str(cache_dir or self.cache_dir),
                  "wall_s": run["wall_s"], "exit": run["exit"], "summary": summary_of(self.work / f"{tag}.stderr"),
                  "command": shlex.join(command), "output": str(output)}
        if probe_file.is_file():
            events = json.loads(probe_file.read_text())
            calls = events.pop("calls", None)
            record["since_start_s"] = {k: v - run["t0"] for k, v in sorted(events.items(), key=lambda kv: kv[1])}
            if calls and calls["generate"]:
                record["host"] = host_breakdown(events, calls)
        if run["exit"] != 0:
            record["stderr_tail"] = tail(self.work / f"{tag}.stderr")
        emit(record, self.out)
        return record

    def transformers(self, label: str, source: Path, batch: int, timeout: float | None = None,
                     lengths: Path | None = None) -> dict:
        """One bench/e2e_transformers.py job; `lengths`: a JSON file of each line's length (real lengths)."""
        a = self.args
        self.count += 1
        tag = f"tf{self.count}"
        output, timings = self.work / f"{tag}.out.txt", self.work / f"{tag}.timings.json"
        command = [a.transformers_python, str(ROOT / "bench" / "e2e_transformers.py"), "--model", str(self.model_dir),
                   "--src", a.src, "--tgt", a.tgt, "--device", a.device, "--batch-size", str(batch),
                   "--max-new-tokens", str(CAP if lengths else a.new_tokens), "--num-beams", str(a.beam_size),
                   "--timings", str(timings), *(["--lengths", str(lengths)] if lengths else []), str(source), str(output)]
        run = run_process(command, self.env(), timeout or a.timeout, self.work / f"{tag}.stdout", self.work / f"{tag}.stderr")
        record = {"what": "transformers_run", "label": label, "input": source.name, "batch": batch,
                  "wall_s": run["wall_s"], "exit": run["exit"], "command": shlex.join(command), "output": str(output)}
        if timings.is_file():
            t = json.loads(timings.read_text())
            record["since_start_s"] = {k: v - run["t0"] for k, v in t.pop("times").items()}
            record.update(t)
        if run["exit"] != 0:
            record["stderr_tail"] = tail(self.work / f"{tag}.stderr")
        emit(record, self.out)
        return record


def host_breakdown(events: dict, calls: dict) -> dict:
    """Where a job's time went, from the probe's [start, end] of each call: seconds inside the Translator's
    generate (the engine), on the main thread between the first generate and the last (outside generate: the
    GPU idles unless work is queued), writing chunks (main thread), tokenizing chunks (the reader thread, in
    parallel), and before the first and after the last generate."""
    generate = calls["generate"]
    inside = sum(end - start for start, end in generate)
    span = generate[-1][1] - generate[0][0]
    total = lambda name: sum(end - start for start, end in calls.get(name, []))  # noqa: E731
    chunks = calls.get("translate", [])
    return {"generate_calls": len(generate), "inside_generate_s": inside, "between_generates_s": span - inside,
            "write_s": total("write"),
            "commit_s": total("commit"),
            # the chunk loop's main thread: inside a chunk but outside generate (batching, detokenizing, joining),
            # and between chunks (writing, committing, waiting for the reader's next chunk)
            "chunk_host_s": total("translate") - inside if chunks else None,
            "between_chunks_s": sum(b[0] - a[1] for a, b in zip(chunks, chunks[1:])) if chunks else None,
            "chunks": len(chunks),
            "prepare_s": total("prepare"),
            # inside generate: the encoder's launches, the decoding loop, and in it the waits for the GPU's ids
            "encode_s": total("encode"), "search_s": total("search"), "fetch_s": total("fetch"),
            "start_s": total("start"), "select_s": total("select"),
            "load_end_to_first_generate_s": generate[0][0] - events["load_end"] if "load_end" in events else None,
            "last_generate_to_exit_s": events["exit"] - generate[-1][1] if "exit" in events else None}


def same_lines(a: str, b: str) -> dict:
    try:
        x = Path(a).read_text(encoding="utf-8").splitlines()
        y = Path(b).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        return {"error": str(error)}
    same = sum(p == q for p, q in zip(x, y))
    return {"lines": [len(x), len(y)], "same": same, "same_fraction": same / max(len(x), 1)}


def ok(record: dict) -> bool:
    return record.get("exit") == 0


# ------------------------------------------------------------------------------------------------ measurements


def check_tokenizers(runner: Runner, source: Path, lines: list[str], tokenizer) -> dict:
    """transformers' NllbTokenizer against nllbcli's on the first 200 lines and some language codes."""
    a = runner.args
    dump = runner.work / "tf_ids.json"
    command = [a.transformers_python, str(ROOT / "bench" / "e2e_transformers.py"), "--model", str(runner.model_dir),
               "--src", a.src, "--tgt", a.tgt, "--tokenize-only", "200", "--langs", ",".join(CHECK_LANGS),
               "--timings", str(dump), str(source), os.devnull]
    run = run_process(command, runner.env(), a.timeout, runner.work / "check.stdout", runner.work / "check.stderr")
    record = {"what": "check_tokenizers", "exit": run["exit"]}
    if run["exit"] != 0 or not dump.is_file():
        record["stderr_tail"] = tail(runner.work / "check.stderr")
        return record
    theirs = json.loads(dump.read_text())
    ours = [tokenizer.encode(line, a.src) for line in lines[: len(theirs["ids"])]]
    record["lines"] = len(ours)
    record["same_ids"] = sum(x == y for x, y in zip(ours, theirs["ids"]))
    record["first_difference"] = next(({"line": i, "nllbcli": x, "transformers": y}
                                       for i, (x, y) in enumerate(zip(ours, theirs["ids"])) if x != y), None)
    record["lang_ids"] = {code: [tokenizer.lang_id(code), theirs["lang_ids"][code]] for code in CHECK_LANGS}
    record["lang_ids_agree"] = all(x == y for x, y in record["lang_ids"].values())
    record["tokenizer_class"] = theirs.get("tokenizer_class")
    record["ok"] = record["same_ids"] == len(ours) and record["lang_ids_agree"]
    return record


def measure_a_b(runner: Runner, source: Path, measures: set[str]) -> None:
    a, out = runner.args, runner.out
    # the first run: an empty kernel cache (B), the warm cache's own directory when that is still empty (it
    # fills it for the warm runs), else a temporary one
    fresh = not any(runner.cache_dir.iterdir())
    cold_dir = runner.cache_dir if fresh else Path(tempfile.mkdtemp(prefix="cupy-cold-", dir=runner.work))
    try:
        cold = runner.nllb("cold", source, cache_dir=cold_dir)
    finally:
        if not fresh:
            shutil.rmtree(cold_dir, ignore_errors=True)
    if not ok(cold) and a.device != "cpu":
        runner.nllb("cache warm-up after a failed cold run", source)
    warm = [runner.nllb("warm", source) for _ in range(a.repeat)]
    result: dict = {}
    if "A" in measures:
        nllb_s = statistics.median(r["wall_s"] for r in warm) if all(map(ok, warm)) else None
        result_a = {"what": "A", "sentences": a.sentences, "nllb_wall_s": nllb_s, "nllb_runs_s": [r["wall_s"] for r in warm],
                    "goal": "nllbcli at least 3x faster than transformers, model load included"}
        if not a.skip_transformers:
            runner.transformers("warm-up (page cache)", runner.work / "warmup.txt", min(a.tf_batches))
            tf = {}
            for batch in a.tf_batches:
                runs = [runner.transformers("timed", source, batch) for _ in range(a.repeat)]
                if all(map(ok, runs)):
                    tf[batch] = (statistics.median(r["wall_s"] for r in runs), runs[0])
            if tf:
                best = min(tf, key=lambda b: tf[b][0])
                result_a.update({"transformers_wall_s": {str(b): s for b, (s, _) in tf.items()}, "transformers_best_batch": best,
                                 "transformers_best_s": tf[best][0]})
                if nllb_s:
                    result_a["ratio"] = tf[best][0] / nllb_s
                    result_a["met"] = result_a["ratio"] >= 3
                    result_a["outputs_same_as_transformers"] = same_lines(warm[0]["output"], tf[best][1]["output"])
                    result_a["generated_tokens"] = {"nllbcli": (warm[0]["summary"] or {}).get("tokens"),
                                                    "transformers": tf[best][1].get("generated_tokens")}
        emit(result_a, out)
    if "B" in measures:
        def points(r: dict) -> dict:
            s = r.get("since_start_s", {})
            return {"ok": ok(r), "wall_s": r["wall_s"], "first_batch_start_s": s.get("first_batch_start"),
                    "first_batch_end_s": s.get("first_batch_end"), "load_s": (s["load_end"] - s["load_start"]) if "load_end" in s else None}
        result = {"what": "B", "warm": points(warm[0]), "cold": points(cold),
                  "goal": "warm: first batch on the GPU within 5 s of the command's start; cold (empty CUPY_CACHE_DIR): within 60 s",
                  "note": "first_batch_start: the first Translator.generate call; first_batch_end: its return (that batch done)"}
        if result["warm"]["first_batch_start_s"] is not None:
            result["warm_met"] = result["warm"]["first_batch_start_s"] <= 5
            result["warm_met_first_batch_done"] = result["warm"]["first_batch_end_s"] <= 5
        if result["cold"]["first_batch_end_s"] is not None:
            result["cold_met"] = result["cold"]["first_batch_end_s"] <= 60
        emit(result, out)


def measure_c(runner: Runner, source: Path, lines: list[str]) -> None:
    """The CLI over every line, then the engine alone on the same ids (its own process: a GPU to itself)."""
    a, out = runner.args, runner.out
    warmup = runner.work / "warmup_c.txt"
    rows = 8192  # enough for every kernel of the job to be compiled and cached
    warmup.write_text("".join(line + "\n" for line in lines[:rows]), encoding="utf-8")
    runner.nllb("C warm-up (kernel cache, page cache)", warmup)
    job = runner.nllb("C whole job", source)
    config = {"model": str(runner.model_dir), "input": str(source), "device": a.device, "src": a.src, "tgt": a.tgt,
              "beam_size": a.beam_size, "max_length": a.new_tokens, "max_batch_tokens": a.max_batch_tokens,
              "chunk_rows": a.chunk_rows, "engine_batches": a.engine_batch, "result": str(runner.work / "engine.json")}
    engine_run = run_process([a.nllb_python, "-m", "bench.e2e", "__engine__", json.dumps(config)],
                             runner.env(), a.timeout, runner.work / "engine.stdout", runner.work / "engine.stderr")
    engine = json.loads(Path(config["result"]).read_text()) if Path(config["result"]).is_file() else {}
    emit({"what": "engine_run", "wall_s": engine_run["wall_s"], "exit": engine_run["exit"], **engine,
          **({"stderr_tail": tail(runner.work / "engine.stderr")} if engine_run["exit"] != 0 else {})}, out)
    result = {"what": "C", "sentences": len(lines), "goal": "the nllb job at least 90% of the engine's tokens/s",
              "note": "job_tokens_per_s: nllb's own summary (after the model load: reading, tokenizing, batching, "
                      "decoding, writing, committing); wall: the whole process, start-up and load included; tokens "
                      "are generated ids after the language token on both sides"}
    summary = job.get("summary") or {}
    same = engine.get("same_batches")
    if ok(job) and summary and same:
        result.update({"job_tokens": summary.get("tokens"), "job_seconds": summary.get("seconds"),
                       "job_tokens_per_s": summary.get("tokens_per_s"), "job_wall_s": job["wall_s"],
                       "engine_same_batches_tokens_per_s": same["tokens_per_s"], "engine_tokens": same["tokens"],
                       "batching": same["batching"]})
        result["ratio_job"] = summary["tokens"] / summary["seconds"] / same["tokens_per_s"]
        result["ratio_wall"] = summary["tokens"] / job["wall_s"] / same["tokens_per_s"]
        result["met"] = result["ratio_job"] >= 0.9
        if "host" in job:  # where the job's time beyond the engine's went
            result["job_host"] = job["host"]
            result["engine_same_batches_s"] = same["seconds"]
            parts = ("encode_s", "search_s", "fetch_s", "start_s", "select_s")
            result["engine_parts_s"] = {k: same[k] for k in parts if k in same}
        for batch, r in engine.get("fixed_batches", {}).items():
            result[f"ratio_job_vs_engine_batch_{batch}"] = summary["tokens"] / summary["seconds"] / r["tokens_per_s"]
    emit(result, out)


def measure_r(runner: Runner, source: Path, lines: list[str], tokenizer) -> None:
    """The job at forced and at real lengths, nllb and transformers (see R in the module's docstring)."""
    from bench.lengths import ends_of, held_out_ratios

    a, out = runner.args, runner.out
    ends = ends_of([tokenizer.encode(line, a.src) for line in lines], held_out_ratios())
    lengths_file = runner.work / "lengths.json"
    lengths_file.write_text(json.dumps(ends))
    tokens = {"forced": a.new_tokens * len(lines), "real": sum(ends)}
    runner.nllb("R warm-up (kernel cache, page cache)", runner.work / "warmup.txt", real_lengths=True)
    result: dict = {"what": "R", "sentences": len(lines), "tokens": tokens, "mean_length": {k: v / len(lines) for k, v in tokens.items()},
                    "note": "tokens/s: each sentence's generated tokens (the language token and the last one counted: "
                            "the same count on both sides) over the job's seconds after its model load (nllb: its "
                            "summary's; transformers: from the load to the last batch's end)"}
    speed: dict = {}
    for mode in ("forced", "real"):
        job = runner.nllb(f"R nllb, {mode} lengths", source, real_lengths=mode == "real")
        summary = job.get("summary") or {}
        if ok(job) and summary.get("seconds"):
            speed[("nllb", mode)] = tokens[mode] / summary["seconds"]
            # nllb's summary counts the tokens after the language token: each sentence's length less one
            result[f"nllb_{mode}_lengths_as_drawn"] = summary.get("tokens") == tokens[mode] - len(lines)
            result[f"nllb_{mode}_wall_s"] = job["wall_s"]
        if not a.skip_transformers:
            batch = a.tf_batches[0]
            tf = runner.transformers(f"R transformers, {mode} lengths", source, batch,
                                     lengths=lengths_file if mode == "real" else None)
            times = tf.get("since_start_s") or {}
            if ok(tf) and "generated" in times and "loaded" in times:
                speed[("transformers", mode)] = tokens[mode] / (times["generated"] - times["loaded"])
                # its count: the tokens after the language token, before </s> where there is one
                result[f"transformers_{mode}_lengths_as_drawn"] = tf.get("generated_tokens") == tokens[mode] - (2 if mode == "real" else 1) * len(lines)
                result[f"transformers_{mode}_wall_s"] = tf["wall_s"]
                result["transformers_batch"] = batch
    result["tokens_per_s"] = {f"{engine}_{mode}": v for (engine, mode), v in speed.items()}
    for engine in ("nllb", "transformers"):
        if (engine, "forced") in speed and (engine, "real") in speed:
            result[f"{engine}_real_over_forced"] = speed[(engine, "real")] / speed[(engine, "forced")]
    for mode in ("forced", "real"):
        if ("nllb", mode) in speed and ("transformers", mode) in speed:
            result[f"nllb_over_transformers_{mode}"] = speed[("nllb", mode)] / speed[("transformers", mode)]
    emit(result, out)


RAY_DATA_LOG = Path("/tmp/ray/session_latest/logs/ray-data/ray-data.log")  # the latest session's, on this machine
WAYS = {"plain": "--device", "devices": "--devices 0 (a worker process)", "ray": "--ray, a Ray the job starts",
        "cluster": "--ray, joining the Ray that `ray start --head` started before"}


def ray_blocks(since: tuple[str, int]) -> dict | None:
    """From what Ray Data logged since `since` (log_size's): the span from the first block an actor was given to
    the last write, and the blocks (the steady state of a --ray job, without Ray's start and the actor's)."""
    try:
        with open(RAY_DATA_LOG, "rb") as f:
            f.seek(since[1] if os.path.realpath(RAY_DATA_LOG) == since[0] else 0)  # a Ray started since: a new log
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    stamp = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*operator (MapBatches\(\w+\)|Write) with task index")
    times = {"MapBatches": [], "Write": []}
    for line in text.splitlines():
        match = stamp.match(line)
        if match:
            when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            times["Write" if match.group(2) == "Write" else "MapBatches"].append(when)
    if not times["MapBatches"] or not times["Write"]:
        return None
    return {"blocks": len(times["MapBatches"]), "first_block_to_last_write_s": max(times["Write"]) - min(times["MapBatches"])}


def log_size() -> tuple[str, int]:
    """Ray Data's log now: its file (a new Ray session writes another) and its size."""
    try:
        return os.path.realpath(RAY_DATA_LOG), RAY_DATA_LOG.stat().st_size
    except OSError:
        return "", 0


def measure_d(runner: Runner, jsonl: Path, lines: list[str]) -> None:
    """The same JSONL job in each of --ways (WAYS), each timed from outside with a warm kernel cache, a warm-up
    run of each kind first (Ray's bytecode compiled, its first-run costs paid, as a machine that ran Ray before);
    the outputs compared byte for byte (the Ray parts concatenated in name order)."""
    a, out, work = runner.args, runner.out, runner.work
    base = [a.nllb_python, "-m", "nllbcli.cli", "translate", "--src", a.src, "--tgt", a.tgt, "--model",
            str(runner.model_dir), "--beam-size", str(a.beam_size), "--max-length", str(a.new_tokens), "-q"]
    if a.max_batch_tokens:
        base += ["--max-batch-tokens", str(a.max_batch_tokens)]
    if a.chunk_rows:
        base += ["--chunk-rows", str(a.chunk_rows)]
    base += shlex.split(a.nllb_args)
    warmup = work / "warmup_d.jsonl"
    warmup.write_text("".join(json.dumps({"text": line}, ensure_ascii=False) + "\n" for line in lines[:8192]),
                      encoding="utf-8")
    options = {"plain": ["--device", a.device],
               "devices": ["--devices", "cpu:1" if a.device == "cpu" else a.device.partition(":")[2] or "0"],
               "ray": ["--ray"], "cluster": ["--ray"]}
    ways = [w for w in a.ways.split(",") if w]
    if set(ways) - set(WAYS):
        raise SystemExit(f"--ways takes {', '.join(WAYS)}")
    directory = {"ray", "cluster"}
    outputs = {way: work / (f"d_{way}" if way in directory else f"d_{way}.jsonl") for way in ways}
    ray_cli = [a.nllb_python, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]
    record = {"what": "D", "sentences": len(lines), "ways": {w: WAYS[w] for w in ways}, "runs": {}, "ray_blocks": {}}

    def warm_up(way: str) -> None:
        warm = work / f"d_warmup_{way}"
        run = run_process([*base, *options[way], str(warmup), str(warm if way in directory else f"{warm}.jsonl")],
                          runner.env(), a.timeout, work / f"{warm.name}.stdout", work / f"{warm.name}.stderr")
        record.setdefault("warmup_s", {})[way] = run["wall_s"]
        shutil.rmtree(warm, ignore_errors=True)

    def timed(way: str, round_: int) -> None:
        shutil.rmtree(outputs[way], ignore_errors=True) if way in directory else outputs[way].unlink(missing_ok=True)
        since = log_size()
        run = run_process([*base, *options[way], str(jsonl), str(outputs[way])], runner.env(), a.timeout,
                          work / f"d_{way}.stdout", work / f"d_{way}.stderr")
        record["runs"].setdefault(way, []).append(run["wall_s"])
        if way in directory:
            record["ray_blocks"].setdefault(way, []).append(ray_blocks(since))
        if run["exit"] != 0:
            record[f"{way}_stderr_tail"] = tail(work / f"d_{way}.stderr")
        emit({"what": "D_run", "way": way, "round": round_, "wall_s": run["wall_s"], "exit": run["exit"]}, out)

    # the ways without a running Ray first: --ray joins one that runs on the machine
    alone = [w for w in ways if w != "cluster"]
    for way in dict.fromkeys(["plain", *alone]):
        warm_up(way)
    for round_ in range(a.repeat):
        for way in alone:
            timed(way, round_)
    if "cluster" in ways:
        started = subprocess.run([*ray_cli, "start", "--head", "--include-dashboard=false", "--disable-usage-stats",
                                  f"--num-cpus={max(4, os.cpu_count() or 1)}"],
                                 env=runner.env(), capture_output=True, text=True)
        record["cluster_start_exit"] = started.returncode
        if started.returncode != 0:
            record["cluster_start_tail"] = (started.stdout + started.stderr)[-2000:]
        try:
            warm_up("cluster")
            for round_ in range(a.repeat):
                timed("cluster", round_)
        finally:
            subprocess.run([*ray_cli, "stop", "--force"], env=runner.env(), capture_output=True)
    plain = outputs["plain"].read_bytes() if "plain" in outputs and outputs["plain"].is_file() else None
    for way in ways:
        if way == "plain":
            continue
        if way in directory:
            parts = sorted(outputs[way].glob("part-*.jsonl")) if outputs[way].is_dir() else []
            record[f"{way}_identical"] = bool(parts) and b"".join(p.read_bytes() for p in parts) == plain
            record[f"{way}_parts"] = len(parts)
        else:
            record[f"{way}_identical"] = outputs[way].is_file() and outputs[way].read_bytes() == plain
    best = {way: min(walls) for way, walls in record["runs"].items()}
    record["best_wall_s"] = best
    if "plain" in best:
        record["wall_vs_plain"] = {way: best["plain"] / wall for way, wall in best.items()}
    emit(record, out)


def engine_only(config: dict) -> None:
    """Child process of C: the Translator's generate alone on the CLI's sentences, pre-tokenized."""
    from nllbcli.options import BatchOptions, DecodeOptions
    from nllbcli.job.chunks import plan_batches
    from nllbcli.job.rows import cut_source
    from nllbcli.model.split import split_text
    from nllbcli.model.translator import load_translator

    t = time.perf_counter()
    translator = load_translator(config["model"], config["device"])
    load_s = time.perf_counter() - t
    tokenizer, limit = translator.tokenizer, translator.config.max_position_embeddings
    for_device = getattr(BatchOptions, "for_device", None)  # the CLI's defaults per device, where they exist
    if for_device is not None:
        batching = for_device(translator.device, config["max_batch_tokens"], config["chunk_rows"])
    else:
        batching = BatchOptions(config["max_batch_tokens"] or BatchOptions.max_batch_tokens,
                                config["chunk_rows"] or BatchOptions.read_chunk_rows)
    options = DecodeOptions(beam_size=config["beam_size"], max_length=config["max_length"])
    tgt = config["tgt"]
    with open(config["input"], encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    # as the pipeline: chunks of rows (the first smaller, where the pipeline makes it so), each row's sentences,
    # batches planned longest first within a chunk
    from nllbcli.job.reader import first_chunk_rows

    first_rows = first_chunk_rows(translator, batching)
    starts = [0] + list(range(first_rows or batching.read_chunk_rows, len(lines), batching.read_chunk_rows))
    batches: list[list[list[int]]] = []
    every: list[list[int]] = []
    for first, end in zip(starts, starts[1:] + [len(lines)]):
        ids = [cut_source(tokenizer.encode(s, config["src"]), limit)
               for line in lines[first:end] for s in split_text(line)[0]]
        every += ids
        batches += [[ids[i] for i in batch] for batch in plan_batches({i: len(s) for i, s in enumerate(ids)}, batching.max_batch_tokens)]

    calls: dict[str, list] = {}
    if translator.device.startswith("cuda"):
        instrument(calls)

    def timed(plan: list[list[list[int]]]) -> dict:
        translator.generate(plan[0], tgt, options)  # warm-up: every module this batch size needs, loaded
        calls.clear()
        t0 = time.perf_counter()
        tokens = sum(len(o) for batch in plan for o in translator.generate(batch, tgt, options))
        seconds = time.perf_counter() - t0
        parts = {f"{name}_s": sum(end - start for start, end in spans) for name, spans in calls.items()}
        return {"batches": len(plan), "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, **parts}

    result = {"device": translator.device, "load_s": load_s, "sentences": len(every),
              "same_batches": {**timed(batches), "batching": {"max_batch_tokens": batching.max_batch_tokens,
                                                              "chunk_rows": batching.read_chunk_rows}}}
    ordered = sorted(every, key=len)  # as the harness: sorted by length, fixed batches
    result["fixed_batches"] = {str(b): timed([ordered[i : i + b] for i in range(0, len(ordered), b)])
                               for b in config["engine_batches"]}
    Path(config["result"]).write_text(json.dumps(result) + "\n")


# ------------------------------------------------------------------------------------------------------- main


def gpu_facts() -> dict:
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        return {"gpu": text} if text else {}
    except (OSError, subprocess.SubprocessError):
        return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", default="A,B", help="which of A, B, C, D, R, comma-separated (default A,B)")
    parser.add_argument("--shape", choices=list(SHAPES), default=DEFAULT, help=f"model shape (nllbcli/model/shapes.py or tiny; default {DEFAULT})")
    parser.add_argument("--model-dir", type=Path, help="model directory: reused when it holds this script's model of the same shape and seed, "
                                                        "else built there and kept (default: built in the work directory, removed)")
    parser.add_argument("--cache-dir", type=Path, help="CUPY_CACHE_DIR of the warm runs, kept (default: in the work directory, removed)")
    parser.add_argument("--work-dir", type=Path, help="inputs, outputs and logs; kept when given (default: a temporary directory, removed)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the reference engine; transformers in float32)")
    parser.add_argument("--src", default="eng_Latn")
    parser.add_argument("--tgt", default="fra_Latn")
    parser.add_argument("--new-tokens", type=int, default=40, help="generated tokens per sentence, the language token included "
                                                                   "(nllb --max-length, transformers' max_new_tokens)")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--max-batch-tokens", type=int, help="passed to nllb (default: nllb's own default for the device)")
    parser.add_argument("--chunk-rows", type=int, help="passed to nllb (default: nllb's own default for the device)")
    parser.add_argument("--nllb-args", default="", help="more options for every nllb translate run, one string")
    parser.add_argument("--tf-batch", default="256", help="transformers batch sizes, comma-separated; A takes the fastest")
    parser.add_argument("--engine-batch", default="4096", help="C: fixed batch sizes for the engine alone (as the harness), comma-separated")
    parser.add_argument("--ways", default="plain,devices,ray", help=f"D: which ways, comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--repeat", type=int, default=1, help="A: timed runs of each side (the median counts); D: rounds of the three ways")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for each process")
    parser.add_argument("--nllb-python", default=sys.executable, help="interpreter with nllbcli's dependencies (and CuPy)")
    parser.add_argument("--transformers-python", default=sys.executable, help="interpreter with torch and transformers")
    parser.add_argument("--skip-transformers", action="store_true", help="no transformers runs (A then gives nllb's time alone)")
    parser.add_argument("--no-check", action="store_true", help="skip the tokenizer check against transformers")
    parser.add_argument("--nllb-stdin", action="store_true", help="nllb reads its input from stdin: read and tokenized on "
                        "its main thread, between batches, not on a reader thread beside the GPU's (C: what the thread costs)")
    parser.add_argument("--plain", action="store_true", help="run `python -m nllbcli.cli` without start-up timestamps")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    measures = {m.strip().upper() for m in args.measure.split(",") if m.strip()}
    if not measures <= {"A", "B", "C", "D", "R"}:
        parser.error("--measure takes A, B, C, D and R")
    args.tf_batches = [int(b) for b in args.tf_batch.split(",") if b]
    args.engine_batch = [int(b) for b in args.engine_batch.split(",") if b]
    if not args.skip_transformers and (measures & {"A", "R"} or not args.no_check):
        probe_torch = subprocess.run([args.transformers_python, "-c", "import torch, transformers"], capture_output=True)
        if probe_torch.returncode != 0:
            print(f"{args.transformers_python} cannot import torch and transformers: skipping the transformers side",
                  file=sys.stderr)
            args.skip_transformers = True

    out = open(args.out, "a", encoding="utf-8") if args.out else None
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="nllb-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        model_dir, built, cache_dir, tokenizer = model_and_cache(args, work)
        t = time.perf_counter()
        lines = make_sentences(args.sentences, args.seed, tokenizer, args.src)
        source, jsonl_source = write_input(work, lines)
        (work / "warmup.txt").write_text("".join(line + "\n" for line in lines[:64]), encoding="utf-8")
        config = SHAPES[args.shape]
        emit({"what": "setup", "shape": args.shape, "parameters": parameter_count(config), "device": args.device, **built,
              "weights_bytes": (model_dir / "model.safetensors").stat().st_size, "work_dir": str(work),
              "cache_dir": str(cache_dir), "cache_files_before": sum(1 for _ in cache_dir.rglob("*") if _.is_file()),
              "input": input_stats(lines, tokenizer, args.src), "input_s": time.perf_counter() - t,
              "new_tokens": args.new_tokens, "beam_size": args.beam_size, "python": sys.version.split()[0],
              **gpu_facts()}, out)
        runner = Runner(args, model_dir, work, cache_dir, out)
        if not args.no_check and not args.skip_transformers:
            emit(check_tokenizers(runner, source, lines, tokenizer), out)
        if measures & {"A", "B"}:
            measure_a_b(runner, source, measures)
        if "C" in measures:
            measure_c(runner, source, lines)
        if "D" in measures:
            measure_d(runner, jsonl_source, lines)
        if "R" in measures:
            measure_r(runner, source, lines, tokenizer)
    finally:
        if out is not None:
            out.close()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        elif args.model_dir is None:
            shutil.rmtree(work / "model", ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["__engine__"]:
        engine_only(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
