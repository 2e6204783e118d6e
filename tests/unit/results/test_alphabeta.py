"""The alpha-beta fit against synthetic sweeps whose alpha and beta are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from paths import TESTS

from distbench.results import alphabeta as ab

SIZES = 2.0 ** np.arange(3, 31)  # 8 B .. 1 GiB, x2
CASES = [(20.0, 150.0), (5.0, 20.0)]  # (alpha us, beta GB/s)
GOLDEN = TESTS / "golden" / "collective.csv"


def times(alpha, beta, sizes=SIZES, noise=0.0, bump=False, seed=0):
    t = alpha + sizes / (beta * 1e3)
    t = t * np.random.default_rng(seed).uniform(1 - noise, 1 + noise, sizes.size)
    if bump:  # a protocol switch slowing the middle sizes, as NCCL's LL128 -> Simple can
        t = np.where((sizes >= 64 * 2**10) & (sizes <= 2 * 2**20), t * 1.6, t)
    return t


def off(got, want):
    return abs(got / want - 1)


@pytest.mark.parametrize("alpha,beta", CASES)
def test_clean_sweep_is_recovered_exactly(alpha, beta):
    f = ab.fit(SIZES, times(alpha, beta), factor=1.5)
    assert f.alpha_us == pytest.approx(alpha, rel=1e-9)
    assert f.beta_gbps == pytest.approx(beta, rel=1e-9)
    assert f.busbw_gbps == pytest.approx(1.5 * beta, rel=1e-9)
    assert f.err_pct < 1e-6 and f.max_err_pct < 1e-6
    assert f.note == ""
    knee = alpha * beta * 1e3  # bytes; alpha gets the sizes <= knee/8, beta those >= 8 knee
    assert f.points_alpha == (SIZES <= knee / 8).sum() and f.points_alpha >= 11
    assert f.points_beta == (SIZES >= 8 * knee).sum() and f.points_beta >= 6


@pytest.mark.parametrize("alpha,beta", CASES)
@pytest.mark.parametrize("bump", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_and_bumped_sweeps_within_5_pct(alpha, beta, bump, seed):
    f = ab.fit(SIZES, times(alpha, beta, noise=0.03, bump=bump, seed=seed))
    assert off(f.alpha_us, alpha) < 0.05
    assert off(f.beta_gbps, beta) < 0.05
    assert f.points_alpha >= 10 and f.points_beta >= 5
    assert f.note == ""
    assert f.err_pct < 3.0  # median: the noise, not the bump
    if bump:
        assert f.max_err_pct > 30  # the bumped sizes stay visible as misfit
    else:
        assert f.max_err_pct < 6.5


@pytest.mark.parametrize("alpha,beta", CASES)
def test_bump_defeats_a_single_least_squares_line(alpha, beta):
    # The baseline the robust fit exists for: relative least squares over every point.
    t = times(alpha, beta, noise=0.03, bump=True)
    a, c = np.linalg.lstsq(np.stack([1 / t, SIZES / t], 1), np.ones_like(t), rcond=None)[0]
    assert max(off(a, alpha), off(1 / c / 1e3, beta)) > 0.05
    f = ab.fit(SIZES, t)
    assert max(off(f.alpha_us, alpha), off(f.beta_gbps, beta)) < 0.02


def test_n_half_and_n90():
    f = ab.fit(SIZES, times(20.0, 150.0), factor=2.0)
    assert f.n_half_bytes == pytest.approx(20e-6 * 150e9, rel=1e-9)  # 3 MB
    assert f.n90_bytes == pytest.approx(9 * 3e6, rel=1e-9)
    assert f.knee_bytes == f.n_half_bytes
    assert ab.predict(f, f.n_half_bytes)[1] == pytest.approx(0.5 * f.busbw_gbps)
    assert ab.predict(f, f.n90_bytes)[1] == pytest.approx(0.9 * f.busbw_gbps)
    noisy = ab.fit(SIZES, times(20.0, 150.0, noise=0.03, bump=True), factor=2.0)
    assert off(noisy.n_half_bytes, 3e6) < 0.1


def test_predict_gives_the_model_value():
    f = ab.fit(SIZES, times(20.0, 150.0), factor=1.5)
    t, busbw = ab.predict(f, 2**30)
    assert t == pytest.approx(20 + 2**30 / 150e3)  # 7178.2 us
    assert busbw == pytest.approx(1.5 * 2**30 / (t * 1e-6) / 1e9)  # 224.4 GB/s
    assert ab.predict(f, 8)[0] == pytest.approx(20 + 8 / 150e3)
    assert ab.predict(f, 0) == (pytest.approx(20.0), 0.0)
    with pytest.raises(ValueError):
        ab.predict(f, -1)


def finite(f):
    return all(math.isfinite(getattr(f, k)) for k in ab.MODEL)


def test_sweep_of_only_small_sizes_notes_beta():
    small = SIZES[SIZES <= 4096]
    f = ab.fit(small, times(20.0, 150.0, small, noise=0.03))
    assert off(f.alpha_us, 20.0) < 0.05
    assert "beta extrapolated" in f.note and finite(f)


def test_sweep_of_only_large_sizes_notes_alpha():
    large = SIZES[SIZES >= 2**28]
    f = ab.fit(large, times(20.0, 150.0, large, noise=0.03))
    assert off(f.beta_gbps, 150.0) < 0.05
    assert "alpha extrapolated" in f.note and finite(f)
    assert f.alpha_us >= 0


def test_flat_or_falling_times_give_a_lower_bound_not_an_error():
    # As gloo on a busy CPU: the larger size ran faster.
    f = ab.fit([1024, 65536], [4777.0, 1573.0])
    assert "lower bound" in f.note
    assert f.beta_gbps == pytest.approx(65536 / 1573.0 / 1e3)
    assert finite(f)


@pytest.mark.parametrize("sizes,ts,match", [
    ([8, 8, 8], [1.0, 2.0, 3.0], "2 distinct sizes"),
    ([8], [1.0], "2 distinct sizes"),
    ([8, 16], [1.0, 0.0], "times"),
    ([8, 16], [1.0, -2.0], "times"),
    ([8, 16], [1.0, float("nan")], "times"),
    ([0, 16], [1.0, 2.0], "sizes"),
    ([8, 16, 32], [1.0, 2.0], "3 sizes but 2 times"),
])
def test_unusable_input_raises(sizes, ts, match):
    with pytest.raises(ValueError, match=match):
        ab.fit(sizes, ts)


def rows(op, world, alpha, beta, dtype="float32", redop="sum", in_place=1):
    return pd.DataFrame({"op": op, "dtype": dtype, "redop": redop, "root": -1,
                         "in_place": in_place, "world_size": world, "size_bytes": SIZES,
                         "time_us": times(alpha, beta), "status": "ok"})


def test_fit_rows_groups_and_ignores_unusable_rows():
    junk = pd.DataFrame({"op": "all_reduce", "dtype": "float32", "redop": "sum", "root": -1,
                         "in_place": 1, "world_size": 4, "size_bytes": [2**20, 2**21, 2**22],
                         "time_us": [1e9, 0.0, 5.0], "status": ["skipped", "ok", "failed"]})
    only_skipped = junk.assign(dtype="int8", status="skipped")
    data = pd.concat([rows("all_reduce", 4, 20.0, 150.0), junk,
                      rows("all_gather", 4, 5.0, 20.0, redop="none", in_place=0),
                      rows("all_reduce", 8, 30.0, 100.0), only_skipped], ignore_index=True)
    data.loc[data.index[:3], "status"] = np.nan  # an empty status counts as ok
    out = ab.fit_rows(data.sample(frac=1, random_state=0))  # row order must not matter
    json.dumps(out, allow_nan=False)
    got = {(r["op"], r["dtype"], r["world_size"]): r for r in out}
    assert len(out) == 4
    ar4 = got[("all_reduce", "float32", 4)]
    assert ar4["alpha_us"] == pytest.approx(20.0) and ar4["beta_gbps"] == pytest.approx(150.0)
    assert ar4["busbw_gbps"] == pytest.approx(150.0 * 1.5)  # 2(n-1)/n at n=4
    assert ar4["in_place"] is True and ar4["redop"] == "sum" and ar4["note"] == ""
    ag = got[("all_gather", "float32", 4)]
    assert ag["beta_gbps"] == pytest.approx(20.0) and ag["busbw_gbps"] == pytest.approx(15.0)
    assert ag["in_place"] is False and ag["redop"] == "none"
    assert got[("all_reduce", "float32", 8)]["busbw_gbps"] == pytest.approx(100.0 * 1.75)
    none = got[("all_reduce", "int8", 4)]
    assert none["alpha_us"] is None and "2 distinct sizes" in none["note"]
    assert set(ar4) == {*ab.GROUP, *ab.MODEL, "note"}


def test_fit_rows_on_real_gloo_output_does_not_raise():
    data = pd.read_csv(GOLDEN)
    out = ab.fit_rows(data)
    json.dumps(out, allow_nan=False)
    assert len(out) == data.groupby(list(ab.GROUP)).ngroups


@pytest.mark.parametrize("text,want", [
    ("all_reduce:1G", ("all_reduce", 2**30)),
    (" broadcast:64M ", ("broadcast", 64 * 2**20)),
    ("all_gather:4KiB", ("all_gather", 4096)),
    ("reduce_scatter:1000", ("reduce_scatter", 1000)),
])
def test_parse_predict(text, want):
    assert ab.parse_predict(text) == want


@pytest.mark.parametrize("text,match", [
    ("allreduce:1G", "unknown op 'allreduce'.*all_reduce, reduce_scatter"),
    ("all_reduce", "OP:SIZE"),
    ("all_reduce:", "OP:SIZE"),
    (":1G", "OP:SIZE"),
    ("all_reduce:1.5G", "fraction"),
    ("all_reduce:1Q", "suffix"),
])
def test_parse_predict_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        ab.parse_predict(text)
