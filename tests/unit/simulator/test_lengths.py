import json
import random
from pathlib import Path

import pytest

from simulator.lengths import LengthCDF, load_cdf, split


def test_paper_cdfs_load_and_their_bin_uniform_means_match_the_data_files() -> None:
    # simulator/data quotes the mean of the bin-uniform distribution of each paper CDF.
    for name, quoted in (("azure_2023", 1627.2), ("lmsys_chat_1m", 682.0), ("agent_heavy", 6512.0)):
        assert load_cdf(name).mean() == pytest.approx(quoted, abs=1.0)


def test_samples_follow_the_cdf() -> None:
    cdf = load_cdf("azure_2023")
    rng = random.Random(5)
    xs = [cdf.sample(rng) for _ in range(20000)]
    assert min(xs) >= 1 and max(xs) <= cdf.tokens[-1]
    for t in (512, 2048, 4096):
        empirical = sum(x <= t for x in xs) / len(xs)
        assert empirical == pytest.approx(cdf.cdf(t), abs=0.015)
    assert sum(xs) / len(xs) == pytest.approx(cdf.mean(), rel=0.03)


def test_a_series_of_the_fine_trace_file_loads() -> None:
    out = load_cdf("azure_2023_trace_fine", "all_output")
    assert out.cdf(90) == pytest.approx(0.5, abs=0.02)  # the raw trace's output p50 is 90


def test_split_is_the_papers_80_20_rule() -> None:
    assert split(1000, 0.8) == (800, 200)
    assert split(1, 0.8) == (1, 1)
    assert split(7, 0.8) == (5, 2)
    l_in, l_out = split(4096, 0.9)
    assert l_in + l_out == 4096 and l_in == 3686


def test_truncated_cdf_is_conditioned_below_the_bound() -> None:
    cdf = load_cdf("azure_2023").truncated(4096)
    rng = random.Random(1)
    assert max(cdf.sample(rng) for _ in range(5000)) <= 4096
    assert cdf.cdf(4096) == 1.0


def test_bad_cdfs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="increasing"):
        LengthCDF("x", (10, 10), (0.5, 1.0))
    with pytest.raises(ValueError, match="last F"):
        LengthCDF("x", (10, 20), (0.5, 0.9))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"points": []}))
    with pytest.raises(ValueError, match="no CDF points"):
        load_cdf(str(bad))
    with pytest.raises(ValueError, match="no series"):
        load_cdf("azure_2023_trace_fine", "nope")
