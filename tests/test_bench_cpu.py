"""bench.cpu's nllb side on a few sample sentences (the transformers and CTranslate2 sides need another
interpreter, which the tests do not have)."""

import json
import sys

from bench import cpu


def test_the_sentences_go_round_the_five_directions():
    parts = cpu.directions(7)
    assert [(p["src"], p["tgt"], len(p["texts"])) for p in parts] == [
        ("eng_Latn", "fra_Latn", 2), ("fra_Latn", "deu_Latn", 2), ("deu_Latn", "spa_Latn", 1),
        ("spa_Latn", "ita_Latn", 1), ("ita_Latn", "eng_Latn", 1)]
    heldout = (cpu.HELDOUT / "fra_Latn.txt").read_text(encoding="utf-8").splitlines()
    assert parts[1]["texts"] == heldout[:2]


def test_the_nllb_side_alone(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cpu.jsonl"
    monkeypatch.setattr(sys, "argv", ["bench.cpu", "--engines", "nllb", "--models", "sample", "--sentences", "5",
                                      "--beams", "1", "--repeats", "1", "--threads", "2", "--out", str(out)])
    cpu.main()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["what"] for r in records] == ["setup", "engine"]
    engine = records[1]
    assert (engine["engine"], engine["beam_size"], engine["sentences"], engine["max_length"]) == ("nllb", 1, 5, 200)
    assert len(engine["cpu_s_1_thread"]) == len(engine["wall_s"]) == 1 and engine["cpu_s_1_thread"][0] > 0
    assert engine["same_as_nllb"] == 5 and engine["same_as_transformers"] is None
    assert capsys.readouterr().out.splitlines()[1] == json.dumps(engine)


def test_the_profile_tells_the_engine_s_parts_apart():
    found = cpu.profile_nllb(str(cpu.SAMPLE), cpu.directions(5), 4, 200)
    parts = found["parts_s"]
    assert parts["decoder products"] > parts["output projection"] > 0
    assert parts["encoder products"] > 0 and parts["beams' cache copies (gather_rows)"] > 0
    assert parts["log-softmax, top-k, argmax"] > 0
    assert abs(sum(parts.values()) - found["profiled_s"]) < 0.01


def test_the_products_benchmark_times_each_product_and_counts_whose_bits_hold(monkeypatch, capsys):
    from bench import cpu_products

    monkeypatch.setattr(sys, "argv", ["bench.cpu_products", "--rows", "12", "--repeats", "1", "--trials", "2"])
    assert cpu_products.main() == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["K"], r["N"]) for r in records] == cpu_products.SHAPES
    for r in records:
        assert r["mlas_keeps_bits"] == r["int8_keeps_bits"] == r["rows_keeps_bits"] == "2/2"
        assert r["mlas_ms"] > 0 and r["int8_ms"] > 0 and 0 < r["int8_error"] < 0.05
