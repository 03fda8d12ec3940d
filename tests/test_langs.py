"""Language codes users type, resolved to the model's FLORES-200 codes."""

import pytest

from nllbcli.errors import NllbError
from nllbcli.model.langs import FLORES_200_CODES, resolve_lang


@pytest.mark.parametrize(
    "typed,code",
    [
        ("eng_Latn", "eng_Latn"), ("en", "eng_Latn"), ("eng", "eng_Latn"), ("en-US", "eng_Latn"), ("en_GB", "eng_Latn"),
        ("EN", "eng_Latn"), ("eng_latn", "eng_Latn"), ("eng-Latn", "eng_Latn"), (" fr ", "fra_Latn"),
        ("fre", "fra_Latn"), ("ger", "deu_Latn"), ("pt-BR", "por_Latn"), ("iw", "heb_Hebr"), ("in", "ind_Latn"),
        # Chinese: the script decides; without one, CLDR's likely script (Hans, Hant in Taiwan and Hong Kong)
        ("zh", "zho_Hans"), ("zh-CN", "zho_Hans"), ("zh-Hans", "zho_Hans"), ("zh-TW", "zho_Hant"),
        ("zh-HK", "zho_Hant"), ("zh-Hant-TW", "zho_Hant"), ("chi", "zho_Hans"), ("cmn-Hant", "zho_Hant"),
        ("yue", "yue_Hant"),
        # macrolanguages and NLLB's own choices
        ("ar", "arb_Arab"), ("ara", "arb_Arab"), ("ar-EG", "arb_Arab"), ("fa", "pes_Arab"), ("fa-AF", "prs_Arab"),
        ("prs", "prs_Arab"), ("sw", "swh_Latn"), ("ne", "npi_Deva"), ("ms", "zsm_Latn"), ("mn", "khk_Cyrl"),
        ("lv", "lvs_Latn"), ("et", "est_Latn"), ("ekk", "est_Latn"), ("sr", "srp_Cyrl"), ("sr-Cyrl", "srp_Cyrl"),
        ("no", "nob_Latn"), ("nb", "nob_Latn"), ("nn", "nno_Latn"), ("uz", "uzn_Latn"), ("sq", "als_Latn"),
        ("om", "gaz_Latn"), ("mg", "plt_Latn"), ("ps", "pbt_Arab"), ("qu", "quy_Latn"), ("yi", "ydd_Hebr"),
        ("or", "ory_Orya"), ("tl", "tgl_Latn"), ("fil", "tgl_Latn"), ("az", "azj_Latn"), ("az-Arab", "azb_Arab"),
        ("ku", "kmr_Latn"), ("ckb", "ckb_Arab"), ("ks", "kas_Arab"), ("ks-Deva", "kas_Deva"), ("pa", "pan_Guru"),
        ("ace", "ace_Latn"), ("ace-Arab", "ace_Arab"), ("taq-Tfng", "taq_Tfng"),
    ],
)
def test_codes_users_type(typed, code):
    assert resolve_lang(typed, FLORES_200_CODES) == code


def test_every_flores_code_resolves_to_itself_in_any_case():
    for code in FLORES_200_CODES:
        assert resolve_lang(code, FLORES_200_CODES) == code
        assert resolve_lang(code.lower().replace("_", "-"), FLORES_200_CODES) == code


@pytest.mark.parametrize(
    "typed,message",
    [
        ("sr-Latn", "language code 'sr-Latn' asks for srp in Latn script, which the model does not have: use srp_Cyrl."),
        ("yue-Hans", "language code 'yue-Hans' asks for yue in Hans script, which the model does not have: use yue_Hant."),
        ("kas-Latn", "language code 'kas-Latn' asks for kas in Latn script, which the model does not have: use kas_Arab or kas_Deva."),
        ("xx", "unknown language code 'xx': the model knows 202 FLORES-200 codes such as eng_Latn. Run `nllb langs` to list them."),
        ("klingon", "unknown language code 'klingon'"),
        ("tlh", "unknown language code 'tlh'"),
        ("", "unknown language code ''"),
        ("fra_Latm", "language code 'fra_Latm' asks for fra in Latm script, which the model does not have: use fra_Latn."),
    ],
)
def test_unknown_and_ambiguous_codes_name_the_candidates(typed, message):
    with pytest.raises(NllbError) as caught:
        resolve_lang(typed, FLORES_200_CODES)
    assert str(caught.value).startswith(message)


def test_only_the_models_own_codes():
    assert resolve_lang("de", ["deu_Latn", "eng_Latn"]) == "deu_Latn"
    with pytest.raises(NllbError, match="unknown language code 'fr'"):
        resolve_lang("fr", ["deu_Latn", "eng_Latn"])


@pytest.mark.parametrize("typed, code", [("english", "eng_Latn"), ("French", "fra_Latn"), (" German ", "deu_Latn"),
                                         ("chinese (traditional)", "zho_Hant"), ("Serbian", "srp_Cyrl")])
def test_a_language_name_that_names_one_language_is_taken_as_its_code(typed, code):
    """What `nllb langs english` finds, --src english takes: the English name `nllb langs` shows, in any case."""
    assert resolve_lang(typed, FLORES_200_CODES) == code


def test_a_name_of_several_languages_names_them():
    with pytest.raises(NllbError, match=r"^'chinese' names 2 of the model's languages: zho_Hans, zho_Hant: give one code\.$"):
        resolve_lang("chinese", FLORES_200_CODES)
