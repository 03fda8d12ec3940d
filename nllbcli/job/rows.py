"""Row preparation: each row's languages (its own fields, else --src and --tgt; a source of `auto` detected, per row
or per sentence: detect_sources), its text checked, split into sentences (unless --no-split) and tokenized, a sentence longer than the model's positions (or --max-input-length)
cut to fit (flagged); and, once translated, the sentences joined back into the row's translation. A row that
cannot be translated gets its reason in its Outcome and fails alone.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..errors import NllbError
from ..io import Added, Record
from ..io.records import target_column
from ..model.langid import AUTO, Detection, detect_languages
from ..model.langs import resolve_lang
from ..options import DecodeOptions, Job
from ..model.split import join_sentences, split_text
from .protect import Layout, check_spans, placeholders_error, protected_layout, restore

if TYPE_CHECKING:
    from ..model.search import Hypothesis
    from ..model.translator import Translator

SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair, alone: a JSON "\\ud800" escape, not a character
PIECE_CHARS = 16  # characters per position a long sentence keeps at first: the longest piece of NLLB's vocabulary


@dataclass
class Sentence:
    """One sentence of a row, on its way through the model."""

    row: int  # position of its row in the chunk
    ids: list[int]  # source ids, cut to the model's positions
    tgt: str  # target language
    place: tuple[int, int] = (0, 0)  # its row's number in the input and its own in the row: its random stream
    prefix: list[int] = field(default_factory=list)  # target pieces its translation starts with (--prefix-field)
    target: list[int] | None = None  # a score job's: the pieces of its given translation, scored (search.score_targets)

@dataclass
class Outcome:
    """What became of one row."""

    translation: str | None = None  # None when the row failed; the best, with several hypotheses
    error: str | None = None
    cut: bool = False  # a sentence was longer than the model's positions
    max_length: bool = False  # a sentence's translation stopped at its length limit (--max-length, --max-length-a/b)
    parts: list = field(default_factory=list)  # the sentences' hypotheses' texts (a list each), in order
    hypotheses: list[str] | None = None  # the row's translations, best first, with --num-hypotheses above 1
    log_prob: float | list[float] | None = None  # with --scores: the translation's (each hypothesis') score_of
    score: float | list[float] | None = None
    gaps: list | None = None  # the whitespace around the sentences (split_text), None without splitting
    tgt: str = ""
    targets: list[Outcome] | None = None  # several target languages (each_target): each one's, in the job's order
    tokens: int = 0  # tokens generated for the row's sentences (each one's best translation); scored, in a score job
    given: str | None = None  # a score job's: the row's translation, as given
    token_scores: list[float] | None = None  # a score job's, where asked: each token's log-probability, </s>'s last
    #                                          (a row of several sentences: theirs in turn)
    detected: tuple[str, float] | None = None  # a row of source auto: its detected language(s) and the confidence
    #                                            (detected_value)
    layout: Layout | None = None  # a protected row's (--protect): its spans and how its sentences fit between them
    src: str = ""  # the row's source language
    flags: list[str] = field(default_factory=list)  # the flags besides cut and max_length (flags.flag_rows)
    token_log_prob: float | None = None  # where scores are computed: the best translation's log-probability per
    #                                      generated token (its sentences' pieces and </s> each)
    retried: bool = False  # translated again for its flags (--retry-flagged), the better kept (flags.better_of)


# a status names its flags in this order
STATUS_ORDER = ("cut", "max_length", "repetition", "wrong_language", "length_ratio", "low_score", "copy")


def flag_names(outcome: Outcome) -> list[str]:
    """Every flag a row carries, in STATUS_ORDER: cut and max_length, then those flags.flag_rows gave it."""
    have = {"cut": outcome.cut, "max_length": outcome.max_length, **dict.fromkeys(outcome.flags, True)}
    return [name for name in STATUS_ORDER if have.get(name)]


def status_of(outcome: Outcome) -> str:
    """A written row's status (--status-field): ok, or what flagged it, comma-joined (cut,max_length): cut (a
    sentence was longer than the model's positions and was cut to fit), max_length (a translation stopped at
    --max-length), the flags the job asks for (flags.py: repetition, wrong_language, length_ratio, low_score,
    copy), and retried where --retry-flagged translated it again."""
    return ",".join(flag_names(outcome) + (["retried"] if outcome.retried else [])) or "ok"


def added_values(added: Added, outcome: Outcome) -> dict | None:
    """A row's added fields (Added) by name, as its writer takes them. A failed row's: None (it is left out),
    or where failed rows are kept (Added.error) its reason, the other fields null."""
    if outcome.translation is None:
        return None if added.error is None else {**dict.fromkeys(added.names), added.error: outcome.error}
    if added.targets:
        single = added.single  # field by field, each the targets' (Added.options' order)
        each = [(copy.tgt, added_values(single, copy)) for copy in outcome.targets]
        values = {target_column(name, code): values[name] for name in single.names for code, values in each}
    else:
        values = {}
        if added.translation is not None:
            values[added.translation] = outcome.hypotheses if added.hypotheses > 1 else outcome.translation
        if added.status is not None:
            values[added.status] = status_of(outcome)
        if added.score is not None:
            values[added.score] = outcome.score
        if added.log_prob is not None:
            values[added.log_prob] = outcome.log_prob
        if added.token_scores is not None:
            values[added.token_scores] = outcome.token_scores
    if added.detected is not None:
        values[added.detected] = detected_value(outcome)
    if added.error is not None:
        values[added.error] = None
    return values


def detected_value(outcome: Outcome) -> dict | None:
    """A row's --detected-field: {"lang": its detected code, "confidence": the detector's}, "lang" naming each
    language in the order its sentences take them where they differ (eng_Latn,fra_Latn); null for a row whose
    source language was not detected (given by --src or its own field)."""
    if outcome.detected is None:
        return None
    lang, confidence = outcome.detected
    return {"lang": lang, "confidence": round(confidence, 4)}


def each_target(records: list[Record], job: Job) -> list[Record]:
    """The rows as the model translates them: with several target languages (--tgt a,b), each row once per
    target, in the job's order (a row's copies together), each copy given its target; else the rows."""
    if not job.targets:
        return records
    return [replace(record, tgt=code) for record in records for code in job.targets]


def gather_targets(outcomes: list[Outcome], job: Job) -> list[Outcome]:
    """Each row's Outcome from those of its copies (each_target): the row fails with its first copy that failed
    (a row is written whole or not at all), its flags are any copy's, and `targets` holds the copies'."""
    if not job.targets:
        return outcomes
    count = len(job.targets)
    rows = []
    for start in range(0, len(outcomes), count):
        copies = outcomes[start:start + count]
        error = next((o.error for o in copies if o.error is not None), None)
        rows.append(Outcome(None if error else copies[0].translation, error, any(o.cut for o in copies),
                            any(o.max_length for o in copies), [part for o in copies for part in o.parts],
                            targets=copies, tokens=sum(o.tokens for o in copies), detected=copies[0].detected,
                            flags=list(dict.fromkeys(name for o in copies for name in o.flags)),
                            retried=any(o.retried for o in copies)))
    return rows


def written_rows(records: list[Record], outcomes: list[Outcome], added: Added) -> tuple[list[Record], list[dict | None]]:
    """The rows a writer gets (each row, or with several targets as rows each row once per target) and their
    added fields (added_values; None for a failed row, unless failed rows are kept)."""
    if added.target is None:
        return records, [added_values(added, o) for o in outcomes]
    rows, values = [], []
    one = replace(added, target=None)  # a copy's fields: the translation's, and the error's where kept
    for record, outcome in zip(records, outcomes):
        for copy in outcome.targets:
            rows.append(record)
            copy_values = added_values(one, outcome if outcome.error is not None else copy)
            values.append(None if copy_values is None else {added.target: copy.tgt, **copy_values})
    return rows, values


def row_languages(record: Record, job: Job, known: tuple[str, ...]) -> tuple[str, str]:
    """The row's source and target language: its own fields where it has them, else --src and --tgt; the target
    the job gives a copy of the row (each_target) over both. A source of `auto` (AUTO) is left for detect_sources."""
    languages = []
    for name, default, option in ((job.src_field, job.src, "--src"), (job.tgt_field, job.tgt, "--tgt")):
        if option == "--tgt" and record.tgt is not None:
            languages.append(record.tgt)
            continue
        value = record.fields.get(name) if name else None
        if value is None or value == "":  # null, or empty (a CSV row's empty field): the row names none
            if default is None:
                raise NllbError(f"{record.where}: no {name!r} field and no {option} to fall back on.")
            languages.append(default)
        elif not isinstance(value, str):
            raise NllbError(f"{record.where}: field {name!r} is {type(value).__name__}, not a language code.")
        elif option == "--src" and value.strip().lower() == AUTO:
            languages.append(AUTO)
        else:
            try:
                languages.append(resolve_lang(value, known))
            except NllbError as error:
                raise NllbError(f"{record.where}: field {name!r}: {error}") from None
    return languages[0], languages[1]


def check_added_fields(record: Record, job: Job) -> None:
    """Refuse a row that has a field of the name the translation (or the status, or a score) would be written
    to: it would be lost."""
    for option, name in job.added.options:
        if name in record.fields:
            raise NllbError(f"{record.where}: the row has a field {name!r} already, which {option} would replace: "
                            f"name another with {option}, or pass --overwrite-field to replace it.")


def row_prefix(tokenizer, record: Record, field: str, tgt: str) -> list[int]:
    """The target pieces of a row's prefix field (none where the row lacks it, or it is empty or null)."""
    value = record.fields.get(field)
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise NllbError(f"{record.where}: field {field!r} is {type(value).__name__}, not a string to start the "
                        "translation with.")
    check_text(record, field, value)
    try:
        return tokenizer.encode(value, tgt)[1:-1]  # without the language token and </s>
    except Exception as error:  # noqa: BLE001 - sentencepiece's errors are no narrower than that
        raise NllbError(f"{record.where}: the tokenizer cannot take field {field!r}: {tokenizer_reason(error)}") from None


def tokenizer_reason(error: Exception) -> str:
    """Why the tokenizer refused a text: its error's first line (pybind11's go on for many), else its kind."""
    return next(iter(str(error).strip().splitlines()), type(error).__name__)


def check_text(record: Record, field: str, text: str) -> None:
    """Refuse text of the row's field that is not Unicode characters throughout, naming the first offender."""
    if (bad := SURROGATE.search(text)) is not None:
        raise NllbError(f"{record.where}: field {field!r} holds a lone surrogate (\\u{ord(bad.group()):04x} at character "
                        f"{bad.start() + 1}), half of a UTF-16 pair, which is not text.")


def prepare_records(translator: Translator, records: list[Record], job: Job) -> tuple[list[Outcome], list[Sentence]]:
    """A chunk's rows split into sentences and tokenized (no model, no progress: it may run on the reader's
    thread). With --on-error fail the first bad row raises NllbError. The chunk's texts go to the tokenizer
    together (encode_many) where it has that: sentencepiece then tokenizes on its own threads, without the GIL."""
    tokenizer = translator.tokenizer
    limit = min(translator.config.max_position_embeddings, job.max_input_length or sys.maxsize)
    known = tuple(tokenizer.lang_codes)
    outcomes = [Outcome(tgt=record.tgt or "") for record in records]  # a copy's target, failed or not (each_target)
    rows: list[tuple[int, list[str], list[str], str]] = []  # (row, its sentences, their sources, tgt) of good rows
    prefixes: dict[int, list[int]] = {}  # a row's prefix's pieces (--prefix-field), where it has one
    scored: dict[int, list[str]] = {}  # a score job's: each row's given translations, a sentence each
    for position, (record, outcome) in enumerate(zip(records, outcomes)):
        try:
            if record.error:
                raise NllbError(record.error)
            if record.batch is None and not job.overwrite_field and job.output_format != "text":
                check_added_fields(record, job)
            src, tgt = row_languages(record, job, known)
            outcome.src, outcome.tgt = src, tgt
            check_text(record, job.field, record.text)
            if job.task == "score":
                row_texts, row_targets = scoring_pairs(record, job)
                outcome.given = record.fields[job.target_field]
                scored[position] = row_targets
            elif job.protect or record.protect:
                row_texts, outcome.layout = protected_layout(record.text, job.split)
            elif job.split:
                row_texts, outcome.gaps = split_text(record.text)
            else:
                row_texts = [record.text] if record.text.strip() else []
            if job.prefix_field is not None:
                prefix = row_prefix(tokenizer, record, job.prefix_field, tgt)
                if prefix:
                    prefixes[position] = prefix
            rows.append((position, row_texts, [src] * len(row_texts), tgt))
        except NllbError as error:
            outcome.error = str(error)
    detect_sources(records, outcomes, rows, known)
    texts: list[tuple[int, str, str, str]] = []  # (row, text, src, tgt) of every sentence
    numbers: list[int] = []  # each sentence's number in its row
    targets: list[tuple[str, str]] = []  # a score job's: each sentence's given translation and its language
    for position, row_texts, sources, tgt in rows:
        if outcomes[position].error is None:
            texts += [(position, bound_text(tokenizer, text, src, limit), src, tgt)
                      for text, src in zip(row_texts, sources)]
            numbers += range(len(row_texts))
            targets += [(text, tgt) for text in scored.get(position, [])]
    encoded = encode_texts(tokenizer, [(text, src) for _, text, src, _ in texts])
    given = encode_texts(tokenizer, targets) if job.task == "score" else [None] * len(texts)
    positions = translator.config.max_position_embeddings
    sentences: list[Sentence] = []
    for (position, _, _, tgt), number, ids, target in zip(texts, numbers, encoded, given):
        outcome = outcomes[position]
        if outcome.error is not None:
            continue
        for tokens, what in ((ids, "this text"), (target, f"field {job.target_field!r}")):
            if isinstance(tokens, Exception):
                outcome.error = f"{records[position].where}: the tokenizer cannot take {what}: {tokenizer_reason(tokens)}"
        if target is not None and outcome.error is None and len(target) > positions:
            outcome.error = (f"{records[position].where}: field {job.target_field!r} is {len(target) - 2:,} tokens "
                             f"long, and the model's {positions:,} positions score {positions - 2:,} at most.")
        if outcome.error is not None:
            continue
        outcome.cut |= len(ids) > limit
        prefix = prefixes.get(position, []) if number == 0 else []  # the row's translation starts with it
        sentences.append(Sentence(position, cut_source(ids, limit), tgt, (records[position].index, number), prefix,
                                  None if target is None else target[1:-1]))
    if job.on_error == "fail":
        first = next((o.error for o in outcomes if o.error is not None), None)
        if first is not None:
            raise NllbError(first)
    for outcome in outcomes:
        outcome.parts = []
    return outcomes, [s for s in sentences if outcomes[s.row].error is None]


def encode_texts(tokenizer, texts: list[tuple[str, str]]) -> list[list[int] | Exception]:
    """Each (text, language)'s ids, or the tokenizer's error, in one call where the tokenizer has encode_many
    (sentencepiece then tokenizes on its own threads, without the GIL)."""
    many = getattr(tokenizer, "encode_many", None)
    if many is not None:
        return many([text for text, _ in texts], [lang for _, lang in texts])
    encoded: list[list[int] | Exception] = []
    for text, lang in texts:
        try:
            encoded.append(tokenizer.encode(text, lang))
        except Exception as error:  # noqa: BLE001 - sentencepiece's errors are no narrower than that
            encoded.append(error)
    return encoded


def scoring_pairs(record: Record, job: Job) -> tuple[list[str], list[str]]:
    """A score job's row as (source, translation) pairs: the row whole, or with --split each sentence of its
    text with the translation's sentence of the same number (the row fails where they have not as many)."""
    target = record.fields.get(job.target_field)
    if job.target_field not in record.fields:
        raise NllbError(f"{record.where}: no field {job.target_field!r} with the translation to score (fields: "
                        f"{', '.join(map(str, record.fields)) or 'none'}); name it with --target-field.")
    if not isinstance(target, str):
        kind = "null" if target is None else type(target).__name__
        raise NllbError(f"{record.where}: field {job.target_field!r} is {kind}, not a translation to score.")
    check_text(record, job.target_field, target)
    if not job.split:
        return [record.text], [target]
    sources, targets = split_text(record.text)[0], split_text(target)[0]
    if len(sources) != len(targets):
        raise NllbError(f"{record.where}: the text has {len(sources)} sentence(s) and its translation {len(targets)}: "
                        "score the row whole (without --split).")
    return sources, targets


def detect_sources(records: list[Record], outcomes: list[Outcome], rows: list[tuple[int, list[str], list[str], str]],
                   known: tuple[str, ...]) -> None:
    """Each sentence's source language where its row's is auto (`rows`: each good row's position, sentences, their
    sources, set here in place, and target), detected for the chunk at once: each sentence, and where one of a row
    of several is not detected, the row whole (sentence_languages). The row's Outcome gets what was detected
    (Outcome.detected); a row whose language cannot be detected, or is one the model does not know, fails naming
    the detector's guess."""
    wanted = [(position, texts, sources) for position, texts, sources, _ in rows if AUTO in sources and texts]
    if not wanted:
        return
    asked = list(dict.fromkeys(text for _, texts, _ in wanted for text in texts))  # a row's copies (--tgt a,b) once
    found = dict(zip(asked, detect_languages(asked, known)))
    parts = [[found[text] for text in texts] for _, texts, _ in wanted]
    again = [n for n, ((_, texts, _), each) in enumerate(zip(wanted, parts))
             if len(texts) > 1 and any(d.code is None for d in each)]
    whole = dict(zip(again, detect_languages([records[wanted[n][0]].text for n in again], known)))
    for n, ((position, texts, sources), each) in enumerate(zip(wanted, parts)):
        row = whole.get(n, each[0])
        languages = sentence_languages(row, each)
        outcome = outcomes[position]
        if languages is None:
            outcome.error = f"{records[position].where}: {row.reason}."
            continue
        sources[:] = languages
        used = [d.confidence for d in (*each, row) if d.code is not None and d.code in languages]
        outcome.detected = (",".join(dict.fromkeys(languages)), min(used))


def sentence_languages(row: Detection, sentences: list[Detection]) -> list[str] | None:
    """Each sentence's source language in a row whose language is detected (`sentences`: its sentences'
    Detections; `row`: the whole row's where one of several is not detected, else the first sentence's): a
    sentence's own where it is detected, else the row's. None where a sentence has neither: the row fails."""
    languages = [found.code or row.code for found in sentences]
    return None if None in languages else languages


def join_outcomes(outcomes: list[Outcome], sentences: list[Sentence], texts: dict[int, list[str]],
                  found: dict[int, list[Hypothesis]], decode: DecodeOptions, job: Job | None = None) -> None:
    """Each row's translation (its hypotheses, their scores) from its sentences' (texts[n], found[n]: sentence
    n's hypotheses' texts and Hypotheses; absent where it failed). A row's k-th hypothesis joins its sentences'
    k-th. A score job's row gets its given translation's scores (score_of; a row of several sentences: the sum
    of their log-probabilities, the mean of their scores, as beam search's) and its tokens'."""
    rows: dict[int, list[list[Hypothesis]]] = {}
    for number, sentence in enumerate(sentences):
        outcomes[sentence.row].parts.append(texts.get(number))
        rows.setdefault(sentence.row, []).append(found.get(number))
    for row, outcome in enumerate(outcomes):
        if outcome.error is not None:
            continue
        if job is not None and job.task == "score":
            scored = [hypotheses[0] for hypotheses in rows.get(row, [])]
            outcome.translation = outcome.given  # the row's translation, as given: its scores are written
            outcome.log_prob, outcome.score = score_of(scored, averaged=True)
            outcome.token_log_prob = outcome.log_prob / max(1, sum(len(h.ids) + 1 for h in scored))  # low_score's
            if job.token_scores_field is not None:
                outcome.token_scores = [lp for h in scored for lp in h.token_log_probs]
            continue
        joined = []
        for k in range(decode.num_hypotheses):
            parts = [texts[k] for texts in outcome.parts]
            if outcome.layout is not None:
                joined.append(restore(outcome.layout, parts, outcome.tgt))
            elif outcome.gaps is None:
                joined.append(parts[0] if parts else "")
            else:
                joined.append(join_sentences(parts, outcome.gaps, outcome.tgt))
        outcome.translation = joined[0]
        if decode.num_hypotheses > 1:
            outcome.hypotheses = joined
        if decode.scores and rows.get(row):
            best = [hypotheses[0] for hypotheses in rows[row]]
            outcome.token_log_prob = sum(h.log_prob for h in best) / sum(len(h.ids) + 1 for h in best)
        if decode.scores:
            scored = [score_of([hypotheses[k] for hypotheses in rows.get(row, [])], decode.beam_size > 1)
                      for k in range(decode.num_hypotheses)]
            if decode.num_hypotheses > 1:
                outcome.log_prob, outcome.score = [lp for lp, _ in scored], [sc for _, sc in scored]
            else:
                (outcome.log_prob, outcome.score), = scored


def check_placeholders(records: list[Record], outcomes: list[Outcome], job: Job) -> None:
    """Fail each protected row whose translation (any of its hypotheses) does not hold its source's spans exactly
    (protect.check_spans): it is never written with a placeholder lost or added. With --on-error fail the first
    such row raises NllbError."""
    for record, outcome in zip(records, outcomes):
        if outcome.layout is None or outcome.error is not None:
            continue
        for text in outcome.hypotheses or [outcome.translation]:
            reason = check_spans(outcome.layout.source, text)
            if reason is not None:
                message = placeholders_error(record.where, reason)
                if job.on_error == "fail":
                    raise NllbError(message)
                outcome.translation, outcome.hypotheses, outcome.error = None, None, message
                break


def score_of(hypotheses: list[Hypothesis], averaged: bool) -> tuple[float, float]:
    """A row's (log_prob, score) from its sentences' hypotheses: the sum of their log-probabilities, and the
    score of a row of one sentence; of several, the mean of theirs where scores are `averaged` (beam search's, a
    score job's), else the sum (greedy search's score is the log-probability). A row without a sentence (empty
    text) has 0 and 0."""
    log_prob = float(sum(h.log_prob for h in hypotheses))
    if len(hypotheses) == 1:
        return log_prob, float(hypotheses[0].score)
    if not averaged or not hypotheses:
        return log_prob, log_prob
    return log_prob, float(sum(h.score for h in hypotheses) / len(hypotheses))


def bound_text(tokenizer, text: str, src: str, limit: int) -> str:
    """The sentence, or a prefix of it that gives the same ids once cut to the model's `limit` positions, so that a
    huge sentence costs the tokenizer (and memory) what its first positions need, not its length (a 50 MB sentence
    takes 2.3 GB to tokenize whole). The prefix ends before a space, where the tokenizer's pieces part
    (words_apart), and is kept only when it gives at least 2 pieces more than the positions take (its last piece
    may be a lone "▁" its end adds): each piece the cut keeps is then the whole text's. A prefix of 16 characters
    a position is tried first, then ones 4 times longer, while they give too few pieces (spaces in runs, which
    the tokenizer folds into one)."""
    size = limit * PIECE_CHARS
    if len(text) <= size or not getattr(tokenizer, "words_apart", False):
        return text
    while (end := text.find(" ", size)) >= 0:
        prefix = text[:end]
        try:
            if len(tokenizer.encode(prefix, src)) > limit + 1:
                return prefix
        except Exception:  # noqa: BLE001 - the whole text goes to the tokenizer, which names what it cannot take
            return text
        size = end * 4
    return text


def cut_source(ids: list[int], max_tokens: int) -> list[int]:
    """Keep a source within the model's positions: its first max-1 tokens (the language token first), then </s>."""
    if len(ids) <= max_tokens:
        return ids
    return ids[: max_tokens - 1] + ids[-1:]
