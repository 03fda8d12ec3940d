"""Greedy and beam search with the semantics of transformers' `generate`.

The decoder starts from `[decoder_start, tgt_lang]`: the language token is forced, never chosen, and counts
as the first of at most `max_length` generated tokens (transformers' `max_new_tokens`). Beam search follows
transformers' vectorised beam search with `early_stopping=False` operation for operation: 2K candidates per
sentence, finished hypotheses scored `sum(log p) / length ** length_penalty` (length counts the generated
tokens, the language token included), and the same stop heuristic. Sentences are independent: one that is
done (its finished beams can no longer change) leaves the batch, which changes nothing for the others.

The search talks to the engine through a few calls (encode, start, step_argmax or step_topk, select), so it
does not know whether the engine runs on NumPy or CuPy. Beam search needs only each beam's 2K best next
tokens: the 2K best continuations of a sentence over all its beams are among them, because a beam's score is
added to every token of that beam alike. So the engine can choose them where the logits are made.
"""

from __future__ import annotations

import os
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, fields
from itertools import islice

import numpy as np

from .checkpoint import ModelConfig
from .errors import PoolFull
from .options import DecodeOptions

NEG = np.float32(-1.0e9)  # transformers' "very large negative" for masked beams


def generate(engine, sources: list[list[int]], tgt_lang_id, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    """Token ids of each translation, after the language token and without </s>, in the order of `sources`."""
    if not sources:
        return []
    encoded = engine.encode(sources)
    # one target language for all, or one per sentence: a batch may mix them (the token is forced anyway)
    langs = np.broadcast_to(np.asarray(tgt_lang_id, dtype=np.int64), (len(sources),)).copy()
    search = greedy_search if options.beam_size == 1 else beam_search
    try:
        return search(engine, encoded, len(sources), langs, config, options)
    finally:
        engine.release_sources(encoded)


@contextmanager
def decoder(engine, encoded, source_rows, max_positions: int):
    """A decoder state whose cache slots go back to the engine however the search ends."""
    state = engine.start(encoded, source_rows, max_positions)
    try:
        yield state
    finally:
        engine.release(state)


def strip_output(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def process_scores(scores: np.ndarray, sequences: np.ndarray, options: DecodeOptions) -> np.ndarray:
    """Scores (N, V) float32 after transformers' repetition penalty, then its no-repeat n-gram ban, given each
    row's tokens so far (N, T), the decoder start and language token included (generate's processor order)."""
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


class Ready:
    """step_argmax_ahead's answer for engines that have none: the ids, already on the host."""

    def __init__(self, ids):
        self.device = np.asarray(ids)

    def fetch(self) -> np.ndarray:
        return self.device

    def subset(self, rows: np.ndarray) -> "Ready":
        return Ready(self.device[rows])


# Greedy steps queued past the one whose ids the host waits for. More hide longer holds of the GIL by the reader
# and finisher threads; each costs every sentence one more step of decoding after its </s> (the steps queued
# before the host saw it): ~AHEAD / output length of the work, where sentences end early. NLLB_AHEAD: for measuring.
AHEAD = int(os.environ["NLLB_AHEAD"]) if os.environ.get("NLLB_AHEAD", "").isdigit() else 2


def greedy_search(engine, encoded, batch: int, langs: np.ndarray, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    eos = config.eos_token_id
    steps = options.max_length - 1  # the language token was the first generated token
    with decoder(engine, encoded, np.arange(batch), options.max_length + 1) as state:
        engine.step(encoded, state, np.full(batch, config.decoder_start_token_id), want_logits=False)
        generated = np.zeros((batch, max(steps, 0)), dtype=np.int64)  # sentence s's t-th token (after the language)
        lengths = np.zeros(batch, dtype=np.int64)
        alive = np.arange(batch)  # which sentence each decoder row belongs to

        def record(t: int, tokens: np.ndarray) -> np.ndarray | None:
            """Step t's ids (N,) into the outputs. When some rows ended: the rows that go on (none: all ended),
            the others gone from the state; else None."""
            nonlocal alive
            generated[alive, t] = tokens
            lengths[alive] = t + 1
            ended = tokens == eos
            if not ended.any():
                return None
            keep = np.flatnonzero(~ended)
            if len(keep):
                engine.select(state, keep)
                alive = alive[keep]
            return keep

        if not options.processes_scores:
            # Steps ahead: steps t + 1 .. t + AHEAD are queued, each on the ids the one before left on the
            # device, while step t's are on their way to the host, so the GPU never waits for the host to look
            # at them (nor for a host thread held up a few milliseconds). Rows that ended at step t ran the
            # steps after it for nothing and leave before the next is queued; a step's ids (first maximum on
            # ties, as torch.argmax) never depend on the other rows, so the outputs are those of waiting at
            # every step.
            queue = getattr(engine, "step_argmax_ahead", None) or (lambda *args: Ready(engine.step_argmax(*args)))
            pending, tokens = deque(), langs.copy()  # tokens: the next step's, where none is queued (AHEAD 0)
            for t in range(steps):
                while len(pending) <= AHEAD and t + len(pending) < steps:
                    pending.append(queue(encoded, state, pending[-1].device if pending else tokens))
                tokens = pending.popleft().fetch()
                keep = record(t, tokens)
                if keep is not None:
                    if not len(keep):
                        break
                    tokens = tokens[keep]
                    pending = deque(p.subset(keep) for p in pending)
        else:  # the repetition penalty and the n-gram ban need step t's ids on the host before step t + 1
            tokens = langs.copy()
            for t in range(steps):
                prefix = np.stack([np.full(len(alive), config.decoder_start_token_id), langs[alive]], axis=1)
                sequences = np.concatenate([prefix, generated[alive, :t]], axis=1)  # (N, T)
                logits = to_host(engine.step(encoded, state, tokens))
                tokens = process_scores(logits, sequences, options).argmax(axis=-1)
                keep = record(t, tokens)
                if keep is not None:
                    if not len(keep):
                        break
                    tokens = tokens[keep]
    return [strip_output(generated[s, : lengths[s]].tolist(), eos) for s in range(batch)]


# greedy_continuous admits a group when its live rows fall below this fraction of live_rows: groups of at least a
# quarter of live_rows (one encoder run, one join each), while the rows never fall far below live_rows
REFILL = 0.75


@dataclass
class LiveRows:
    """The host's record of greedy_continuous's decoder rows, in the order of the engine's state."""

    sentence: np.ndarray  # (N,) the input sentence each row decodes
    group: np.ndarray  # (N,) the admission group (one encoding) it came in
    skip: np.ndarray  # (N,) outputs to come that are not the sentence's: 1 until its </s> step's ids are seen
    room: np.ndarray  # (N,) steps that may still be queued for it (its </s> step, max_length - 1, one spare)
    force: np.ndarray  # (N,) written into its input after the next step queued (its language, after its </s>); -1 none

    @classmethod
    def fresh(cls, sentences: np.ndarray, group: int, langs: np.ndarray, steps: int) -> "LiveRows":
        n = len(sentences)
        # room: the </s> step, `steps` more, and one into the slot's last position (max_length), which no
        # sentence needs: a row queued up to its last step then holds the queue one step short, not empty
        return cls(sentences, np.full(n, group), np.ones(n, np.int64), np.full(n, steps + 2), langs.copy())

    def take(self, rows: np.ndarray) -> "LiveRows":
        return LiveRows(*(getattr(self, f.name)[rows] for f in fields(self)))

    def joined(self, other: "LiveRows") -> "LiveRows":
        return LiveRows(*(np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)))


def greedy_continuous(engine, sources: list[list[int]], tgt_lang_id, config: ModelConfig, options: DecodeOptions,
                      live_rows: int, max_group_tokens: int | None = None, stats: dict | None = None) -> list[list[int]]:
    """Greedy search with continuous batching. Token ids of each translation, after the language token and
    without </s>, in the order of `sources`: for every sentence those that `generate` gives it (greedy).

    At most `live_rows` decoder rows are alive at once (fewer if engine.capacity holds fewer). Sentences are
    admitted longest first (the long ones do not trail at the end), in groups: whenever the live rows fall below
    REFILL * live_rows, the next group (enough sentences to fill back to live_rows; at most `max_group_tokens`
    source tokens, counted as rows x longest, where given) is encoded together (engine.encode), started
    (engine.start) and joined to the running decoder state (engine.join). Its rows start at position 0 beside
    rows at later positions: a row's first step feeds </s> (the decoder start), its second its language, and its
    ids are recorded from the second on, as greedy_search's are. A finished row leaves the state as soon as the
    host sees its </s> (after the search.AHEAD steps queued meanwhile, as in greedy_search); no step is spent
    on it after that. Each step's argmax is each row's own, so a sentence's ids do not depend on the rows
    beside it. A group's encoder output is released (engine.release_sources) once its last row has ended.

    When the engine's pool cannot take a group (PoolFull from encode or start), admission waits until a group
    is released; with no row alive, it tries half as many sentences, down to one (whose PoolFull is raised).
    With the repetition penalty or the n-gram ban, each step needs the ids before it on the host: no step is
    queued ahead then. Every engine call gets None for `encoded`: the rows' sources are in the state.

    tgt_lang_id: one id for all sentences or one per sentence. stats: a dict, filled with counts: groups,
    joins, waits (admissions refused for want of room), steps (decoder steps), row_steps (rows over all steps).

    The translator does not use it: on the H200 it gave the static batches' ids at 0.99-1.00 of their speed
    (bench/continuous.py, docs/PERF.md ninth session). A step's time is proportional to its rows here, and static
    batches already drop their finished rows, so fewer, fuller steps save nothing.
    """
    if options.beam_size != 1:
        raise ValueError(f"continuous batching runs greedy search (beam size 1), not beam size {options.beam_size}")
    if live_rows < 1:
        raise ValueError(f"live rows must be at least 1, not {live_rows}")
    stats = {} if stats is None else stats
    stats.update(groups=0, joins=0, waits=0, steps=0, row_steps=0)
    total, steps = len(sources), options.max_length - 1  # the language token was the first generated token
    if not total or steps <= 0:
        return [[] for _ in sources]
    eos, start_id = config.eos_token_id, config.decoder_start_token_id
    langs = np.broadcast_to(np.asarray(tgt_lang_id, dtype=np.int64), (total,)).copy()
    live_rows = min(live_rows, engine.capacity(options.max_length)[0])
    xp = getattr(engine, "xp", np)
    waiting = deque(sorted(range(total), key=lambda i: -len(sources[i])))
    generated = np.zeros((total, steps), dtype=np.int64)  # sentence s's t-th token (after the language)
    lengths = np.zeros(total, dtype=np.int64)
    groups: dict[int, list] = {}  # admission group -> [its encoding, its rows still decoding]
    state, rows, feed = None, None, None  # the decoder state, its rows' record, its next step's input (N,)
    pending: deque = deque()  # steps queued: (ids on their way, the rows they cover: the state's first ones then)
    blocked = False  # admission refused for want of room: tried again once a group is released

    if options.processes_scores:  # the processors need step t's ids on the host before step t + 1
        ahead = 0

        def queue(state, feed):
            logits = to_host(engine.step(None, state, feed))
            ids = logits.argmax(axis=-1)  # a row's </s> step: not recorded
            real = np.flatnonzero(rows.skip == 0)
            done = lengths[rows.sentence[real]]
            for length in np.unique(done):  # rows of one length together, as greedy_search's rows are
                at = real[done == length]
                sentences = rows.sentence[at]
                prefix = np.stack([np.full(len(at), start_id), langs[sentences]], axis=1)
                sequences = np.concatenate([prefix, generated[sentences, :length]], axis=1)  # (N, T)
                ids[at] = process_scores(logits[at], sequences, options).argmax(axis=-1)
            return Ready(ids)
    else:  # steps ahead, as greedy_search's
        ahead = AHEAD
        step_ahead = getattr(engine, "step_argmax_ahead", None) or (lambda *args: Ready(engine.step_argmax(*args)))

        def queue(state, feed):
            return step_ahead(None, state, feed)

    def admit(size: int) -> PoolFull | None:
        """The next `size` waiting sentences (fewer under max_group_tokens) into the state; the pool's refusal."""
        nonlocal state, rows, feed
        picked, longest = [], 0
        for i in islice(waiting, size):
            if picked and max_group_tokens and (len(picked) + 1) * max(longest, len(sources[i])) > max_group_tokens:
                break
            picked.append(i)
            longest = max(longest, len(sources[i]))
        try:
            encoded = engine.encode([sources[i] for i in picked])
        except PoolFull as error:
            return error
        try:
            new = engine.start(encoded, np.arange(len(picked)), options.max_length + 1)
        except PoolFull as error:
            engine.release_sources(encoded)
            return error
        group = stats["groups"]
        stats["groups"] += 1
        groups[group] = [encoded, len(picked)]
        for _ in picked:
            waiting.popleft()
        picked = np.array(picked)
        fresh = LiveRows.fresh(picked, group, langs[picked], steps)
        starts = np.full(len(picked), start_id)
        if state is None:
            state, rows, feed = new, fresh, starts
            return None
        try:
            engine.join(state, new)
        except BaseException:
            engine.release(new)
            raise
        stats["joins"] += 1
        rows = rows.joined(fresh)
        feed = xp.concatenate([xp.asarray(feed), xp.asarray(starts, dtype=feed.dtype)])
        return None

    def queue_step() -> None:
        nonlocal feed
        entry = queue(state, feed)
        pending.append((entry, state.n))
        stats["steps"] += 1
        stats["row_steps"] += state.n
        rows.room -= 1
        feed = entry.device  # the next step reads these ids where this one left them (the GPU's own array)
        due = np.flatnonzero(rows.force >= 0)
        if len(due):  # rows whose </s> step this was: their language next, written where the next step reads
            feed[xp.asarray(due)] = xp.asarray(rows.force[due], dtype=feed.dtype)
            rows.force[due] = -1

    def record(entry, width: int) -> np.ndarray:
        """A step's ids into the outputs; the rows that ended there."""
        ids = np.asarray(entry.fetch())  # (width,): the state's first rows when the step was queued
        warm = rows.skip[:width] > 0
        real = np.flatnonzero(~warm)
        rows.skip[:width][warm] -= 1
        sentences = rows.sentence[real]
        generated[sentences, lengths[sentences]] = ids[real]
        lengths[sentences] += 1
        return real[(ids[real] == eos) | (lengths[sentences] >= steps)]

    def drop(ended: np.ndarray) -> None:
        """Ended rows leave the state (steps queued after theirs follow), and their groups' sources go once empty."""
        nonlocal state, rows, feed, pending, blocked
        n = state.n
        going = np.zeros(n, dtype=bool)
        going[ended] = True
        keep = np.flatnonzero(~going)
        gone = rows.group[ended]
        if not len(keep):
            engine.release(state)
            state = rows = feed = None
            pending.clear()  # every row ended in the popped step, so it and those after it were n rows wide
        else:
            last_full = bool(pending) and pending[-1][1] == n
            if not last_full:  # the input lies in no queued step's ids (a join since): its rows, before select moves them
                feed = xp.asarray(feed)[xp.asarray(keep)]
            engine.select(state, keep)
            pending = deque((entry.subset(keep[keep < width]), int(np.count_nonzero(keep < width))) for entry, width in pending)
            if last_full:
                feed = pending[-1][0].device
            rows = rows.take(keep)
        for group, count in zip(*np.unique(gone, return_counts=True)):
            groups[group][1] -= count
            if not groups[group][1]:
                engine.release_sources(groups.pop(group)[0])
                blocked = False

    try:
        while waiting or state is not None:
            live = state.n if state is not None else 0
            if waiting and not blocked and live < REFILL * live_rows:
                size = min(live_rows - live, len(waiting))
                while (refused := admit(size)) is not None:
                    stats["waits"] += 1
                    if live:  # wait for a group to end and free its room
                        blocked = True
                        break
                    if size == 1:
                        raise refused
                    size //= 2  # nothing alive to wait for: fewer sentences
            while len(pending) <= ahead and rows.room.min() > 0:
                queue_step()
            entry, width = pending.popleft()
            ended = record(entry, width)
            if len(ended):
                drop(ended)
    finally:
        if state is not None:
            engine.release(state)
        for encoded, _ in groups.values():
            engine.release_sources(encoded)
    return [strip_output(generated[s, : lengths[s]].tolist(), eos) for s in range(total)]


def topk_desc(x, k: int):
    """The k largest values along the last axis of a 2-D array, sorted descending (ties: lower index first),
    and their indices. NumPy or CuPy arrays. Partition first on long NumPy rows: a full sort of
    beams x 256k candidates per step would dominate the reference engine's time."""
    if not isinstance(x, np.ndarray) or x.shape[-1] <= 4 * k:
        xp = np if isinstance(x, np.ndarray) else __import__("cupy")
        order = xp.argsort(-x, axis=-1, kind="stable")[:, :k] if xp is np else xp.argsort(-x, axis=-1)[:, :k]
        return xp.take_along_axis(x, order, axis=-1), order
    order = np.empty((x.shape[0], k), dtype=np.int64)
    for r, row in enumerate(x):
        kth = np.partition(row, row.size - k)[row.size - k]  # the k-th largest value
        above = np.flatnonzero(row > kth)
        picked = np.concatenate([above, np.flatnonzero(row == kth)[: k - above.size]])
        order[r] = picked[np.lexsort((picked, -row[picked]))]
    return np.take_along_axis(x, order, axis=-1), order


def to_host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


def beam_search(engine, encoded, batch: int, langs: np.ndarray, config: ModelConfig, options: DecodeOptions) -> list[list[int]]:
    xp = getattr(engine, "xp", np)  # the beam arrays live where the engine's top-k lands: no copies per step
    k, eos = options.beam_size, config.eos_token_id
    lp = options.length_penalty
    max_len = options.max_length + 1  # transformers' max_length: the decoder start plus max_new_tokens
    keep = 2 * k  # candidates kept per sentence: (one EOS token + 1) * beams, so K stay open when K end
    neg = xp.float32(NEG)
    # Per active sentence (axis 0). The search starts after the forced language token, whose log-prob is 0
    # (transformers' forced-BOS processor), with beam 0 live and the others at -1e9, as after its first step.
    run_seq = xp.full((batch, k, max_len), config.pad_token_id, dtype=xp.int64)
    run_seq[:, :, 0] = config.decoder_start_token_id
    run_seq[:, :, 1] = xp.asarray(langs)[:, None]
    run_score = xp.full((batch, k), neg, dtype=xp.float32)
    run_score[:, 0] = 0
    fin_seq = run_seq.copy()
    fin_score = xp.full((batch, k), neg, dtype=xp.float32)
    fin_done = xp.zeros((batch, k), dtype=bool)
    sentences = np.arange(batch)  # which input sentence each active sentence is
    results: dict[int, list[int]] = {}

    # One step ahead (greedy search runs AHEAD steps ahead): the next step is queued on the device's beams before the host looks at
    # which sentences are done; a done sentence's beams ran that step for nothing and leave before the next.
    later = getattr(engine, "fetch_later", None) or (lambda a: Ready(to_host(a)))
    with decoder(engine, encoded, np.repeat(np.arange(batch), k), max_len) as state:
        engine.step(encoded, state, np.full(batch * k, config.decoder_start_token_id), want_logits=False)
        tokens = np.repeat(langs, k)
        cur_len = 2
        if max_len <= cur_len:  # max_length 1: the language token alone
            return [[] for _ in range(batch)]
        candidates = None  # the next step's (row_lp, row_ids), queued ahead
        while True:
            n = len(sentences)
            if candidates is not None:
                row_lp, row_ids = candidates
            elif options.processes_scores:
                from .engine.reference import log_softmax

                log_probs = log_softmax(to_host(engine.step(encoded, state, tokens)))  # (n*K, V)
                sequences = to_host(run_seq[:, :, :cur_len]).reshape(n * k, cur_len)
                row_lp, row_ids = (xp.asarray(a) for a in topk_desc(process_scores(log_probs, sequences, options), keep))
            else:
                row_lp, row_ids = engine.step_topk(encoded, state, tokens, keep)  # (n*K, 2K) each, best first
            # candidates ordered as transformers' top-k over beam * V + token: by score, then beam, then token
            scores = row_lp.astype(xp.float32).reshape(n, k, keep) + run_score[:, :, None]
            top_score, top_index = topk_desc(scores.reshape(n, k * keep), keep)  # (n, 2K)
            top_beam = top_index // keep
            top_token = xp.take_along_axis(row_ids.reshape(n, k * keep), top_index, axis=1)
            top_seq = xp.take_along_axis(run_seq, top_beam[:, :, None], axis=1)  # (n, 2K, L)
            top_seq[:, :, cur_len] = top_token
            hits = (top_token == eos) | (cur_len + 1 >= max_len)  # (n, 2K): ended, or out of room

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
            merged_seq = xp.concatenate([fin_seq, top_seq], axis=1)
            merged_done = xp.concatenate([fin_done, just_done], axis=1)
            fin_score, best = topk_desc(merged_score, k)
            fin_seq = xp.take_along_axis(merged_seq, best[:, :, None], axis=1)
            fin_done = xp.take_along_axis(merged_done, best, axis=1)

            cur_len += 1
            # stop heuristic (early_stopping=False): can the best open beam, at this length, beat the worst finished?
            best_possible = run_score[:, :1] / xp.float32(float(cur_len - 1) ** lp)
            worst_finished = xp.where(fin_done, fin_score.min(axis=1, keepdims=True), neg)
            improvable = xp.any(best_possible > worst_finished, axis=1)
            finished_later = later(~improvable | hits.all(axis=1))
            candidates = None
            if cur_len < max_len:  # the next step, queued before the host knows who is done
                engine.reorder(state, (xp.arange(n)[:, None] * k + parents).reshape(-1))  # beams follow their parents
                tokens = run_seq[:, :, cur_len - 1].reshape(-1)
                if not options.processes_scores:
                    candidates = engine.step_topk(encoded, state, tokens, keep)
            finished = np.asarray(finished_later.fetch()) | (cur_len >= max_len)  # the one wait per step
            done = np.flatnonzero(finished)
            if len(done):
                # a finished hypothesis ends in </s> or fills max_len, so no padding follows its tokens
                for i, seq in zip(done, to_host(fin_seq[xp.asarray(done), 0, 2:])):
                    results[int(sentences[i])] = seq.tolist()
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
                run_seq, run_score = run_seq[live_x], run_score[live_x]
                fin_seq, fin_score, fin_done = fin_seq[live_x], fin_score[live_x], fin_done[live_x]
                sentences = sentences[live]
    return [strip_output(results[i], eos) for i in range(batch)]
