"""Greedy search, beam search and sampling with the semantics of transformers' `generate`.

The decoder starts from `[decoder_start, tgt_lang]`: the language token is forced, never chosen, and counts
as the first of at most `max_length` generated tokens (transformers' `max_new_tokens`). Beam search follows
transformers' vectorised beam search with `early_stopping=False` operation for operation: 2K candidates per
sentence, finished hypotheses scored `sum(log p) / length ** length_penalty` (length counts the generated
tokens, the language token included), and the same stop heuristic. Sentences are independent: one that is
done (its finished beams can no longer change) leaves the batch, which changes nothing for the others.

The search talks to the engine through the calls of engine.Engine (encode, start, step_argmax_ahead,
step_topk or step_sample, reorder, select; step_log_probs to score given translations), so it does not know
whether the engine runs on NumPy or CuPy. Beam search needs only each beam's 2K best next tokens: the 2K best continuations of a sentence over all its beams are among
them, because a beam's score is added to every token of that beam alike. So the engine can choose them where
the logits are made.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .checkpoint import ModelConfig
from .engine import Engine
from .engine.numerics import gumbel_noise, inverse_temperature, log_softmax, sample_keys, sentence_keys, step_keys, to_host, topk_desc
from ..environment import ENV
from ..options import DecodeOptions

NEG = np.float32(-1.0e9)  # transformers' "very large negative" for masked beams


@dataclass
class Hypothesis:
    """One translation of a sentence."""

    ids: list[int]  # its tokens after the language token, without </s>
    log_prob: float | None  # the sum of its generated tokens' log-probabilities (the forced language token's is 0,
    #                         </s>'s counts); None where greedy search was not asked for scores
    score: float | None  # what the search ranked it by: log_prob / length ** length_penalty for beams (length: the
    #                      generated tokens, language token and </s> included; transformers' sequences_scores),
    #                      log_prob for greedy search; a given translation's (score_targets) as beams'
    token_log_probs: list[float] | None = None  # each token's log-probability, </s>'s last (score_targets)


def generate(engine: Engine, sources: list[list[int]], tgt_lang_id, config: ModelConfig,
             options: DecodeOptions, keys: list[int] | None = None,
             prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """The options.num_hypotheses best translations of each source, best first, in the order of `sources`.
    Sampling draws each source's tokens from its random stream, `keys` (numerics.sentence_key of the seed and the
    source's place in the input; None: streams of a random seed); several samples of a source, each from a
    stream of its own, come best first by log-probability. `prefixes`: tokens each translation starts with,
    after the language token (CTranslate2's target_prefix), forced as transformers' prefix_allowed_tokens_fn
    forces them: greedy search scores them 0 (its scores are those of the tokens it chose), beam search with
    their log-probabilities."""
    if not sources:
        return []
    check_vocabulary(options, config.vocab_size)
    # one target language for all, or one per sentence: a batch may mix them (the token is forced anyway)
    langs = np.broadcast_to(np.asarray(tgt_lang_id, dtype=np.int64), (len(sources),)).copy()
    limits = np.array(options.length_limits(sources), dtype=np.int64)
    samples = options.num_hypotheses if options.sampling else 1
    if options.sampling:
        if keys is None:
            seed = int(np.random.default_rng().integers(1 << 63))
            keys = sentence_keys(seed, np.arange(len(sources)), np.zeros(len(sources)))
        keys = sample_keys(keys, samples)
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] * options.num_hypotheses] * len(sources)
    todo = np.flatnonzero(limits > 1)  # the others may have the language token alone
    if not len(todo):
        return results
    rows = np.repeat(todo, samples)  # a decoder row per sample of each source
    forced = forced_tokens(prefixes, todo)
    # the encoder once per distinct source: a sentence translated into several languages (or repeated) shares it
    distinct: dict[tuple, int] = {}
    source_of = np.array([distinct.setdefault(tuple(sources[i]), len(distinct)) for i in todo], dtype=np.int64)
    encoded = engine.encode([list(source) for source in distinct])
    try:
        if options.beam_size == 1:
            row_keys = None if keys is None else keys.reshape(len(sources), samples)[todo].reshape(-1)
            found = greedy_search(engine, encoded, np.repeat(source_of, samples), langs[rows], config,
                                  options, limits[rows], row_keys, np.repeat(forced, samples, axis=0))
        else:
            found = beam_search(engine, encoded, source_of, langs[todo], config, options, limits[todo], forced)
    finally:
        engine.release_sources(encoded)
    results = list(results)
    for n, i in enumerate(todo):
        drawn = [h for hypotheses in found[n * samples : (n + 1) * samples] for h in hypotheses]
        if samples > 1 and drawn[0].log_prob is not None:
            drawn.sort(key=lambda h: -h.log_prob)
        results[i] = drawn
    return results


def score_targets(engine: Engine, sources: list[list[int]], tgt_lang_id, config: ModelConfig,
                  targets: list[list[int]], length_penalty: float = 1.0) -> list[Hypothesis]:
    """Each source's given translation, targets[i] (its pieces after the language token, without </s>), scored by
    forced decoding: the decoder fed `[decoder_start, tgt_lang] + target` once, no search (in one pass where the
    engine has forced_log_probs, else one step a token), each position's log-probability of the next given
    token (then of </s>) taken from its log-softmax, as transformers' forward pass with `labels` gives them. The language token is forced and not scored, as in
    generate's scores; the score is beam search's, log_prob / length ** length_penalty with length the tokens
    after the decoder start (the language token and </s> included), so that a translation of `generate` scores
    what the search gave it. Same order as `sources`."""
    if not sources:
        return []
    eos = config.eos_token_id
    langs = np.broadcast_to(np.asarray(tgt_lang_id, dtype=np.int64), (len(sources),))
    lengths = np.array([len(target) + 1 for target in targets], dtype=np.int64)  # tokens scored, </s> included
    given = np.full((len(sources), int(lengths.max())), eos, dtype=np.int64)  # </s> past each target's end
    for row, target in enumerate(targets):
        given[row, : len(target)] = target
    distinct: dict[tuple, int] = {}
    source_rows = np.array([distinct.setdefault(tuple(source), len(distinct)) for source in sources], dtype=np.int64)
    encoded = engine.encode([list(source) for source in distinct])
    forced = getattr(engine, "forced_log_probs", None)  # an engine's one pass over every given translation
    try:
        if forced is not None:
            token_log_probs = forced(encoded, source_rows, langs, given, lengths)
        else:
            token_log_probs = stepped_log_probs(engine, encoded, source_rows, langs, given, lengths, config)
    finally:
        engine.release_sources(encoded)
    results = []
    for row, target in enumerate(targets):
        scored = token_log_probs[row, : lengths[row]]
        log_prob = float(scored.sum())
        results.append(Hypothesis(list(target), log_prob, log_prob / float(lengths[row] + 1) ** length_penalty,
                                  scored.tolist()))
    return results


def stepped_log_probs(engine: Engine, encoded, source_rows: np.ndarray, langs: np.ndarray, given: np.ndarray,
                      lengths: np.ndarray, config: ModelConfig) -> np.ndarray:
    """score_targets' token log-probabilities (N, L) step by step, as an engine without forced_log_probs gives
    them: the decoder fed one token a row a step, each step's log-probability of the next given token
    (step_log_probs); rows leave once their </s> is scored."""
    steps: list[tuple[np.ndarray, object]] = []  # each step's rows and their log-probs on their way to the host
    with decoder(engine, encoded, source_rows, int(lengths.max()) + 1) as state:
        engine.step(encoded, state, np.full(len(source_rows), config.decoder_start_token_id), want_logits=False)
        alive, feed = np.arange(len(source_rows)), langs.copy()
        for t in range(given.shape[1]):
            steps.append((alive, engine.fetch_later(engine.step_log_probs(encoded, state, feed, given[alive, t]))))
            going_on = np.flatnonzero(lengths[alive] > t + 1)
            if not len(going_on):
                break
            if len(going_on) < len(alive):  # rows whose </s> was scored leave; their cache goes back
                engine.select(state, going_on)
                alive = alive[going_on]
            feed = given[alive, t]
    token_log_probs = np.zeros(given.shape, dtype=np.float64)
    for t, (rows, pending) in enumerate(steps):
        token_log_probs[rows, t] = pending.fetch()
    return token_log_probs


def check_vocabulary(options: DecodeOptions, vocab_size: int) -> None:
    """Refuse a search that takes more candidate tokens a step than the model's vocabulary has: beam search 2 a
    beam, sampling its top-k, each one more while --min-length bans </s> (search.without_token): a bound on the
    beam size that only the model knows, so it is checked here rather than with the options."""
    banned = int(options.min_length > 0)
    if options.beam_size > 1 and 2 * options.beam_size + banned > vocab_size:
        raise ValueError(f"a beam size of {options.beam_size} takes {2 * options.beam_size + banned} candidate tokens "
                         f"a step, more than the model's vocabulary of {vocab_size}: lower the beam size to "
                         f"{(vocab_size - banned) // 2} or less.")
    if options.sampling and options.candidates + banned > vocab_size:
        raise ValueError(f"sampling among the {options.candidates} most likely tokens takes more than the model's "
                         f"vocabulary of {vocab_size}: lower the sampling top-k.")


def forced_tokens(prefixes: list[list[int]] | None, todo: np.ndarray) -> np.ndarray:
    """The prefixes of sentences `todo` as a matrix (N, longest), -1 past each one's end; (N, 0) for none."""
    if prefixes is None:
        return np.full((len(todo), 0), -1, dtype=np.int64)
    chosen = [prefixes[i] for i in todo]
    forced = np.full((len(todo), max(map(len, chosen), default=0)), -1, dtype=np.int64)
    for row, prefix in enumerate(chosen):
        forced[row, : len(prefix)] = prefix
    return forced


def generate_ids(engine: Engine, sources: list[list[int]], tgt_lang_id, config: ModelConfig,
                 options: DecodeOptions) -> list[list[int]]:
    """Token ids of each source's best translation (generate's first), in the order of `sources`."""
    return [hypotheses[0].ids for hypotheses in generate(engine, sources, tgt_lang_id, config, options)]


@contextmanager
def decoder(engine: Engine, encoded, source_rows, max_positions: int):
    """A decoder state whose cache slots go back to the engine however the search ends."""
    state = engine.start(encoded, source_rows, max_positions)
    try:
        yield state
    finally:
        engine.release(state)


def strip_output(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def process_scores(scores: np.ndarray, sequences: np.ndarray, options: DecodeOptions, eos: int) -> np.ndarray:
    """Scores (N, V) float32 after transformers' repetition penalty and its no-repeat n-gram ban, given each row's
    tokens so far (N, T), the decoder start and language token included (generate's processor order). Its
    min_new_tokens ban of </s> is the caller's: greedy search takes its log-probabilities before it."""
    scores = np.array(scores, dtype=np.float32)
    rows = np.arange(len(scores))[:, None]
    if options.repetition_penalty != 1.0:
        penalty = np.float32(options.repetition_penalty)
        seen = scores[rows, sequences]  # (N, T)
        scores[rows, sequences] = np.where(seen < 0, seen * penalty, seen / penalty)
    n, length = options.no_repeat_ngram_size, sequences.shape[1]
    if n and length >= n:
        # a window whose first n-1 tokens are the row's last n-1 bans its own last token
        windows = np.lib.stride_tricks.sliding_window_view(sequences, n, axis=1)  # (N, T-n+1, n)
        prefix = sequences[:, length + 1 - n :]  # (N, n-1)
        matches = (windows[:, :, :-1] == prefix[:, None, :]).all(axis=-1)
        hit_rows, hit_windows = np.nonzero(matches)
        scores[hit_rows, windows[hit_rows, hit_windows, -1]] = -np.inf
    return scores


def sample_among(log_probs, ids, row_keys, options: DecodeOptions, xp):
    """Each row's draw (N,), an index into its candidates (N, K) (log-probs best first, their token ids): from
    softmax(log_probs / temperature), among the fewest candidates whose probabilities reach sampling_topp, by
    the Gumbel-max trick with the noise of each (row key, token)."""
    z = log_probs.astype(xp.float32) * inverse_temperature(options.sampling_temperature)
    if options.sampling_topp < 1.0:
        p = xp.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        z = xp.where(xp.cumsum(p, axis=1) - p < options.sampling_topp, z, -xp.inf)  # the first always stays
    return (z + gumbel_noise(row_keys, ids, xp)).argmax(axis=1)


def without_token(log_probs, ids, token: int, width: int, xp):
    """Rows of candidates (N, width + 1), best first, less `token` where a row has it, else less its last: the
    `width` best of the others (transformers' ban of a token, where the ban leaves the other scores as they were)."""
    hit = ids == token
    at = xp.where(hit.any(axis=1), hit.argmax(axis=1), width)[:, None]
    place = xp.arange(width)[None, :]
    source = place + (place >= at)
    return xp.take_along_axis(log_probs, source, axis=1), xp.take_along_axis(ids, source, axis=1)


# Greedy steps queued past the one whose ids the host waits for. More hide longer holds of the GIL by the reader
# and finisher threads; each costs every sentence one more step of decoding after its </s> (the steps queued
# before the host saw it): ~AHEAD / output length of the work, where sentences end early. NLLB_AHEAD: for measuring.
AHEAD = ENV.ahead


def greedy_search(engine: Engine, encoded, source_rows: np.ndarray, langs: np.ndarray, config: ModelConfig,
                  options: DecodeOptions, limits: np.ndarray, keys: np.ndarray | None = None,
                  forced: np.ndarray | None = None) -> list[list[Hypothesis]]:
    """Each decoder row's most likely token at every step (with options.sampling, a token drawn from the row's
    random stream `keys`), until </s> or its limit (limits: generated tokens, the language token included); the
    tokens of `forced` (N, P), -1 where none, in their place instead (scored 0). Row i reads source
    source_rows[i] of `encoded`."""
    forced = np.full((len(source_rows), 0), -1, dtype=np.int64) if forced is None else forced
    eos = config.eos_token_id
    batch = len(source_rows)
    room = limits - 1  # tokens each sentence may have after the language token
    steps = int(room.max())
    # log-probabilities of the chosen tokens, where scores are wanted or several samples are put best first
    scores = options.scores or (options.sampling and options.num_hypotheses > 1) or None
    xp = engine.xp
    with decoder(engine, encoded, source_rows, int(limits.max()) + 1) as state:
        engine.step(encoded, state, np.full(batch, config.decoder_start_token_id), want_logits=False)
        generated = np.zeros((batch, max(steps, 0)), dtype=np.int64)  # sentence s's t-th token (after the language)
        lengths = np.zeros(batch, dtype=np.int64)
        log_probs = np.zeros(batch, dtype=np.float64)
        alive = np.arange(batch)  # which sentence each decoder row belongs to

        def record(t: int, tokens: np.ndarray, chosen: np.ndarray | None) -> np.ndarray | None:
            """Step t's ids (N,) (and their log-probs) into the outputs. When some rows ended: the rows that go
            on (none: all ended), the others gone from the state; else None."""
            nonlocal alive
            generated[alive, t] = tokens
            lengths[alive] = t + 1
            if chosen is not None:
                log_probs[alive] += chosen
            ended = (tokens == eos) | (t + 1 >= room[alive])
            if not ended.any():
                return None
            going_on = np.flatnonzero(~ended)
            if len(going_on):
                engine.select(state, going_on)
                alive = alive[going_on]
            return going_on

        def choose(t: int, tokens) -> tuple[np.ndarray, np.ndarray | None]:
            """Step t's tokens (N,) on the host, and their log-probs, where each waits for the one before."""
            rows = np.arange(len(alive))
            banned = t + 1 < options.min_length  # </s>, while a sentence is shorter than min_length
            if options.processes_scores:  # the repetition penalty and the n-gram ban need the tokens so far
                prefix = np.stack([np.full(len(alive), config.decoder_start_token_id), langs[alive]], axis=1)
                sequences = np.concatenate([prefix, generated[alive, :t]], axis=1)  # (N, T)
                processed = process_scores(to_host(engine.step(encoded, state, tokens)), sequences, options, eos)
                row_lp = log_softmax(processed)  # the log-probabilities before </s> is banned, as without processing
                if banned:
                    processed[:, eos] = row_lp[:, eos] = -np.inf
                if not options.sampling:
                    tokens = processed.argmax(axis=-1)
                    return tokens, row_lp[rows, tokens] if scores else None
                row_ids = np.broadcast_to(np.arange(row_lp.shape[1]), row_lp.shape)
                if options.candidates:
                    row_lp, row_ids = topk_desc(row_lp, options.candidates)
                pick = sample_among(row_lp, row_ids, step_keys(keys[alive], t), options, np)
                return row_ids[rows, pick], row_lp[rows, pick]
            if options.sampling and not options.candidates:  # the whole vocabulary: drawn where the logits are made
                step = engine.step_sample(encoded, state, tokens, options.sampling_temperature, eos if banned else None,
                                          bool(scores))
                return step.fetch(), step.log_probs() if scores else None
            # the top candidates: sampling's, or greedy search's two best while </s> is banned (the first that
            # is not </s>)
            k = options.candidates if options.sampling else 1
            row_lp, row_ids = engine.step_topk(encoded, state, tokens, k + banned)
            if banned:
                row_lp, row_ids = without_token(row_lp, row_ids, eos, k, xp)
            pick = (sample_among(row_lp, row_ids, xp.asarray(step_keys(keys[alive], t)), options, xp)
                    if options.sampling else xp.zeros(len(alive), dtype=xp.int64))
            at = xp.arange(len(pick))
            return to_host(row_ids[at, pick]), to_host(row_lp[at, pick])

        def forcing(t: int, tokens: np.ndarray, chosen: np.ndarray | None):
            """Step t's tokens with the forced ones in their place (the rows' prefixes), scored 0."""
            if t >= forced.shape[1]:
                return tokens, chosen
            here = forced[alive, t]
            rows = here >= 0
            tokens = np.where(rows, here, tokens)
            return tokens, None if chosen is None else np.where(rows, 0.0, chosen)

        # Steps whose tokens the host takes before the next is queued: all of them with the logits processors
        # or sampling among candidates, else the first while </s> is banned or a token forced; the rest run
        # ahead (below): greedy search's argmax, or a draw over the whole vocabulary from the rows' streams.
        t, tokens = 0, langs.copy()  # tokens: the next step's input
        whole = options.sampling and not options.candidates
        if whole:
            engine.set_keys(state, keys)
        ahead = not options.processes_scores and (whole or not options.sampling)
        waiting = min(steps, max(options.min_length - 1, forced.shape[1])) if ahead else steps
        while t < waiting:
            tokens, chosen = forcing(t, *choose(t, tokens))
            going_on = record(t, tokens, chosen if scores else None)
            t += 1
            if going_on is not None:
                if not len(going_on):
                    break
                tokens = tokens[going_on]
        if t < waiting or not ahead:
            steps = t  # all rows ended, or every step was taken above
        # Steps ahead: steps t + 1 .. t + AHEAD are queued, each on the ids the one before left on the device,
        # while step t's are on their way to the host, so the GPU never waits for the host to look at them (nor
        # for a host thread held up a few milliseconds). Rows that ended at step t ran the steps after it for
        # nothing and leave before the next is queued; a step's ids (first maximum on ties, as torch.argmax)
        # never depend on the other rows, so the outputs are those of waiting at every step.
        pending: deque = deque()
        for t in range(t, steps):
            while len(pending) <= AHEAD and t + len(pending) < steps:
                feed = pending[-1].device if pending else tokens
                if whole:
                    pending.append(engine.step_sample(encoded, state, feed, options.sampling_temperature, None,
                                                      bool(scores)))
                elif scores:
                    pending.append(engine.step_argmax_ahead(encoded, state, feed, log_probs=True))
                else:
                    pending.append(engine.step_argmax_ahead(encoded, state, feed))
            step = pending.popleft()
            tokens = step.fetch()
            going_on = record(t, tokens, step.log_probs() if scores else None)
            if going_on is not None:
                if not len(going_on):
                    break
                tokens = tokens[going_on]
                pending = deque(p.subset(going_on) for p in pending)
    results = []
    for s in range(batch):
        total = float(log_probs[s]) if scores else None
        results.append([Hypothesis(strip_output(generated[s, : lengths[s]].tolist(), eos), total, total)])
    return results


def beam_search(engine: Engine, encoded, source_of: np.ndarray, langs: np.ndarray, config: ModelConfig,
                options: DecodeOptions, limits: np.ndarray, forced: np.ndarray | None = None) -> list[list[Hypothesis]]:
    """transformers' beam search of each sentence within its limit (limits: generated tokens, the language token
    included; all at least 2), every beam taking the tokens of `forced` (N, P), -1 where none, in their place
    (the only candidate of each beam there, with its log-probability). Sentence i reads source source_of[i] of
    `encoded`."""
    batch = len(source_of)
    forced = np.full((batch, 0), -1, dtype=np.int64) if forced is None else forced
    xp = engine.xp  # the beam arrays live where the engine's top-k lands: no copies per step
    k, eos = options.beam_size, config.eos_token_id
    lp = options.length_penalty
    ends = limits + 1  # per sentence, transformers' max_length: the decoder start plus max_new_tokens
    max_len = int(ends.max())
    width = 2 * k  # candidates kept per sentence: (one EOS token + 1) * beams, so K stay open when K end
    neg = xp.float32(NEG)
    # Per active sentence (axis 0). The search starts after the forced language token, whose log-prob is 0
    # (transformers' forced-BOS processor), with beam 0 live and the others at -1e9, as after its first step.
    run_seq = xp.full((batch, k, max_len), config.pad_token_id, dtype=xp.int64)
    run_seq[:, :, 0] = config.decoder_start_token_id
    run_seq[:, :, 1] = xp.asarray(langs)[:, None]
    run_score = xp.full((batch, k), neg, dtype=xp.float32)
    run_score[:, 0] = 0
    fin_seq = run_seq.copy()
    fin_score = xp.full((batch, k), neg, dtype=xp.float32)  # ranked by: log-probs / length ** lp
    fin_sum = xp.zeros((batch, k), dtype=xp.float32)  # their sums of log-probs
    fin_done = xp.zeros((batch, k), dtype=bool)
    end_at = xp.asarray(ends)[:, None]  # (n, 1)
    sentences = np.arange(batch)  # which input sentence each active sentence is
    results: dict[int, list[Hypothesis]] = {}
    n_best = options.num_hypotheses

    def candidates_of(tokens, cur_len: int):
        """Each row's 2K best next tokens (N, 2K), </s> left out while the sentences are shorter than min_length,
        the forced token alone where a sentence has one."""
        if cur_len - 1 < options.min_length:
            row_lp, row_ids = engine.step_topk(encoded, state, tokens, width + 1)
            row_lp, row_ids = without_token(row_lp, row_ids, eos, width, xp)
        else:
            row_lp, row_ids = engine.step_topk(encoded, state, tokens, width)
        return forcing(row_lp, row_ids, cur_len, lambda ids: engine.last_log_probs(state, ids))

    def forcing(row_lp, row_ids, cur_len: int, log_probs_of):
        """The candidates with each forced row's replaced by its forced token (log_probs_of(ids): each row's
        log-probability of ids (N,) at this step) and -inf."""
        at = cur_len - 2  # the position after the language token
        if at >= forced.shape[1]:
            return row_lp, row_ids
        here = np.repeat(forced[sentences, at], k)  # (n*K,)
        if not (here >= 0).any():
            return row_lp, row_ids
        rows = xp.asarray(here >= 0)[:, None]
        ids = xp.asarray(np.maximum(here, 0))
        only_lp = xp.full(row_lp.shape, -xp.inf, dtype=row_lp.dtype)
        only_lp[:, 0] = xp.asarray(log_probs_of(ids), dtype=row_lp.dtype)
        only_ids = xp.broadcast_to(ids[:, None], row_ids.shape).astype(row_ids.dtype)
        return xp.where(rows, only_lp, row_lp), xp.where(rows, only_ids, row_ids)

    # One step ahead (greedy search runs AHEAD steps ahead): the next step is queued on the device's beams before the host looks at
    # which sentences are done; a done sentence's beams ran that step for nothing and leave before the next.
    with decoder(engine, encoded, np.repeat(source_of, k), max_len) as state:
        engine.step(encoded, state, np.full(batch * k, config.decoder_start_token_id), want_logits=False)
        tokens = np.repeat(langs, k)
        cur_len = 2
        candidates = None  # the next step's (row_lp, row_ids), queued ahead
        while True:
            n = len(sentences)
            if candidates is not None:
                row_lp, row_ids = candidates
            elif options.processes_scores:
                log_probs = log_softmax(to_host(engine.step(encoded, state, tokens)))  # (n*K, V)
                sequences = to_host(run_seq[:, :, :cur_len]).reshape(n * k, cur_len)
                processed = process_scores(log_probs, sequences, options, eos)
                if cur_len - 1 < options.min_length:
                    processed[:, eos] = -np.inf
                row_lp, row_ids = (xp.asarray(a) for a in topk_desc(processed, width))
                row_lp, row_ids = forcing(row_lp, row_ids, cur_len,
                                          lambda ids: processed[np.arange(len(processed)), to_host(ids)])
            else:
                row_lp, row_ids = candidates_of(tokens, cur_len)  # (n*K, 2K) each, best first
            # candidates ordered as transformers' top-k over beam * V + token: by score, then beam, then token
            scores = row_lp.astype(xp.float32).reshape(n, k, width) + run_score[:, :, None]
            top_score, top_index = topk_desc(scores.reshape(n, k * width), width)  # (n, 2K)
            top_beam = top_index // width
            top_token = xp.take_along_axis(row_ids.reshape(n, k * width), top_index, axis=1)
            top_seq = xp.take_along_axis(run_seq, top_beam[:, :, None], axis=1)  # (n, 2K, L)
            top_seq[:, :, cur_len] = top_token
            hits = (top_token == eos) | (cur_len + 1 >= end_at)  # (n, 2K): ended, or out of room

            # the K best candidates that go on
            open_score = top_score + hits.astype(xp.float32) * neg
            _, next_idx = topk_desc(open_score, k)
            run_seq = xp.take_along_axis(top_seq, next_idx[:, :, None], axis=1)
            run_score = xp.take_along_axis(open_score, next_idx, axis=1)
            parents = xp.take_along_axis(top_beam, next_idx, axis=1)  # (n, K)

            # finished hypotheses: only among the first K candidates, scored with the length penalty
            just_done = hits.copy()
            just_done[:, k:] = False
            normed = top_score / xp.float32(float(cur_len + 1 - 1) ** lp)
            normed = normed + (~just_done).astype(xp.float32) * neg
            merged_score = xp.concatenate([fin_score, normed], axis=1)
            fin_score, best = topk_desc(merged_score, k)
            fin_seq = xp.take_along_axis(xp.concatenate([fin_seq, top_seq], axis=1), best[:, :, None], axis=1)
            fin_sum = xp.take_along_axis(xp.concatenate([fin_sum, top_score], axis=1), best, axis=1)
            fin_done = xp.take_along_axis(xp.concatenate([fin_done, just_done], axis=1), best, axis=1)

            cur_len += 1
            # stop heuristic (early_stopping=False): can the best open beam, at this length, beat the worst finished?
            best_possible = run_score[:, :1] / xp.float32(float(cur_len - 1) ** lp)
            worst_finished = xp.where(fin_done, fin_score.min(axis=1, keepdims=True), neg)
            improvable = xp.any(best_possible > worst_finished, axis=1)
            finished_later = engine.fetch_later(~improvable | hits.all(axis=1))
            # every sentence's best finished hypotheses go to the host with the flags, so that a sentence found done
            # is read there, not from the device behind the step queued next (which the host would then wait for)
            found_later = [engine.fetch_later(a) for a in (fin_seq[:, :n_best, 2:], fin_sum[:, :n_best],
                                                           fin_score[:, :n_best])]
            candidates = None
            if cur_len < max_len:  # the next step, queued before the host knows who is done
                engine.reorder(state, (xp.arange(n)[:, None] * k + parents).reshape(-1))  # beams follow their parents
                tokens = run_seq[:, :, cur_len - 1].reshape(-1)
                if not options.processes_scores:
                    candidates = candidates_of(tokens, cur_len)
            finished = np.asarray(finished_later.fetch()) | (cur_len >= ends[sentences])  # the one wait per step
            done = np.flatnonzero(finished)
            if len(done):
                # a finished hypothesis ends in </s> or fills its sentence's room, so no padding follows its tokens
                fin_seqs, fin_sums, fin_scores = (later.fetch() for later in found_later)
                found = zip(done, fin_seqs[done], fin_sums[done], fin_scores[done])
                for i, seqs, sums, normed_scores in found:
                    room = int(ends[sentences[i]]) - 2  # tokens after the language token
                    results[int(sentences[i])] = [Hypothesis(strip_output(seq[:room].tolist(), eos), float(total), float(score))
                                                  for seq, total, score in zip(seqs, sums, normed_scores)]
            if finished.all():
                break
            if len(done):
                live = np.flatnonzero(~finished)
                rows = (live[:, None] * k + np.arange(k)).reshape(-1)
                engine.select(state, rows)  # done sentences leave
                rows_x, live_x = xp.asarray(rows), xp.asarray(live)
                if candidates is not None:
                    candidates = (candidates[0][rows_x], candidates[1][rows_x])
                tokens = tokens[rows_x]
                run_seq, run_score, end_at = run_seq[live_x], run_score[live_x], end_at[live_x]
                fin_seq, fin_score, fin_sum, fin_done = fin_seq[live_x], fin_score[live_x], fin_sum[live_x], fin_done[live_x]
                sentences = sentences[live]
    return [results[i] for i in range(batch)]
