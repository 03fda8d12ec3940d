"""The FLORES-200 language codes NLLB knows, and how the codes users type resolve to them.

NLLB names a language by ISO 639-3 code and ISO 15924 script (`eng_Latn`). Users type ISO 639-1 (`en`),
ISO 639-2/3 (`eng`, `fre`) and BCP-47 tags (`en-US`, `zh-Hant-TW`, `pt-BR`). `resolve_lang` parses them with
langcodes (which also knows deprecated and bibliographic codes such as `iw`, `in`, `fre`, and CLDR's likely
scripts: `zh` is written in Hans, `zh-TW` and `yue` in Hant, `sr` in Cyrl), maps macrolanguages to the
individual language NLLB was trained on (`ar` -> `arb`, `fa` -> `pes`, `sw` -> `swh`, ...), then picks the
model's code for that language in the tag's script, or the likely one when the tag names none.
"""

from __future__ import annotations

import difflib
from functools import lru_cache

from ..errors import NllbError

# NLLB-200's 202 language tokens in the order their ids follow the sentencepiece vocabulary
# (fairseq's and transformers' FAIRSEQ_LANGUAGE_CODES order: ids are assigned by position, so never sort it).
FLORES_200_CODES: tuple[str, ...] = (
    'ace_Arab', 'ace_Latn', 'acm_Arab', 'acq_Arab', 'aeb_Arab', 'afr_Latn', 'ajp_Arab', 'aka_Latn',
    'amh_Ethi', 'apc_Arab', 'arb_Arab', 'ars_Arab', 'ary_Arab', 'arz_Arab', 'asm_Beng', 'ast_Latn',
    'awa_Deva', 'ayr_Latn', 'azb_Arab', 'azj_Latn', 'bak_Cyrl', 'bam_Latn', 'ban_Latn', 'bel_Cyrl',
    'bem_Latn', 'ben_Beng', 'bho_Deva', 'bjn_Arab', 'bjn_Latn', 'bod_Tibt', 'bos_Latn', 'bug_Latn',
    'bul_Cyrl', 'cat_Latn', 'ceb_Latn', 'ces_Latn', 'cjk_Latn', 'ckb_Arab', 'crh_Latn', 'cym_Latn',
    'dan_Latn', 'deu_Latn', 'dik_Latn', 'dyu_Latn', 'dzo_Tibt', 'ell_Grek', 'eng_Latn', 'epo_Latn',
    'est_Latn', 'eus_Latn', 'ewe_Latn', 'fao_Latn', 'pes_Arab', 'fij_Latn', 'fin_Latn', 'fon_Latn',
    'fra_Latn', 'fur_Latn', 'fuv_Latn', 'gla_Latn', 'gle_Latn', 'glg_Latn', 'grn_Latn', 'guj_Gujr',
    'hat_Latn', 'hau_Latn', 'heb_Hebr', 'hin_Deva', 'hne_Deva', 'hrv_Latn', 'hun_Latn', 'hye_Armn',
    'ibo_Latn', 'ilo_Latn', 'ind_Latn', 'isl_Latn', 'ita_Latn', 'jav_Latn', 'jpn_Jpan', 'kab_Latn',
    'kac_Latn', 'kam_Latn', 'kan_Knda', 'kas_Arab', 'kas_Deva', 'kat_Geor', 'knc_Arab', 'knc_Latn',
    'kaz_Cyrl', 'kbp_Latn', 'kea_Latn', 'khm_Khmr', 'kik_Latn', 'kin_Latn', 'kir_Cyrl', 'kmb_Latn',
    'kon_Latn', 'kor_Hang', 'kmr_Latn', 'lao_Laoo', 'lvs_Latn', 'lij_Latn', 'lim_Latn', 'lin_Latn',
    'lit_Latn', 'lmo_Latn', 'ltg_Latn', 'ltz_Latn', 'lua_Latn', 'lug_Latn', 'luo_Latn', 'lus_Latn',
    'mag_Deva', 'mai_Deva', 'mal_Mlym', 'mar_Deva', 'min_Latn', 'mkd_Cyrl', 'plt_Latn', 'mlt_Latn',
    'mni_Beng', 'khk_Cyrl', 'mos_Latn', 'mri_Latn', 'zsm_Latn', 'mya_Mymr', 'nld_Latn', 'nno_Latn',
    'nob_Latn', 'npi_Deva', 'nso_Latn', 'nus_Latn', 'nya_Latn', 'oci_Latn', 'gaz_Latn', 'ory_Orya',
    'pag_Latn', 'pan_Guru', 'pap_Latn', 'pol_Latn', 'por_Latn', 'prs_Arab', 'pbt_Arab', 'quy_Latn',
    'ron_Latn', 'run_Latn', 'rus_Cyrl', 'sag_Latn', 'san_Deva', 'sat_Beng', 'scn_Latn', 'shn_Mymr',
    'sin_Sinh', 'slk_Latn', 'slv_Latn', 'smo_Latn', 'sna_Latn', 'snd_Arab', 'som_Latn', 'sot_Latn',
    'spa_Latn', 'als_Latn', 'srd_Latn', 'srp_Cyrl', 'ssw_Latn', 'sun_Latn', 'swe_Latn', 'swh_Latn',
    'szl_Latn', 'tam_Taml', 'tat_Cyrl', 'tel_Telu', 'tgk_Cyrl', 'tgl_Latn', 'tha_Thai', 'tir_Ethi',
    'taq_Latn', 'taq_Tfng', 'tpi_Latn', 'tsn_Latn', 'tso_Latn', 'tuk_Latn', 'tum_Latn', 'tur_Latn',
    'twi_Latn', 'tzm_Tfng', 'uig_Arab', 'ukr_Cyrl', 'umb_Latn', 'urd_Arab', 'uzn_Latn', 'vec_Latn',
    'vie_Latn', 'war_Latn', 'wol_Latn', 'xho_Latn', 'ydd_Hebr', 'yor_Latn', 'yue_Hant', 'zho_Hans',
    'zho_Hant', 'zul_Latn',
)


# M2M-100's 100 language tokens (`__en__`, ...) in id order (transformers' FAIRSEQ_LANGUAGE_CODES["m2m100"]):
# ISO 639-1 codes where the language has one, else ISO 639-3 (ast, ceb, ilo); `ns` is fairseq's Northern Sotho.
M2M100_CODES: tuple[str, ...] = (
    "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da", "de", "el",
    "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr", "ht", "hu", "hy",
    "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg",
    "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sd",
    "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw", "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi",
    "wo", "xh", "yi", "yo", "zh", "zu",
)


# codes that name their language otherwise than by ISO 639 or FLORES-200: fairseq's `ns` for Northern Sotho
NAMED_AS = {"ns": "nso"}


def language_name(code: str) -> str:
    """The English name of a model's language code, from the CLDR data that langcodes reads from the
    language_data package (no network): `fra_Latn` French, `zho_Hant` Chinese (Traditional); the script is
    named where it is not the language's usual one."""
    import langcodes

    return langcodes.Language.get(NAMED_AS.get(code, code).replace("_", "-")).display_name()


def matching_codes(known: list[str] | tuple[str, ...], filters: tuple[str, ...] | list[str]) -> list[str]:
    """The codes, in the model's order, whose code or name holds one of `filters` (any case), or that one of
    them resolves to (`zh-TW`: zho_Hant); all of them without filters. Raises NllbError when none matches."""
    if not filters:
        return list(known)
    wanted = [f.strip().lower() for f in filters]
    resolved = set()
    for typed in filters:
        try:
            resolved.add(resolve_lang(typed, known))
        except NllbError:
            pass
    found = [code for code in known if code in resolved
             or any(w in code.lower() or w in language_name(code).lower() for w in wanted)]
    if not found:
        said = " or ".join(repr(f) for f in filters)
        raise NllbError(f"no language of the model matches {said}: `nllb langs` lists them all")
    return found


def by_name(name: str, known: list[str] | tuple[str, ...]) -> list[str]:
    """The codes whose language's English name (language_name: "French", "Chinese (Traditional)") is `name`, in
    any case, with or without its part in parentheses."""
    wanted = " ".join(name.split()).lower()
    if len(wanted) < 3:
        return []
    found = []
    for code in known:
        try:
            full = language_name(code).lower()
        except (LookupError, ValueError):
            continue
        if wanted in (full, full.split(" (")[0]):
            found.append(code)
    return found


def is_flores(known) -> bool:
    """Whether a model names its languages FLORES-200 style (NLLB: eng_Latn) rather than M2M-100 style (en)."""
    return not known or "_" in next(iter(known))


def closest_codes(code: str, known: list[str] | tuple[str, ...], n: int = 3) -> list[str]:
    """The known codes nearest to `code`: same language part first, then by spelling."""
    prefix = code.split("_")[0].lower()
    same_language = [c for c in known if c.split("_")[0].lower() == prefix]
    if not same_language and len(prefix) == 2:  # a two-letter ISO 639-1 code often begins the three-letter one
        same_language = [c for c in known if c.lower().startswith(prefix)]
    by_spelling = difflib.get_close_matches(code, known, n=n, cutoff=0.5)
    by_spelling_ci = difflib.get_close_matches(code.lower(), [c.lower() for c in known], n=n, cutoff=0.5)
    lowered = {c.lower(): c for c in known}
    return list(dict.fromkeys(same_language + by_spelling + [lowered[c] for c in by_spelling_ci]))[:n]


def check_lang(code: str, known: list[str] | tuple[str, ...]) -> str:
    """Return `code` if the model knows it, or the one code whose language it names (english, Chinese
    (Traditional): what `nllb langs` shows); else raise with the closest codes it does know."""
    if code in known:
        return code
    named = by_name(code, known)
    if len(named) == 1:
        return named[0]
    if named:
        raise NllbError(f"{code!r} names {len(named)} of the model's languages: {', '.join(named)}: give one code.")
    near = closest_codes(code, known)
    hint = f" Did you mean {' or '.join(near)}?" if near else " Run `nllb langs` to list them."
    family, example = ("FLORES-200", "eng_Latn") if is_flores(known) else ("M2M-100", "en")
    raise NllbError(f"unknown language code {code!r}: the model knows {len(known)} {family} codes such as {example}.{hint}")


# ISO 639-3 codes (as langcodes gives them) whose NLLB code is another one: macrolanguages NLLB trained as one of
# their individual languages, and individual codes NLLB files under the macrolanguage or another code.
NLLB_LANGUAGE = {
    "ara": "arb",  # Arabic: Modern Standard Arabic (the dialects have their own codes: arz, ary, apc, ...)
    "fas": "pes",  # Persian: Iranian Persian (Dari is prs, and fa-AF resolves to it)
    "swa": "swh",  # Swahili
    "nep": "npi",  # Nepali
    "msa": "zsm",  # Malay: Standard Malay
    "mon": "khk",  # Mongolian: Halh Mongolian
    "lav": "lvs",  # Latvian: Standard Latvian
    "ekk": "est",  # Standard Estonian: NLLB files it under the macrolanguage est
    "uzb": "uzn",  # Uzbek: Northern Uzbek
    "sqi": "als",  # Albanian: Tosk Albanian
    "orm": "gaz",  # Oromo: West Central Oromo
    "mlg": "plt",  # Malagasy: Plateau Malagasy
    "pus": "pbt",  # Pashto: Southern Pashto
    "que": "quy",  # Quechua: Ayacucho Quechua
    "yid": "ydd",  # Yiddish: Eastern Yiddish
    "aym": "ayr",  # Aymara: Central Aymara
    "kau": "knc",  # Kanuri: Central Kanuri
    "ful": "fuv",  # Fulah: Nigerian Fulfulde
    "nor": "nob",  # Norwegian: Bokmal
    "fil": "tgl",  # Filipino (langcodes' name for tl/tgl): NLLB's Tagalog
    "cmn": "zho",  # Mandarin: NLLB's Chinese
    "ori": "ory",  # Oriya: Odia
    "din": "dik",  # Dinka: Southwestern Dinka
    "aze": "azj",  # Azerbaijani: North Azerbaijani in Latin script; in Arabic script South Azerbaijani (azb)
    "kur": "kmr",  # Kurdish: Kurmanji in Latin script; in Arabic script Sorani (ckb)
}
BY_SCRIPT = {("azj", "Arab"): "azb", ("kmr", "Arab"): "ckb"}  # the script decides between two languages
BY_REGION = {("pes", "AF"): "prs"}  # Persian of Afghanistan is Dari


def resolve_lang(code: str, known: list[str] | tuple[str, ...]) -> str:
    """The model's code for a code a user typed: FLORES-200, ISO 639-1/2/3 or a BCP-47 tag.

    Raises NllbError naming the closest codes when the code is unknown, or names every candidate when the
    model has the language only in another script (`sr-Latn`: NLLB has srp_Cyrl alone)."""
    return _resolve(code.strip(), tuple(known))


def resolve_targets(codes, known: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Several target languages (a sequence, or codes with commas between) as the model's codes, in order.
    Raises NllbError for an unknown code, or for two that are one language (fr and fra_Latn)."""
    given = [code.strip() for code in codes.split(",")] if isinstance(codes, str) else list(codes)
    resolved: dict[str, str] = {}
    for value in given:
        code = resolve_lang(value, known)
        if code in resolved:
            raise NllbError(f"{resolved[code]} and {value} are both {code}: name each target language once.")
        resolved[code] = value
    return tuple(resolved)


@lru_cache(maxsize=4096)
def _resolve(code: str, known: tuple[str, ...]) -> str:
    if code in known:
        return code
    if not is_flores(known):
        return _resolve_m2m(code, known)
    folded = {c.lower(): c for c in known}
    if code.lower().replace("-", "_") in folded:  # eng_latn, eng-Latn
        return folded[code.lower().replace("-", "_")]
    import langcodes

    try:
        tag = langcodes.Language.get(code.replace("_", "-"))
        alpha3 = tag.to_alpha3()
    except (LookupError, ValueError):  # langcodes' LanguageTagError is a ValueError
        return check_lang(code, known)
    likely = tag.maximize()
    script = tag.script or likely.script
    language = NLLB_LANGUAGE.get(alpha3, alpha3)
    language = BY_SCRIPT.get((language, script), language)
    language = BY_REGION.get((language, likely.territory), language)
    candidates = [c for c in known if c.split("_")[0] == language]
    if not candidates:
        return check_lang(code, known)
    matching = [c for c in candidates if c.split("_")[-1] == script]
    if matching:
        return matching[0]
    if len(candidates) == 1 and not tag.script:
        return candidates[0]  # the one script the model has for it, when the tag asked for none
    names = " or ".join(candidates)
    raise NllbError(f"language code {code!r} asks for {language} in {script} script, which the model does not have: use {names}.")


# ISO 639-3 codes whose M2M-100 code is that of another language: the individual languages NLLB files a
# macrolanguage under (NLLB_LANGUAGE, the other way round: arb -> ara -> ar), and fairseq's own choices.
M2M_LANGUAGE = {
    **{individual: macro for macro, individual in NLLB_LANGUAGE.items() if macro != "cmn"},  # cmn -> zho is right
    "ekk": "est",  # Standard Estonian: et
    "nso": "ns",  # Northern Sotho: fairseq's ns (ISO 639-1 has no code for it)
}
SAME_SCRIPT = {"Hang": "Kore"}  # Korean's Hangul is within langcodes' Kore (Hangul + Han)


@lru_cache(maxsize=None)
def _m2m_languages(known: tuple[str, ...]) -> dict[str, str]:
    """ISO 639-3 code -> the model's code, for each M2M-100 code langcodes knows."""
    import langcodes

    by_alpha3 = {}
    for c in known:
        try:
            by_alpha3[langcodes.Language.get(c).to_alpha3()] = c
        except (LookupError, ValueError):
            pass
    return by_alpha3


def _resolve_m2m(code: str, known: tuple[str, ...]) -> str:
    """An M2M-100 code (`en`) for what a user typed: ISO 639-1/2/3, a BCP-47 tag, or a FLORES-200 code
    (`eng_Latn`) when M2M-100's one code for that language means it: in its usual script (`zho_Hant` is refused,
    naming `zh`, since M2M-100's Chinese code does not say which script it writes)."""
    import langcodes

    if code.lower() in known:  # EN
        return code.lower()
    try:
        tag = langcodes.Language.get(code.replace("_", "-"))
        alpha3 = tag.to_alpha3()
    except (LookupError, ValueError):
        return check_lang(code, known)
    languages = _m2m_languages(known)
    mapped = M2M_LANGUAGE.get(alpha3, alpha3)
    model_code = languages.get(alpha3) or languages.get(mapped) or (mapped if mapped in known else None)
    if model_code is None:
        return check_lang(code, known)
    script = tag.script or tag.maximize().script  # zh-TW: Hant
    script = SAME_SCRIPT.get(script, script)
    usual = langcodes.Language.get(model_code).maximize().script
    if script != usual:
        raise NllbError(
            f"language code {code!r} asks for {script} script; M2M-100 has one code for the language, "
            f"{model_code!r}, mostly trained on {usual} script: use {model_code} if that is meant."
        )
    return model_code
