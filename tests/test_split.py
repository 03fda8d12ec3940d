"""The sentence splitter: examples in several scripts, and properties over any text (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nllbcli.model.split import ANYWHERE, SPACED, join_sentences, split_text, split_walk


@pytest.mark.parametrize(
    "text,sentences",
    [
        ("Hello world. How are you? Fine!", ["Hello world.", "How are you?", "Fine!"]),
        ("我们见面。你好吗？好的！", ["我们见面。", "你好吗？", "好的！"]),
        ("私は学生です。あなたは？", ["私は学生です。", "あなたは？"]),
        ("हम मिलेंगे। ठीक है॥ हाँ", ["हम मिलेंगे।", "ठीक है॥", "हाँ"]),
        ("سنلتقي؟ نعم، حسنا.", ["سنلتقي؟", "نعم، حسنا."]),  # the Arabic comma is a comma
        ("ይህ ነው። ያ ነው።", ["ይህ ነው።", "ያ ነው።"]),
        ("Ἀλλά; Ναι", ["Ἀλλά;", "Ναι"]),
        ("Mr. Smith met Dr. Jones. They left.", ["Mr. Smith met Dr. Jones.", "They left."]),
        ("J. R. R. Tolkien wrote it. Yes.", ["J. R. R. Tolkien wrote it.", "Yes."]),
        ("Am 3. Mai kam er. Dann ging er.", ["Am 3. Mai kam er.", "Dann ging er."]),
        ("It costs 3.50 euros. Pi is 3.14. Yes", ["It costs 3.50 euros.", "Pi is 3.14.", "Yes"]),
        ("e.g. this one. And the U.S. too", ["e.g. this one.", "And the U.S. too"]),
        ('"Quoted." Next one.', ['"Quoted."', "Next one."]),
        ("«Oui !» dit-il. Puis il partit.", ["«Oui !» dit-il.", "Puis il partit."]),
        ("wait... what? no", ["wait... what? no"]),
        ("Title\nBody text. More.", ["Title", "Body text.", "More."]),
        ("  padded.  ", ["padded."]),
        ("", []),
        (" \t\n ", []),
    ],
)
def test_split_examples(text, sentences):
    assert split_text(text)[0] == sentences


def test_join_keeps_line_breaks_and_spaces_as_the_target_writes():
    gaps = ["", " ", "\n\n", ""]
    assert join_sentences(["A.", "B.", "C."], gaps, "fra_Latn") == "A. B.\n\nC."
    assert join_sentences(["甲。", "乙。", "丙。"], gaps, "zho_Hans") == "甲。乙。\n\n丙。"
    assert join_sentences(["A.", "B."], ["", "", ""], "eng_Latn") == "A. B."  # the source (Chinese) had no space


TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list(ANYWHERE + SPACED + "\"'»)」 \t\n\r\u3000\u2028.")),
        st.characters(codec="utf-8"),
    ),
    max_size=200,
)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_split_loses_nothing_and_keeps_order(text):
    sentences, gaps = split_text(text)
    assert len(gaps) == len(sentences) + 1
    assert "".join(g + s for g, s in zip(gaps, sentences)) + gaps[-1] == text
    for sentence in sentences:
        assert sentence and sentence == sentence.strip()
    for gap in gaps:
        assert not gap.strip()
    assert bool(sentences) == bool(text.strip())


@settings(max_examples=1500, deadline=None)
@given(TEXT)
def test_the_shortcut_splits_as_the_walk(text):
    """split_text answers texts with no place to split without walking them: the same sentences and gaps."""
    assert split_text(text) == split_walk(text)


@pytest.mark.parametrize("text", ["Hello world.", "  Hello world.  ", "Hi.There", "3.14 is pi", "x!", "«Oui»", "\t", "",
                                  "a.\u00a0b", "Done.)", "Done.) ", "Is it?” ", "wait... what", "a;b", "Ναι;"])
def test_the_shortcut_on_single_sentences(text):
    assert split_text(text) == split_walk(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Zs", "Cc", "Zl", "Zp"], exclude_characters=ANYWHERE),
                        min_size=1, max_size=20), max_size=6))
def test_join_of_identity_translations_keeps_the_words(words):
    """(Marks that end a sentence with no space after them are left out: "᠉0" is two sentences, and a
    language written with spaces joins them with one, by design.)"""
    text = " ".join(words)
    sentences, gaps = split_text(text)
    joined = join_sentences(sentences, gaps, "eng_Latn")
    assert joined.split() == text.split()
