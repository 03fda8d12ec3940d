"""One `nllb translate` job on 1, 2, 4 and 8 GPUs of one host, through --devices and --ray (issue 29), and the
plain command (no --devices: the job's own process drives one GPU) beside them.

    python3 -m bench.scale_out --shape nllb-200-distilled-600M --sentences 400000 --gpus 1,2,4,8 \
        --ways devices,ray --kill --out $OUT/scale.jsonl
    python3 -m bench.scale_out --sentences 400000 --gpus 1 --ways plain,devices   # --devices 0 against plain
    python3 -m bench.scale_out --model data/samples/model --sentences 200000 --out $OUT/scale_sample.jsonl

The model is a directory of random weights of a published shape (as bench.e2e builds it: every sentence
generates exactly --new-tokens tokens), or --model (the sample model: it ends its sentences itself). The input:
--sentences JSONL lines of held-out English clauses, 10 to 60 source ids each (bench.e2e's).

Each way and GPU count is one job, timed from outside with a warm kernel cache (a short job of each way first):

- the wall time, and the job's own summary (rows, tokens);
- the steady rate: for --devices, the rows committed between the job's first commit and its last, from its
  resume state read every 0.1 s (model loads, the first chunk and the renames at the end left out); for --ray,
  the rows over the span from the first block an actor was given to the last write, from Ray Data's log;
- the main process's CPU seconds (user + system, /proc) over the steady span: near 1 a second, the main
  process (reading, tokenizing, committing in order) bounds the job, not the GPUs;
- whether its output is byte for byte the first job's (the plain one where --ways has plain, else the one-GPU
  --devices job; Ray's parts joined in name order), and each job's steady rate against the plain job's.

--kill, on the largest count with --devices: one worker killed (kill -9) after the first commit, the job left
to finish on the others; then the whole job (its process group) killed after its third commit and continued
with --resume; each output compared with the one-GPU job's. With --ray too: the whole --ray job killed, then
--resume.

On the CPU, to check the script: --device cpu runs cpu:N workers (--ray: N CPU actors), e.g.
`python -m bench.scale_out --device cpu --shape tiny --sentences 3000 --chunk-rows 100 --gpus 1,2 --kill`.

Results are JSON lines on stdout (and --out FILE): setup, one per job, then the scaling table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import (SHAPES, emit, gpu_facts, input_stats, log_size, make_sentences, model_and_cache,
                       ray_blocks, summary_of, tail, write_input)

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.1


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a running process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes_where(field: int, value: int) -> list[int]:
    """The processes whose /proc stat field `field` (counted after the command's name: 1 the parent, 2 the
    process group) is `value`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[field]) == value:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def workers_of(pid: int) -> list[int]:
    """The --devices job's worker processes (multiprocessing's spawned children, not its resource tracker)."""
    found = []
    for child in processes_where(1, pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command or b"forkserver" in command:
            found.append(child)
    return found


def staged_parts(output: Path) -> int:
    """The parts a --ray job has written so far (into its staging directory beside OUTPUT)."""
    data = output.parent / f".{output.name}.nllb-staging" / "data"
    return sum(1 for path in data.glob("*") if re.search(r"-\d{5}-\d{12}\.(jsonl|parquet)$", path.name))


def committed_rows(state: Path) -> int | None:
    try:
        saved = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    return saved.get("position", {}).get("rows")


class Job:
    """One nllb process, watched: its commits (rows against time) and its main process's CPU time."""

    def __init__(self, command: list[str], env: dict, work: Path, tag: str, state: Path | None):
        self.work, self.tag, self.state = work, tag, state
        self.stderr_path = work / f"{tag}.stderr"
        self.commits: list[tuple[float, int]] = []
        self.cpu: list[tuple[float, float]] = []
        with open(work / f"{tag}.stdout", "wb") as out, open(self.stderr_path, "wb") as err:
            self.t0 = time.time()
            self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=err,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def poll(self) -> bool:
        """Record a sample; whether the process still runs."""
        now = time.time()
        if self.state is not None:
            rows = committed_rows(self.state)
            if rows is not None and (not self.commits or rows != self.commits[-1][1]):
                self.commits.append((now, rows))
        used = cpu_seconds(self.process.pid)
        if used is not None:
            self.cpu.append((now, used))
        return self.process.poll() is None

    def wait(self, timeout: float, until=None) -> int | str:
        """Poll until the process ends (its exit code), `until(self)` holds (None), or `timeout` (killed)."""
        deadline = time.time() + timeout
        while self.poll():
            if until is not None and until(self):
                return None
            if time.time() > deadline:
                self.kill()
                return "timeout"
            time.sleep(POLL_S)
        self.t1 = time.time()
        return self.process.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.t1 = time.time()

    def record(self, code) -> dict:
        record = {"wall_s": self.t1 - self.t0, "exit": code, "summary": summary_of(self.stderr_path)}
        if len(self.commits) >= 3:  # the first and the last commit bound the steady span
            (ta, ra), (tb, rb) = self.commits[0], self.commits[-1]
            if tb > ta:
                record["steady"] = {"rows": rb - ra, "seconds": tb - ta, "rows_per_s": (rb - ra) / (tb - ta),
                                    "commits": len(self.commits)}
                inside = [(t, c) for t, c in self.cpu if ta <= t <= tb]
                if len(inside) >= 2:
                    record["steady"]["main_cpu_per_s"] = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        if self.cpu:
            record["main_cpu_s"] = self.cpu[-1][1]
        if code != 0:
            record["stderr_tail"] = tail(self.stderr_path)
        return record


def output_bytes(path: Path) -> bytes | None:
    if path.is_dir():
        parts = sorted(path.glob("part-*.jsonl"))
        return b"".join(p.read_bytes() for p in parts) if parts else None
    return path.read_bytes() if path.is_file() else None


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        for name in (path, path.parent / f".{path.name}.nllb-state.json"):
            name.unlink(missing_ok=True)


def visible_gpus() -> int:
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(count, len([v for v in visible.split(",") if v.strip()])) if visible is not None else count


class Bench:
    def __init__(self, args, model_dir: Path, work: Path, cache_dir: Path, out):
        self.args, self.model_dir, self.work, self.cache_dir, self.out = args, model_dir, work, cache_dir, out
        self.count = 0

    def command(self, way: str, n: int, source: Path, output: Path, *extra: str) -> tuple[list[str], dict]:
        a = self.args
        env = dict(os.environ, CUPY_CACHE_DIR=str(self.cache_dir),
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        base = [a.nllb_python, "-m", "nllbcli.cli", "translate", "--src", a.src, "--tgt", a.tgt, "--model",
                str(self.model_dir), "--beam-size", str(a.beam_size), "--max-length", str(a.new_tokens),
                "--on-error", "skip", *(["--chunk-rows", str(a.chunk_rows)] if a.chunk_rows else []), *extra]
        gpus = ",".join(str(i) for i in range(n))
        if way == "plain":  # one GPU (or the CPU), driven by the job's own process
            base += ["--progress", "json", "--device", "cpu" if a.device == "cpu" else "cuda:0"]
        elif way == "devices":
            base += ["--progress", "json", "--devices", f"cpu:{n}" if a.device == "cpu" else gpus]
        else:  # a local Ray the job starts, on the first n GPUs
            base += ["--progress", "none", "--ray", "--ray-actors", str(n)]
            if a.device == "cpu":
                base += ["--device", "cpu"]
            else:
                env["CUDA_VISIBLE_DEVICES"] = gpus
        return [*base, str(source), str(output)], env

    def start(self, way: str, n: int, source: Path, output: Path, *extra: str) -> Job:
        self.count += 1
        command, env = self.command(way, n, source, output, *extra)
        state = output.parent / f".{output.name}.nllb-state.json" if way != "ray" else None
        return Job(command, env, self.work, f"job{self.count}", state)

    def run(self, way: str, n: int, source: Path, output: Path, label: str, *extra: str) -> dict:
        if "--resume" not in extra:
            remove(output)
        since = log_size()
        job = self.start(way, n, source, output, *extra)
        record = {"what": "job", "label": label, "way": way, "gpus": n, **job.record(job.wait(self.args.timeout))}
        if way == "ray":
            record["ray_blocks"] = ray_blocks(since)
        emit(record, self.out)
        return record


def rate(record: dict, sentences: int) -> float | None:
    """Rows a second in the steady span: the commits' for plain and --devices, the blocks' span for --ray."""
    if "steady" in record:
        return record["steady"]["rows_per_s"]
    blocks = record.get("ray_blocks")
    if blocks and blocks.get("first_block_to_last_write_s"):
        return sentences / blocks["first_block_to_last_write_s"]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="nllb-200-distilled-600M", help="random weights of this shape")
    parser.add_argument("--model", type=Path, help="an existing model directory instead (the sample model: data/samples/model)")
    parser.add_argument("--model-dir", type=Path, help="where the random-weights model is built or reused (default: in the work directory)")
    parser.add_argument("--cache-dir", type=Path, help="CUPY_CACHE_DIR, kept (default: in the work directory)")
    parser.add_argument("--work-dir", type=Path, help="inputs, outputs and logs; kept when given")
    parser.add_argument("--sentences", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma-separated (those above this machine's are left out)")
    parser.add_argument("--ways", default="devices,ray", help="plain, devices and ray, comma-separated")
    parser.add_argument("--kill", action="store_true", help="the kill -9 runs (see above)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script with CPU workers")
    parser.add_argument("--src", default="eng_Latn")
    parser.add_argument("--tgt", default="fra_Latn")
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--chunk-rows", type=int, help="passed to nllb (default: nllb's own for the device)")
    parser.add_argument("--timeout", type=float, default=590, help="seconds for each job")
    parser.add_argument("--nllb-python", default=sys.executable)
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    a = parser.parse_args()
    ways = [w for w in a.ways.split(",") if w]
    if set(ways) - {"plain", "devices", "ray"}:
        parser.error("--ways takes plain, devices and ray")
    ways.sort(key=["plain", "devices", "ray"].index)  # plain first: the reference the others are compared with
    available = visible_gpus() if a.device != "cpu" else os.cpu_count() or 1
    counts = [n for n in (int(c) for c in a.gpus.split(",") if c) if n <= available]
    if not counts:
        parser.error(f"none of --gpus {a.gpus} fits this machine's {available}")
    out = open(a.out, "a", encoding="utf-8") if a.out else None
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="nllb-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        model_dir, built, cache_dir, tokenizer = model_and_cache(a, work, a.model)
        lines = make_sentences(a.sentences, a.seed, tokenizer, a.src)
        _, source = write_input(work, lines)
        warm = work / "warm.jsonl"
        warm.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines[:2048]), encoding="utf-8")
        emit({"what": "setup", "shape": None if a.model else a.shape, **built, "gpus_visible": available,
              "counts": counts, "ways": ways, "input": input_stats(lines[:20000], tokenizer, a.src),
              "sentences": len(lines), "new_tokens": a.new_tokens, "beam_size": a.beam_size, **gpu_facts()}, out)
        bench = Bench(a, model_dir, work, cache_dir, out)
        for way in ways:  # kernels compiled into the cache, Ray's first-run costs paid
            bench.run(way, 1 if way == "plain" else counts[-1], warm,
                      work / f"warm_{way}" if way == "ray" else work / "warm.out.jsonl", "warm-up")
        results, reference = {}, None
        for way in ways:
            for n in [1] if way == "plain" else counts:
                output = work / (f"out_{way}_{n}" if way == "ray" else f"out_{way}_{n}.jsonl")
                record = bench.run(way, n, source, output, "scaling")
                produced = output_bytes(output)
                if reference is None:  # the first job: the plain one, else the one-GPU --devices one
                    reference = produced
                record["identical_to_first"] = produced is not None and produced == reference
                results[(way, n)] = {"wall_s": record["wall_s"], "rows_per_s": rate(record, len(lines)),
                                     "main_cpu_per_s": record.get("steady", {}).get("main_cpu_per_s"),
                                     "identical": record["identical_to_first"], "exit": record["exit"]}
                if produced is not reference:
                    remove(output)
        table = {"what": "scaling", "rows": []}
        plain = results.get(("plain", 1), {}).get("rows_per_s")
        for (way, n), r in results.items():
            one = results.get((way, counts[0]), {}).get("rows_per_s")
            table["rows"].append({"way": way, "gpus": n, **r,
                                  "speedup": r["rows_per_s"] / one if r["rows_per_s"] and one else None,
                                  "against_plain": r["rows_per_s"] / plain if r["rows_per_s"] and plain else None})
        emit(table, out)
        if a.kill:
            kill_runs(bench, ways, counts[-1], source, reference, work)
    finally:
        if out is not None:
            out.close()
        if a.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def kill_runs(bench: Bench, ways: list[str], n: int, source: Path, reference: bytes | None, work: Path) -> None:
    """kill -9 of one worker, then of the whole job and --resume; each output against the first job's."""
    out, timeout = bench.out, bench.args.timeout
    if "devices" in ways and n > 1:
        output = work / "killed_worker.jsonl"
        remove(output)
        job = bench.start("devices", n, source, output)
        job.wait(timeout, until=lambda j: len(j.commits) >= 1 and len(workers_of(j.process.pid)) == n)
        victims = workers_of(job.process.pid)
        if victims:
            os.kill(victims[0], signal.SIGKILL)
        code = job.wait(timeout)
        emit({"what": "kill_one_worker", "gpus": n, "killed": victims[:1], **job.record(code),
              "identical": output_bytes(output) == reference}, out)
    for way in ways:
        output = work / ("killed_job" if way == "ray" else "killed_job.jsonl")
        remove(output)
        since = log_size()
        count = 1 if way == "plain" else n
        job = bench.start(way, count, source, output)
        if way != "ray":
            job.wait(timeout, until=lambda j: len(j.commits) >= 3)
        else:
            job.wait(timeout, until=lambda j: staged_parts(output) >= 3)
        job.kill()
        time.sleep(2)
        left = processes_where(2, job.process.pid)  # what a kill -9 of the job's group left running
        resumed = bench.run(way, count, source, output, "resume after kill -9", "--resume")
        emit({"what": "kill_job_then_resume", "way": way, "gpus": count, "killed_after_s": job.t1 - job.t0,
              "commits_before_kill": len(job.commits), "left_running": len(left), "resume_exit": resumed["exit"],
              "identical": output_bytes(output) == reference, "ray_blocks": ray_blocks(since) if way == "ray" else None},
             out)


if __name__ == "__main__":
    sys.exit(main())
