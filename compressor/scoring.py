"""Sentence scores: 0.20 TextRank + 0.40 position + 0.35 TF-IDF + 0.05 novelty (FleetOpt §5.2).

Every component is computed on the document's sparse unit × term matrix in O(nnz) numpy
operations (no Python loop over units, no N × N similarity matrix), then min-max
normalised to [0, 1] so the weights mean what they say:

- TF-IDF (Li et al. 2023's self-information, approximated): the unit's information
  density Σ_t (1 + ln tf)·idf_t / words, idf_t = ln((1 + N) / (1 + df_t)) + 1. Units
  carrying rare, specific terms score high; boilerplate and stop-word filler low.
- TextRank (Mihalcea & Tarau 2004) on the cosine-similarity graph of the units' L2-normal
  tf-idf rows X: r ← (1 − d)/N + d · S (r / deg), S = X Xᵀ − diag(X Xᵀ). S is never formed:
  S v = X (Xᵀ v) − diag·v costs two sparse products (np.bincount), so each iteration is
  O(nnz). On an undirected graph the stationary vector is close to the weighted degree,
  so iterating from deg/Σdeg converges in a few steps (`textrank_iterations`).
- Position: primacy and recency within each text (a chat's messages are texts of one
  document), max(e^{−i/τ}, e^{−(N−1−i)/τ}) with τ = `position_decay`·N, plus `lead_bonus` for a unit that opens a paragraph or list item
  (lead sentences carry the topic).
- Novelty: the share of the unit's tf-idf mass in terms that appear here for the first
  time in the document (a repeated passage scores 0).

Failure posture: a document with no terms (all numbers or stop words) gets zero TF-IDF,
TextRank and novelty, leaving position to decide; scores are always finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compressor.compiled import fast as _fast
from compressor.document import Document, FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    textrank: float = 0.20  # FleetOpt §5.2: centrality in the similarity graph
    position: float = 0.40  # FleetOpt §5.2: primacy/recency carry the most weight
    tfidf: float = 0.35  # FleetOpt §5.2: information density
    novelty: float = 0.05  # FleetOpt §5.2: small tie-breaker against repetition

    def __post_init__(self) -> None:
        parts = (self.textrank, self.position, self.tfidf, self.novelty)
        if any(w < 0 for w in parts) or sum(parts) <= 0:
            raise ValueError(f"score weights must be ≥ 0 with a positive sum: {self}")


@dataclass(frozen=True, slots=True)
class ScoreConfig:
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    damping: float = 0.85  # TextRank's (and PageRank's) customary damping factor
    textrank_iterations: int = 8  # from the degree start, rank order is stable by ~5
    position_decay: float = 0.1  # τ/N: the first and last ~10% of units get most credit
    lead_bonus: float = 0.3  # a paragraph's opening sentence states its topic


def _minmax(x: FloatArray) -> FloatArray:
    lo = float(x.min()) if len(x) else 0.0
    span = (float(x.max()) - lo) if len(x) else 0.0
    if span <= 1e-12:
        return np.zeros_like(x)
    out: FloatArray = (x - lo) / span
    return out


def position_scores(group: IntArray, lead: list[bool], config: ScoreConfig) -> FloatArray:
    """Primacy/recency within each text (`group[i]`: the text of unit i) plus lead bonus."""
    n = len(group)
    first = np.searchsorted(group, group, side="left")
    size = np.searchsorted(group, group, side="right") - first
    i = (np.arange(n) - first).astype(np.float64)
    tau = np.maximum(config.position_decay * size, 1.0)
    base = np.maximum(np.exp(-i / tau), np.exp(-(size - 1 - i) / tau))
    out: FloatArray = base + config.lead_bonus * np.asarray(lead, dtype=np.float64)
    return out


def scores(doc: Document, config: ScoreConfig | None = None) -> FloatArray:
    """Composite score per unit (higher = keep first)."""
    config = config or ScoreConfig()
    n = len(doc)
    w = config.weights
    total = w.position * _minmax(position_scores(doc.group, doc.units.lead, config))
    if doc.n_terms == 0 or n < 2:
        return total
    pu, pt = doc.pu, doc.pt
    v_terms = doc.n_terms
    df = np.bincount(pt, minlength=v_terms).astype(np.float64)
    idf = np.log((1.0 + n) / (1.0 + df)) + 1.0
    weight = (1.0 + np.log(doc.tf.astype(np.float64))) * idf.take(pt)

    whole = np.bincount(pu, weights=weight, minlength=n)  # also the novelty denominator
    density = whole / np.maximum(doc.words, 1)
    total += w.tfidf * _minmax(density)

    sq = np.bincount(pu, weights=weight * weight, minlength=n)
    norm = np.sqrt(sq)
    x = weight / norm.take(pu)  # L2-normalised rows
    self_sim = np.where(sq > 0, 1.0, 0.0)

    def similarity_times(v: FloatArray) -> FloatArray:
        col = np.bincount(pt, weights=x * v.take(pu), minlength=v_terms)
        out: FloatArray = np.bincount(pu, weights=x * col.take(pt), minlength=n).astype(
            np.float64, copy=False
        )
        out -= self_sim * v
        return out

    # S·1 (x · 1.0 is x itself)
    ones = np.bincount(
        pu, weights=x * np.bincount(pt, weights=x, minlength=v_terms).take(pt), minlength=n
    )
    degree = np.maximum(ones - self_sim, 0.0)
    if w.textrank > 0 and degree.sum() > 0:
        inv_degree = np.where(degree > 1e-12, 1.0 / np.maximum(degree, 1e-12), 0.0)
        rank = degree / degree.sum()
        d = config.damping
        teleport = (1.0 - d) / n
        if _fast is not None:  # the same iterations in C, the same floats
            _fast.textrank(
                pu, pt, x, self_sim, inv_degree, rank, teleport, d,
                config.textrank_iterations, v_terms,
            )  # fmt: skip
        else:
            for _ in range(config.textrank_iterations):
                rank = teleport + d * similarity_times(rank * inv_degree)
        total += w.textrank * _minmax(rank)

    if w.novelty > 0:
        first_unit = np.full(v_terms, n, dtype=np.int64)
        np.minimum.at(first_unit, pt, pu)  # the earliest unit holding each term
        novel = np.bincount(pu, weights=weight * (pu == first_unit.take(pt)), minlength=n)
        total += w.novelty * _minmax(np.where(whole > 0, novel / np.maximum(whole, 1e-12), 0.0))
    return total
