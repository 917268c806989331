"""Sentence scores (compressor/scoring.py) on small documents whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from compressor.document import Analyzer
from compressor.scoring import ScoreConfig, ScoreWeights, position_scores, scores


def only(**weights: float) -> ScoreConfig:
    base = {"textrank": 0.0, "position": 0.0, "tfidf": 0.0, "novelty": 0.0}
    base.update(weights)
    return ScoreConfig(weights=ScoreWeights(**base))


def test_weights_must_be_non_negative_and_not_all_zero() -> None:
    with pytest.raises(ValueError):
        ScoreWeights(textrank=-1)
    with pytest.raises(ValueError):
        ScoreWeights(0, 0, 0, 0)


def test_position_is_u_shaped_per_text_with_a_lead_bonus() -> None:
    group = np.array([0] * 10 + [1] * 10)
    lead = [False] * 20
    p = position_scores(group, lead, ScoreConfig())
    assert p[0] == p[9] == p[10] == p[19] == pytest.approx(1.0)
    assert p[5] < p[1] and p[5] < p[8]
    lead[5] = True
    assert position_scores(group, lead, ScoreConfig())[5] > p[5]


def test_textrank_prefers_the_central_sentence() -> None:
    text = (
        "Cats chase mice in the barn. Dogs chase cats around the barn. "
        "Mice hide from cats and dogs in the barn. Quantum chromodynamics describes quarks."
    )
    doc = Analyzer().analyse([text])
    s = scores(doc, only(textrank=1.0))
    assert int(np.argmin(s)) == 3  # the unrelated sentence has no neighbours


def test_tfidf_prefers_dense_specific_sentences() -> None:
    text = "It was what it was and so it is. Photosynthesis converts sunlight into chemical energy. It is what it is."
    s = scores(Analyzer().analyse([text]), only(tfidf=1.0))
    assert int(np.argmax(s)) == 1


def test_novelty_penalises_repetition() -> None:
    text = "Alpha beta gamma delta. Epsilon zeta theta iota. Alpha beta gamma delta."
    s = scores(Analyzer().analyse([text]), only(novelty=1.0))
    assert s[2] < s[0] and s[2] < s[1]


def test_scores_are_finite_without_terms() -> None:
    s = scores(Analyzer().analyse(["100 200 300. 400 500 600. 700 800 900."]))
    assert np.isfinite(s).all() and len(s) == 3
