import io

from rich.console import Console

from nllbcli.io import Record
from nllbcli.options import DecodeOptions
from nllbcli.pipeline import Job, cut_source, plan_batches, progress_display, read_chunks, translate_records

JOB = Job("eng_Latn", "fra_Latn")


def test_plan_batches_sorts_longest_first_within_the_budget():
    lengths = {0: 3, 1: 10, 2: 4, 3: 4, 4: 2, 5: 9}
    assert plan_batches(lengths, 20) == [[1, 5], [2, 3, 0, 4]]
    assert plan_batches(lengths, 8) == [[1], [5], [2, 3], [0, 4]]  # rows longer than the budget go alone


def test_plan_batches_of_nothing():
    assert plan_batches({}, 100) == []


def test_cut_source_keeps_language_token_and_eos():
    ids = [500, 10, 11, 12, 13, 2]
    assert cut_source(ids, 6) == ids
    assert cut_source(ids, 4) == [500, 10, 11, 2]


def test_translate_records_restores_input_order(fake):
    translator = fake
    texts = ["a" * (i % 7) + str(i) for i in range(50)]
    records = [Record(i, t, {}) for i, t in enumerate(texts)]
    assert translate_records(translator, records, JOB, DecodeOptions(), 40) == [t[::-1] for t in texts]
    assert [len(batch[0]) for batch in translator.batches] == sorted((len(b[0]) for b in translator.batches), reverse=True)


def test_translate_records_leaves_empty_texts_to_itself(fake):
    translator = fake
    done = []
    records = [Record(0, "", {}), Record(1, "ab", {}), Record(2, " \t", {})]
    result = translate_records(translator, records, JOB, DecodeOptions(), 100, lambda rows, tokens: done.append((rows, tokens)))
    assert result == ["", "ba", ""]
    assert translator.batches == [[[100_001, ord("a"), ord("b"), 2]]]
    assert done == [(2, 0), (1, 2)]


def test_translate_records_cuts_long_sources(fake):
    translator = fake
    translator.config.max_position_embeddings = 4
    assert translate_records(translator, [Record(0, "abcdef", {})], JOB, DecodeOptions(), 100) == ["ba"]
    assert translator.batches == [[[100_001, ord("a"), ord("b"), 2]]]


def test_read_chunks():
    assert [len(chunk) for chunk in read_chunks(iter(range(7)), 3)] == [3, 3, 1]


def test_progress_display_on_a_terminal():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=100)
    with progress_display(10, True, console) as advance:
        advance(4, 100)
        advance(6, 50)
    assert "10/10" in stream.getvalue() and "tokens/s" in stream.getvalue() and "sentences" in stream.getvalue()


def test_progress_display_off_writes_nothing(capsys):
    with progress_display(None, False) as advance:
        advance(1, 1)
    assert capsys.readouterr() == ("", "")
