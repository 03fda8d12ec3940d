"""--src auto: each row's language detected (model.langid), per sentence where a row's differ, mapped to the loaded
model's codes; a row whose language cannot be detected, or that the model lacks, fails alone naming the guess."""

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

import nllbcli
from nllbcli.cli import cli
from nllbcli.model import langid
from nllbcli.model.langid import detect, detect_languages
from nllbcli.model.langs import FLORES_200_CODES
from nllbcli.model.translator import load_tokenizer
from nllbcli.options import DecodeOptions

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
HELDOUT = ROOT / "data" / "samples" / "heldout"
LANGS = ["eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "ita_Latn"]
LATIN = "Gallia est omnis divisa in partes tres, quarum unam incolunt Belgae."  # Latin: no NLLB language


def heldout(lang, line):
    return (HELDOUT / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[line]


@pytest.fixture(scope="module")
def translator():
    return nllbcli.load(str(SAMPLE), "cpu")


def translate(args, given=""):
    return CliRunner().invoke(cli, ["translate", "-q", "-m", str(SAMPLE), "--device", "cpu", "--beam-size", "1",
                                    *args], input=given)


def test_detections_map_to_the_models_codes_with_the_script_the_text_is_written_in():
    texts = ["The wedding is on the nineteenth of January.", "這是一個測試，我們會說中文。", "这是一个测试，我们会说中文。",
             "Ово је реченица коју пишем данас на српском језику.",
             "Ovo je rečenica, koju pišem danas na hrvatskom jeziku, a sutra ću pisati drugu."]
    assert [code for code, _ in detect(texts, FLORES_200_CODES)] == [
        "eng_Latn", "zho_Hant", "zho_Hans", "srp_Cyrl", "hrv_Latn"]
    m2m = tuple(load_tokenizer(str(ROOT / "tests" / "models" / "tiny-m2m")).lang_codes)
    assert [code for code, _ in detect(texts, m2m)] == ["en", "zh", "zh", "sr", "hr"]
    assert [code for code, _ in detect(texts[:2], tuple(LANGS))] == ["eng_Latn", None]


def test_an_undetectable_text_or_a_language_the_model_lacks_has_no_code_and_a_reason_naming_the_guess():
    latin, numbers = detect_languages([LATIN, "12 345"], FLORES_200_CODES)
    (english,) = detect_languages(["The wedding is on Saturday."], FLORES_200_CODES, 0.999)
    assert (latin.code, latin.guess) == (None, "la")
    assert latin.reason == f"the detected language is Latin (la, confidence {latin.confidence:.2f}), which the model does not know"
    assert numbers == langid.Detection(None, 0.0, "", "the language cannot be detected: the text has no letters")
    assert english.code is None and english.reason == ("the language cannot be detected: the detector's best guess "
                                                       f"is English (en, confidence {english.confidence:.2f}), below 0.999")


def test_src_auto_translates_each_rows_language_and_each_sentence_of_a_mixed_row_in_its_own(tmp_path):
    rows = [heldout(lang, 1) for lang in ("eng_Latn", "fra_Latn", "spa_Latn", "ita_Latn")]
    rows.append(f"{heldout('fra_Latn', 1)} {heldout('spa_Latn', 2)}")  # French, then Spanish
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in rows))
    result = translate(["--src", "auto", "--tgt", "deu_Latn", "--detected-field", "detected", str(source)])
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["translation"] for row in written] == [heldout("deu_Latn", 1)] * 4 + [
        f"{heldout('deu_Latn', 1)} {heldout('deu_Latn', 2)}"]
    assert [row["detected"]["lang"] for row in written] == [
        "eng_Latn", "fra_Latn", "spa_Latn", "ita_Latn", "fra_Latn,spa_Latn"]
    assert all(0.3 <= row["detected"]["confidence"] <= 1 for row in written)


def test_a_row_that_cannot_be_detected_fails_alone_naming_the_detectors_guess(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text(f"{heldout('eng_Latn', 1)}\n{LATIN}\n12 345\n")
    (confidence,) = [c for _, c in detect([LATIN], FLORES_200_CODES)]
    result = translate(["--src", "auto", "--tgt", "fra_Latn", "--on-error", "skip", str(source)])
    assert result.exit_code == 3
    assert result.stdout == f"{heldout('fra_Latn', 1)}\n\n\n"
    assert result.stderr == (
        f"Skipped: {source}:2: the detected language is Latin (la, confidence {confidence:.2f}), which the model "
        f"does not know.\nSkipped: {source}:3: the language cannot be detected: the text has no letters.\n")
    failed = translate(["--src", "auto", "--tgt", "fra_Latn", str(source)])
    assert failed.exit_code == 1
    assert failed.stderr.endswith(f"Error: {source}:2: the detected language is Latin (la, confidence "
                                  f"{confidence:.2f}), which the model does not know.\n")


def test_a_rows_own_source_field_may_say_auto(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": heldout("ita_Latn", 1), "src_lang": "auto"}) + "\n"
                      + json.dumps({"text": heldout("spa_Latn", 1), "src_lang": "spa_Latn"}) + "\n")
    result = translate(["--tgt", "eng_Latn", "--detected-field", "detected", str(source)])
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["translation"] for row in written] == [heldout("eng_Latn", 1)] * 2
    assert written[0]["detected"]["lang"] == "ita_Latn" and written[1]["detected"] is None


def test_detected_field_needs_an_output_with_fields():
    result = translate(["--src", "auto", "--tgt", "fra_Latn", "--detected-field", "detected"], "Hello.\n")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == ("Error: --detected-field needs JSONL, Parquet or CSV output: a text "
                                              "output has one translation a line and no fields.")


def test_a_missing_detector_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "fasttext", None)
    langid.load_detector.cache_clear()
    try:
        result = translate(["--src", "auto", "--tgt", "fra_Latn"], "Hello.\n")
    finally:
        langid.load_detector.cache_clear()
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: --src auto needs the language detector, which is not installed here (import of fasttext halted; None in "
        "sys.modules): pip install 'nllbcli[langid]' in nllbcli's checkout.\n")


def test_the_api_takes_src_auto(translator):
    results = nllbcli.translate(translator, [heldout("fra_Latn", 2), LATIN], "auto", "eng_Latn",
                                DecodeOptions(beam_size=1))
    assert results[0].text == heldout("eng_Latn", 2) and results[0].detected["lang"] == "fra_Latn"
    assert results[1].text is None and "the detected language is Latin (la, " in results[1].error
    table = nllbcli.translate_table(translator, pa.table({"text": [heldout("deu_Latn", 2)]}), src="auto",
                                    tgt="eng_Latn", decode=DecodeOptions(beam_size=1), detected_field="detected")
    assert table.column("translation").to_pylist() == [heldout("eng_Latn", 2)]
    assert table.schema.field("detected").type == pa.struct([("lang", pa.string()), ("confidence", pa.float64())])
    assert table.column("detected").to_pylist()[0]["lang"] == "deu_Latn"


def test_sparks_schema_has_the_detected_struct():
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    from nllbcli.spark import partition_translator

    translate = partition_translator(str(SAMPLE), device="cpu", src="auto", tgt="fra_Latn", detected_field="detected")
    schema = translate.schema(StructType([StructField("text", StringType())]))
    assert schema["detected"].dataType == StructType([StructField("lang", StringType()),
                                                      StructField("confidence", DoubleType())])


# -- where the detector runs: processes of its own (a call of PROCESS_MIN texts or more), else this one ----------

def detection_cases():
    """Texts of every kind of Detection: each held-out language's sentences, a mixed row, no letters, a language
    NLLB lacks, a confidence below a threshold, the scripts told apart (Chinese, Serbian and Croatian)."""
    texts = [line for lang in LANGS for line in (HELDOUT / f"{lang}.txt").read_text(encoding="utf-8").splitlines()]
    return texts + [f"{heldout('fra_Latn', 1)} {heldout('spa_Latn', 2)}", "12 345", "", LATIN, "ok", "這是一個測試。",
                    "这是一个测试。", "Ово је реченица.", "Ovo je rečenica, koju pišem danas.", "x" * 5000]


@pytest.mark.parametrize("codes", [FLORES_200_CODES, tuple(LANGS)])
@pytest.mark.parametrize("min_confidence", [langid.MIN_CONFIDENCE, 0.9])
def test_the_detector_processes_give_the_detections_of_this_process(monkeypatch, codes, min_confidence):
    texts = detection_cases()
    here = langid.detect_here(texts, codes, min_confidence)
    assert langid.detector_processes().ready(timeout=60)  # started and ready: no call waits for them
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    monkeypatch.setattr(langid, "PROCESS_PART", 100)  # several processes, where the machine has the CPUs
    monkeypatch.setattr(langid, "detect_here", lambda *args: pytest.fail("detected in this process"))
    found = langid.detect_languages(texts, codes, min_confidence)
    assert found == here and [type(d) for d in found] == [langid.Detection] * len(texts)
    assert any(d.code is None for d in found) and any(d.code is not None for d in found)


def test_detection_goes_on_in_this_process_where_the_detector_processes_cannot_start_or_fail(monkeypatch):
    texts = detection_cases()
    expected = langid.detect_here(texts, FLORES_200_CODES, langid.MIN_CONFIDENCE)
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    monkeypatch.setattr(langid, "_processes", [])
    monkeypatch.setattr(langid.sys, "executable", "/nonexistent/python")
    assert langid.detect_languages(texts, FLORES_200_CODES) == expected
    assert langid.detector_processes().children == []
    monkeypatch.undo()
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    monkeypatch.setattr(langid, "_processes", [])
    processes = langid.detector_processes()
    processes.children[0].kill()  # dies: its pipe ends
    processes.children[0].wait()
    assert langid.detect_languages(texts, FLORES_200_CODES) == expected
    assert processes.children == []


def test_a_forked_process_starts_detector_processes_of_its_own():
    first = langid.detector_processes()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: others' pipes are not its own
        ok = langid.detector_processes() is not first and langid.detect_languages(
            [heldout("fra_Latn", 1)] * langid.PROCESS_MIN, tuple(LANGS))[0].code == "fra_Latn"
        os.write(writer, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(reader, 1) == b"1"
    assert langid.detector_processes() is first


def test_an_interrupt_between_a_request_and_its_reply_ends_the_detector_processes(monkeypatch):
    """A reply left in a pipe would answer the next call: the processes end, and the next call detects here."""
    texts = detection_cases()
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    monkeypatch.setattr(langid, "_processes", [])
    processes = langid.detector_processes()
    assert processes.ready(timeout=60)
    load = langid.pickle.load
    monkeypatch.setattr(langid.pickle, "load", lambda pipe: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        langid.detect_languages(texts, tuple(LANGS))
    monkeypatch.setattr(langid.pickle, "load", load)
    assert processes.children == []
    assert langid.detect_languages(texts[::-1], tuple(LANGS)) == langid.detect_here(texts[::-1], tuple(LANGS), 0.3)


def test_the_detector_processes_start_at_the_first_large_call_which_detects_here(monkeypatch):
    """Checking --src auto (resolve_source) and calls under PROCESS_MIN start no process: a Spark driver or a
    few rows' API call has none idling; the first call of PROCESS_MIN texts starts them and does not wait."""
    monkeypatch.setattr(langid, "_processes", [])
    assert langid.resolve_source("auto", tuple(LANGS)) == "auto"
    langid.detect_languages([heldout("fra_Latn", 1)] * (langid.PROCESS_MIN - 1), tuple(LANGS))
    assert langid._processes == []
    texts = detection_cases()
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    first = langid.detect_languages(texts, tuple(LANGS))
    assert len(langid._processes) == 1
    assert langid._processes[0].ready(timeout=60)
    monkeypatch.setattr(langid, "detect_here", lambda *args: pytest.fail("detected in this process"))
    assert langid.detect_languages(texts, tuple(LANGS)) == first


def test_no_call_waits_for_the_detector_processes_to_start(monkeypatch):
    """A process says it is ready once its detector is loaded (0.1 s to seconds after it starts): until one
    has, calls detect here rather than wait on its pipe, and the processes go on starting."""
    texts = detection_cases()
    monkeypatch.setattr(langid, "PROCESS_MIN", 2)
    monkeypatch.setattr(langid, "_processes", [])
    processes = langid.detector_processes()
    assert processes.ready() == []  # just started: none has loaded its detector
    asked = []
    here = langid.detect_here
    monkeypatch.setattr(langid, "detect_here", lambda *args: asked.append(len(args[0])) or here(*args))
    assert langid.detect_languages(texts, tuple(LANGS)) == here(texts, tuple(LANGS), langid.MIN_CONFIDENCE)
    assert asked == [len(texts)] and processes.children
    assert processes.ready(timeout=60) == processes.children
    assert langid.detect_languages(texts, tuple(LANGS)) == here(texts, tuple(LANGS), langid.MIN_CONFIDENCE)
    assert asked == [len(texts)]  # the processes detected
