"""bench/lengths.py: the real-length benchmarks' lengths, and nllbcli's search ending each sentence at its own
(the transformers side, ForcedEnd, needs torch, which the tests do not have)."""

import dataclasses

import numpy as np
import pytest

from bench import harness, lengths
from nllbcli.model import search
from nllbcli.model.translator import load_translator
from nllbcli.options import DecodeOptions


def test_the_ratios_are_the_held_out_sentences_in_every_direction():
    ratios = np.array(lengths.held_out_ratios())
    assert len(ratios) == 20 * 100
    assert 0.5 < ratios.min() < 0.8 and 1.3 < ratios.max() < 2.0 and 0.95 <= np.median(ratios) <= 1.05
    assert len(set(ratios.round(6))) > 50  # a spread, not one ratio


def test_a_sentence_s_length_depends_on_its_ids_alone():
    ratios = lengths.held_out_ratios()
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 1000, n).tolist() for n in rng.integers(10, 61, 500)]
    drawn = lengths.lengths_of(sources, ratios)
    assert drawn == [lengths.length_of(list(s), ratios) for s in sources]  # any batch, any order
    assert all(2 <= n <= lengths.CAP for n in drawn)
    assert lengths.lengths_of(sources, ratios, cap=30) == [min(n, 30) for n in drawn]
    long = [list(range(4, 4 + n)) for n in (60, 71, 90, 150)]  # within GUARD's limit up to 71 source tokens
    assert lengths.ends_of(long, ratios)[:2] == lengths.lengths_of(long, ratios)[:2]
    assert lengths.ends_of(long, ratios) == [min(n, int(1.5 * len(s) + 10), 200)
                                             for n, s in zip(lengths.lengths_of(long, ratios), long)]
    per_token = np.array(drawn) / np.array([len(s) for s in sources])
    assert per_token.std() > 0.1  # sources of one length end at different steps


@pytest.mark.parametrize("beams", [1, 4])
def test_installed_lengths_end_each_sentence_there_and_go_when_uninstalled(beams):
    tr = load_translator(str(lengths.ROOT / "tests" / "models" / "tiny-a"), "cpu")
    config = dataclasses.replace(tr.config, eos_token_id=tr.config.vocab_size - 1)  # </s> out of reach, as the harness
    rng = np.random.default_rng(1)
    sources = [[4] + rng.integers(5, 90, n - 2).tolist() + [2] for n in rng.integers(4, 20, 12)]
    options = DecodeOptions(beam_size=beams, max_length=25, max_length_a=1.1, max_length_b=1)
    ratios = [0.6, 0.9, 1.0, 1.2, 1.6]
    lang = tr.tokenizer.lang_id("fra_Latn")
    limits = options.length_limits(sources)
    lengths.install(ratios)
    try:
        ends = [len(h[0].ids) + 1 for h in search.generate(tr.engine, sources, lang, config, options)]
        assert options.length_limits(sources) == limits  # outside a search: the pool's plan as ever
    finally:
        lengths.uninstall()
    drawn = lengths.lengths_of(sources, ratios, cap=25)
    assert ends == [min(d, limit) for d, limit in zip(drawn, limits)]
    assert any(d > limit for d, limit in zip(drawn, limits)) and any(d < limit for d, limit in zip(drawn, limits))
    assert len(set(ends)) > 3
    assert search.generate.__name__ == "generate" and options.length_limits(sources) == limits


def test_the_table_gives_each_engine_s_real_against_forced_lengths():
    runs = [{"engine": e, "batch": 8, "beams": 1, "variant": "", "lengths": m, "tokens_per_s": v, "peak_gib": 1.0}
            for e, m, v in (("nllbcli", "forced", 400.0), ("nllbcli", "real", 300.0),
                            ("transformers", "forced", 100.0), ("transformers", "real", 50.0))]
    runs.append({"engine": "nllbcli", "batch": 16, "beams": 1, "variant": "", "lengths": "real", "error": "out of memory"})
    text = harness.table(runs)
    assert "| nllbcli | 16 | 1 |  | real | out of memory | |" in text
    assert "beam 1, forced lengths: best nllbcli / best transformers = 4.00" in text
    assert "beam 1, real lengths: best nllbcli / best transformers = 6.00" in text
    assert "nllbcli 8x1: real / forced lengths = 0.750" in text
    assert "transformers 8x1: real / forced lengths = 0.500" in text


def test_the_whole_job_ends_each_sentence_at_its_length(tmp_path, monkeypatch):
    """bench.e2e's R on the CPU, nllb's side: the job's process (the probe) ends every sentence where drawn."""
    import json
    import sys

    from bench import e2e

    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(sys, "argv", ["bench.e2e", "--device", "cpu", "--shape", "tiny", "--sentences", "40",
                                      "--measure", "R", "--skip-transformers", "--no-check", "--timeout", "120",
                                      "--work-dir", str(tmp_path / "work"), "--out", str(out)])
    assert e2e.main() == 0
    r = [json.loads(line) for line in out.read_text().splitlines() if '"what": "R"' in line][0]
    assert r["nllb_forced_lengths_as_drawn"] and r["nllb_real_lengths_as_drawn"]
    assert r["tokens"]["forced"] == 40 * 40 and r["tokens"]["real"] != r["tokens"]["forced"]
    assert set(r["tokens_per_s"]) == {"nllb_forced", "nllb_real"} and r["nllb_real_over_forced"] > 0
