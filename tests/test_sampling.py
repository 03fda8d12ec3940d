"""Sampling (--sampling-topk, --sampling-topp, --sampling-temperature, --seed): transformers' sampling draws
from torch's generator, so these are property tests. The draws follow the distribution asked for, a sentence's
draws depend on the seed and its place in the input alone (not on its batch, its chunk or the devices), and the
scores are the model's log-probabilities of the tokens drawn."""

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from nllbcli.cli import cli
from nllbcli.model.engine.numerics import GUMBEL_MAX, gumbel_noise, log_softmax, sentence_key, step_keys
from nllbcli.options import DecodeOptions
from nllbcli.model.search import sample_among

from test_decoding import translator
from test_decoding_cli import TRANSLATE, write_jsonl

TEXTS = ["The meeting is on the twentieth.", "Hello! I will bring ninety-seven red boxes.", "Yes.",
         "We saw sixty-eight black cups in June."]
DRAWS = 40000


def frequencies(log_probs: np.ndarray, options: DecodeOptions, seed: int = 0) -> np.ndarray:
    """How often each of a row's candidates is drawn, over DRAWS streams."""
    keys = step_keys(np.array([sentence_key(seed, n, 0) for n in range(DRAWS)], np.uint32), 3)
    lp = np.broadcast_to(log_probs.astype(np.float32), (DRAWS, len(log_probs)))
    ids = np.broadcast_to(np.arange(len(log_probs)), lp.shape)
    return np.bincount(sample_among(lp, ids, keys, options, np), minlength=len(log_probs)) / DRAWS


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_softmax_at_the_temperature(temperature):
    log_probs = log_softmax(np.array([[2.0, 1.5, 0.0, -1.0, -3.0, 0.7]], np.float32))[0]
    want = np.exp(log_probs / temperature)
    want /= want.sum()
    got = frequencies(log_probs, DecodeOptions(beam_size=1, sampling_topk=0, sampling_temperature=temperature))
    assert np.abs(got - want).max() < 4 * np.sqrt(want.max() / DRAWS)  # 4 standard deviations


def test_the_nucleus_is_the_fewest_tokens_that_reach_p():
    log_probs = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04], np.float32))
    got = frequencies(log_probs, DecodeOptions(beam_size=1, sampling_topk=0, sampling_topp=0.85))
    assert got[3] == got[4] == 0  # 0.5 + 0.25 < 0.85 <= 0.5 + 0.25 + 0.15
    want = np.array([0.5, 0.25, 0.15]) / 0.9
    assert np.abs(got[:3] - want).max() < 4 * np.sqrt(0.6 / DRAWS)
    only = frequencies(log_probs, DecodeOptions(beam_size=1, sampling_topk=0, sampling_topp=0.3))
    assert only[0] == 1.0  # the best alone reaches p: always it


def test_the_noise_is_gumbel_and_independent():
    keys = step_keys(np.array([sentence_key(9, n, 0) for n in range(4)], np.uint32), 0)
    g = gumbel_noise(keys, np.broadcast_to(np.arange(100000), (4, 100000)))
    assert g.dtype == np.float32 and np.isfinite(g).all()
    assert abs(g.mean() - 0.5772) < 0.02 and abs(g.std() - np.pi / np.sqrt(6)) < 0.02
    assert abs(np.corrcoef(g[0], g[1])[0, 1]) < 0.02  # other sentences
    later = gumbel_noise(step_keys(np.array([sentence_key(9, 0, 0)], np.uint32), 1), np.arange(100000)[None])
    assert abs(np.corrcoef(g[0], later[0])[0, 1]) < 0.02  # the next step
    assert sentence_key(9, 0, 1) != sentence_key(9, 1, 0) != sentence_key(10, 1, 0)
    least = np.float32(0.5 * 2.0**-23)  # the least v a hash gives: the largest draw, which the GPU's skip bounds
    assert -np.log(least * (1 + least / 2)) < GUMBEL_MAX


@pytest.mark.parametrize("options", [
    DecodeOptions(beam_size=1, max_length=30, sampling_topk=0, seed=4, scores=True),
    DecodeOptions(beam_size=1, max_length=30, sampling_topk=8, seed=4, scores=True, sampling_temperature=0.8),
    DecodeOptions(beam_size=1, max_length=30, sampling_topk=0, sampling_topp=0.7, seed=4, scores=True),
    DecodeOptions(beam_size=1, max_length=30, sampling_topk=5, seed=4, scores=True, repetition_penalty=1.3),
], ids=["whole", "top-8 T0.8", "nucleus", "top-5 with penalty"])
def test_a_draw_depends_on_its_stream_alone_and_scores_its_tokens(options):
    tr = translator("sample")
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    keys = [sentence_key(options.seed, n, 0) for n in range(len(sources))]
    together = tr.generate_hypotheses(sources, "fra_Latn", options, keys)
    alone = [tr.generate_hypotheses([s], "fra_Latn", options, [k])[0] for s, k in zip(sources, keys)]
    backwards = tr.generate_hypotheses(sources[::-1], "fra_Latn", options, keys[::-1])[::-1]
    assert [h[0].ids for h in together] == [h[0].ids for h in alone] == [h[0].ids for h in backwards]
    other = tr.generate_hypotheses(sources, "fra_Latn", replace(options, seed=5),
                                   [sentence_key(5, n, 0) for n in range(len(sources))])
    assert [h[0].ids for h in other] != [h[0].ids for h in together]
    for source, (h,) in zip(sources, together):  # teacher-forced log-probabilities of what was drawn
        assert h.log_prob == h.score
        if not options.processes_scores:
            assert h.log_prob == pytest.approx(forced_log_prob(tr, source, h.ids), abs=1e-4)


def forced_log_prob(tr, source, ids):
    """The sum of the model's log-probabilities of the tokens ids (and </s>, where it fits), fed one by one."""
    engine, config = tr.engine, tr.config
    encoded = engine.encode([source])
    state = engine.start(encoded, np.arange(1), len(ids) + 4)
    engine.step(encoded, state, [config.decoder_start_token_id], want_logits=False)
    total, fed = 0.0, tr.tokenizer.lang_id("fra_Latn")
    for token in ids + [config.eos_token_id]:
        total += float(log_softmax(engine.step(encoded, state, [fed]))[0, token])
        fed = token
    return total


def test_a_cold_draw_is_the_greedy_translation():
    """Cold enough that no draw's noise (below GUMBEL_MAX, 16.7) reaches across the least gap between a step's
    best two logits on these texts (0.005, the first text's sixth token, scaled to 500): generate draws from a
    random seed here, and at 1e-3 (a gap of 4.9) about one draw in 150 takes the other token."""
    tr = translator("sample")
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    cold = DecodeOptions(beam_size=1, max_length=30, sampling_topk=0, sampling_temperature=1e-5, seed=1)
    assert tr.generate(sources, "fra_Latn", cold) == tr.generate(sources, "fra_Latn", DecodeOptions(beam_size=1, max_length=30))


def test_samples_of_a_sentence_come_best_first_with_its_own_draw_among_them():
    tr = translator("sample")
    sources = [tr.tokenizer.encode(t, "eng_Latn") for t in TEXTS]
    keys = [sentence_key(2, n, 0) for n in range(len(sources))]
    one = DecodeOptions(beam_size=1, max_length=30, sampling_topk=0, seed=2, scores=True)
    single = tr.generate_hypotheses(sources, "fra_Latn", one, keys)
    many = tr.generate_hypotheses(sources, "fra_Latn", replace(one, num_hypotheses=4), keys)
    for (drawn,), samples in zip(single, many):
        assert len(samples) == 4 and drawn.ids in [h.ids for h in samples]
        assert [h.log_prob for h in samples] == sorted((h.log_prob for h in samples), reverse=True)
    assert any(len({tuple(h.ids) for h in samples}) > 1 for samples in many)
    unscored = tr.generate_hypotheses(sources, "fra_Latn", replace(one, num_hypotheses=4, scores=False), keys)
    assert [[h.ids for h in hs] for hs in unscored] == [[h.ids for h in hs] for hs in many]  # best first all the same


@pytest.mark.parametrize("topk", [0, 6])
def test_min_length_holds_while_sampling(topk):
    tr = translator("sample")
    options = DecodeOptions(beam_size=1, max_length=30, sampling_topk=topk, seed=3, min_length=16)
    for (h,) in tr.generate_hypotheses([tr.tokenizer.encode(t, "eng_Latn") for t in TEXTS], "fra_Latn", options):
        assert len(h.ids) + 1 >= 16


def test_a_seeded_job_gives_the_same_output_whatever_its_chunks_batches_and_devices(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", TEXTS * 3)
    args = ["--sampling-topk", "0", "--sampling-topp", "0.9", "--seed", "11", "--num-hypotheses", "2", "--scores"]
    outputs = []
    for extra in ([], ["--chunk-rows", "2"], ["--max-batch-sentences", "1"]):
        result = CliRunner().invoke(cli, TRANSLATE + args + extra + [str(tmp_path / "in.jsonl"), "-"])
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    on_devices = [a for a in TRANSLATE if a not in ("--device", "cpu")] + ["--devices", "cpu:2", "--chunk-rows", "3"]
    result = CliRunner().invoke(cli, on_devices + args + [str(tmp_path / "in.jsonl"), "-"])
    outputs.append(result.output)
    assert outputs[1:] == outputs[:1] * 3  # the same draws and scores, to the bit
    runs = [json.loads(line) for line in outputs[0].splitlines()]
    assert len({json.dumps(r["translation"]) for r in runs[::4]}) > 1  # one text at rows 0, 4, 8: its own draws
    unseeded = [CliRunner().invoke(cli, TRANSLATE + args[:4] + [str(tmp_path / "in.jsonl"), "-"]).output for _ in range(2)]
    assert unseeded[0] != unseeded[1]


@pytest.mark.parametrize("args,message", [
    (["--seed", "3"], "--seed goes with sampling"),
    (["--sampling-temperature", "0.5"], "--sampling-temperature goes with sampling"),
    (["--sampling-topk", "4", "--beam-size", "4"], "takes beam size 1, not 4"),
    (["--sampling-topk", "300000"], "0<=x<=262144"),
])
def test_sampling_options_that_cannot_be_are_one_line(tmp_path, args, message):
    write_jsonl(tmp_path / "in.jsonl", ["Yes."])
    result = CliRunner().invoke(cli, TRANSLATE + args + [str(tmp_path / "in.jsonl"), "-"])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_batchs_stream_keys_are_each_sentences_made_at_once():
    """sentence_keys and sample_keys make a batch's keys with array operations, the keys of jobs before them
    (pinned: a resumed job draws what it drew), whatever the row's size."""
    from nllbcli.model.engine.numerics import sample_keys, sentence_keys

    assert [sentence_key(0, 0, 0), sentence_key(0, 0, 3), sentence_key(0, 1, 0)] == [806602113, 741185853, 2402222962]
    assert sentence_key(2**40 + 5, 2**33 + 9, 3) == 2795040748
    rows, sentences = np.array([0, 1, 2**33 + 9, 77]), np.array([0, 3, 3, 1])
    assert sentence_keys(7, rows, sentences).tolist() == [sentence_key(7, int(r), int(s)) for r, s in zip(rows, sentences)]
    assert sample_keys([806602113, 741185853], 3).tolist() == [806602113, 1884906946, 656945550, 741185853,
                                                              1659245671, 2232971480]


def test_a_top_k_up_to_the_vocabulary_is_taken(tmp_path):
    """--sampling-topk as CTranslate2 users give it (40, 50): any K up to the model's vocabulary, a seeded job the
    same twice; a K above the vocabulary is one line."""
    write_jsonl(tmp_path / "in.jsonl", ["The meeting is on the twentieth.", "Yes."])
    args = TRANSLATE + ["--sampling-topk", "40", "--seed", "5", str(tmp_path / "in.jsonl"), "-"]
    first, again = (CliRunner().invoke(cli, args) for _ in range(2))
    assert first.exit_code == 0 and first.output == again.output and first.output.count("\n") == 2
    too_many = CliRunner().invoke(cli, TRANSLATE + ["--sampling-topk", "100000", str(tmp_path / "in.jsonl"), "-"])
    assert too_many.exit_code == 1
    assert too_many.stderr.startswith("Error: sampling among the 100000 most likely tokens takes more than the model's")
