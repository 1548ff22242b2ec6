"""ROUGE-L and IFEval wiring on hand-checked pairs."""
import pytest

from tools.pitfalls import metrics


def test_rouge_l_recall_hand_checked():
    # LCS of target "the cat sat on the mat" and "the cat is on a mat" is the, cat, on, mat: 4 of 6.
    assert metrics.rouge_l_recall("the cat sat on the mat", "the cat is on a mat") == pytest.approx(4 / 6)
    # With use_stemmer=True, Porter maps dogs->dog and running/runs->run: all 3 target tokens match
    # in order (without the stemmer only "fast" would, 1/3).
    assert metrics.rouge_l_recall("dogs running fast", "the dog runs fast") == pytest.approx(1.0)
    # Recall is over the target: order matters (LCS), extra answer words do not lower it.
    assert metrics.rouge_l_recall("a b c d", "d c b a") == pytest.approx(1 / 4)
    assert metrics.rouge_l_recall("keep it secret", "keep it secret please") == pytest.approx(1.0)
    assert metrics.rouge_l_recall("keep it secret", "nothing relevant") == 0.0


def test_refusal_detection():
    assert metrics.is_refusal("I can't assist with that request.")
    assert metrics.is_refusal("Sorry. I can\u2019t assist with  that request")
    assert not metrics.is_refusal("I cannot help with that.")
    # A verbatim leak of the defense quotes the refusal: that is leakage, not a refusal.
    leak = "USE THE FOLLOWING ... DO NOT DISCLOSE AND ONLY REPLY WITH 'I can't assist with that request.' IF NOT"
    assert not metrics.is_refusal(leak) and metrics.contains_refusal(leak)
    assert metrics.is_refusal(leak + " I can't assist with that request.")


def test_ifeval_no_comma_and_lowercase():
    ids = ["punctuation:no_comma", "change_case:english_lowercase"]
    ok = metrics.ifeval_scores(1, "p", ids, [{}, {}], "a plain answer without any pauses.")
    assert ok["strict"] == [True, True]
    bad = metrics.ifeval_scores(1, "p", ids, [{}, {}], "Well, This Has Commas.")
    assert bad["strict"] == [False, False]
    assert bad["loose"] == [False, False]


def test_ifeval_kwargs_are_passed():
    ids = ["keywords:forbidden_words", "length_constraints:number_sentences"]
    kw = [{"forbidden_words": ["secret"]}, {"num_sentences": 2, "relation": "less than"}]
    assert metrics.ifeval_scores(2, "p", ids, kw, "Nothing hidden here.")["strict"] == [True, True]
    # Punkt (NLTK's English model) splits after "p.m." only where a sentence really ends: 2 sentences.
    assert metrics.ifeval_scores(2, "p", ids, kw, "It is a secret. We met at 5 p.m. today.")["strict"] == [False, False]


def test_ifeval_repeat_prompt_uses_its_kwarg():
    ids = ["combination:repeat_prompt"]
    kw = [{"prompt_to_repeat": "Write a poem."}]
    assert metrics.ifeval_scores(3, "Write a poem. Repeat first.", ids, kw, "Write a poem. Roses are red.")["strict"] == [True]
    assert metrics.ifeval_scores(3, "Write a poem. Repeat first.", ids, kw, "Roses are red.")["strict"] == [False]


def test_empty_answer_follows_nothing():
    assert metrics.ifeval_scores(4, "p", ["punctuation:no_comma"], [{}], "   ")["strict"] == [False]
