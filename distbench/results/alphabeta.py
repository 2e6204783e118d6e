"""The alpha-beta (latency-bandwidth) model of a collective, T(S) = alpha + S / beta: a robust fit
to a size sweep (`fit`, `fit_rows` for collective.csv rows, which model.json holds), predictions
from it (`predict`) and the CLI's ``--predict OP:SIZE`` text (`parse_predict`).

Units: S is the per-rank buffer (collective.csv's size_bytes), T microseconds, bandwidths
decimal GB/s (1e9 B/s); beta is the asymptotic algbw and busbw = algbw * the op's bus factor.

Method: a single least-squares line misfits the middle sizes, where NCCL changes protocol
(LL -> LL128 -> Simple), so each parameter is fitted only where it dominates. The knee
S* = alpha * beta is where both terms are equal. Starting from alpha = the time of the smallest
sizes and beta = the algbw of the largest, the fit repeats until it settles: every size at or
below S*/8 gives an estimate T - S/beta of alpha, every size at or above 8 S* gives an estimate
S / (T - alpha) of beta, and the median of each set is taken. A median of per-point estimates
weighs a 1 us point and a 10 ms one alike, and ignores a minority of points off the line, such as
a protocol bump. A sweep with no size in one regime takes that parameter from its 3 end sizes
and says so in `note`.

No torch here: the CLI imports this before torch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from distbench.core.sizes import parse_size
from distbench.ops.collectives import OPS, names

BAND = 8.0  # latency regime: S <= knee / BAND; bandwidth regime: S >= knee * BAND
EDGE = 3  # distinct sizes an empty regime falls back on, at that end of the sweep
GROUP = ("op", "dtype", "redop", "root", "in_place", "world_size")
_B_PER_US = 1e3  # 1 GB/s = 1e3 bytes per microsecond
MODEL = ("alpha_us", "beta_gbps", "busbw_gbps", "err_pct", "max_err_pct", "n_half_bytes",
         "n90_bytes", "knee_bytes")


@dataclass(frozen=True)
class Fit:
    alpha_us: float
    beta_gbps: float  # asymptotic algbw
    busbw_gbps: float  # beta * factor
    factor: float  # busbw / algbw for the op at its world size
    err_pct: float  # median |T_model / T - 1| over all points, in percent
    max_err_pct: float  # the largest of the same
    n_half_bytes: float  # busbw reaches half its peak: alpha * beta
    n90_bytes: float  # and 90% of it: 9 * alpha * beta
    knee_bytes: float  # alpha * beta, where latency and bandwidth terms are equal
    points_alpha: int
    points_beta: int
    note: str = ""


def _ends(s: np.ndarray, small: bool) -> np.ndarray:
    u = np.unique(s)
    k = max(1, min(EDGE, len(u) // 2))
    return s <= u[k - 1] if small else s >= u[-k]


def _step(s: np.ndarray, t: np.ndarray, alpha: float, beta: float):
    """One refit given the current guesses (beta in bytes/us); returns the new state and notes."""
    knee, notes = alpha * beta, []
    lat, bw = s <= knee / BAND, s >= knee * BAND
    if not lat.any():
        lat = _ends(s, small=True)
        notes.append(f"no size below knee/{BAND:g}: alpha extrapolated from the smallest sizes")
    if not bw.any():
        bw = _ends(s, small=False)
        notes.append(f"no size above {BAND:g}x knee: beta extrapolated from the largest sizes")
    alpha = float(np.median(t[lat] - s[lat] / beta))
    if alpha < 0:  # the bandwidth term swamps alpha at every size measured
        alpha = 0.0
        notes.append("alpha unresolved (below 0 within noise), set to 0")
    left = t[bw] - alpha
    if (left > 0).any():
        beta = float(np.median(s[bw][left > 0] / left[left > 0]))
    else:  # times flat to the end: S/beta is lost in noise, and beta >= every algbw seen
        beta = float(np.max(s / t))
        notes.append("beta unresolved (sweep ends in the latency regime): a lower bound")
    return alpha, beta, int(lat.sum()), int(bw.sum()), notes


def fit(sizes_bytes, times_us, factor: float = 1.0) -> Fit:
    """Fit T = alpha + S/beta to one sweep; ValueError only for input no fit can use."""
    s = np.asarray(sizes_bytes, dtype=float).ravel()
    t = np.asarray(times_us, dtype=float).ravel()
    if s.shape != t.shape:
        raise ValueError(f"{s.size} sizes but {t.size} times")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError("sizes must be finite and positive")
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError("times must be finite and positive")
    if np.unique(s).size < 2:
        raise ValueError(f"need at least 2 distinct sizes, got {np.unique(s).size}")
    if not (np.isfinite(factor) and factor >= 0):
        raise ValueError(f"bus factor must be finite and >= 0, got {factor}")
    alpha = float(np.median(t[_ends(s, small=True)]))
    beta = float(np.median((s / t)[_ends(s, small=False)]))
    for _ in range(50):
        state = _step(s, t, alpha, beta)
        settled = np.isclose(state[0], alpha, rtol=1e-9) and np.isclose(state[1], beta, rtol=1e-9)
        alpha, beta, n_alpha, n_beta, notes = state
        if settled:
            break
    else:
        notes.append("knee did not settle in 50 refits")
    rel = np.abs((alpha + s / beta) / t - 1) * 100
    knee = alpha * beta
    gbps = beta / _B_PER_US
    return Fit(alpha, gbps, gbps * factor, float(factor), float(np.median(rel)),
               float(rel.max()), knee, 9 * knee, knee, n_alpha, n_beta, "; ".join(notes))


def predict(f: Fit, size_bytes: float) -> tuple[float, float]:
    """(time_us, busbw_gbps) of the model at `size_bytes`."""
    if size_bytes < 0:
        raise ValueError(f"size must be >= 0, got {size_bytes}")
    time_us = f.alpha_us + size_bytes / (f.beta_gbps * _B_PER_US)
    return time_us, size_bytes / time_us / _B_PER_US * f.factor if size_bytes else 0.0


def predict_row(row: dict, size_bytes: float) -> tuple[float, float]:
    """predict() for a fit as fit_rows (and model.json) holds it."""
    beta = row["beta_gbps"]
    return predict(Fit(row["alpha_us"], beta, row["busbw_gbps"], row["busbw_gbps"] / beta,
                       0.0, 0.0, 0.0, 0.0, 0.0, 0, 0), size_bytes)


def _text(v) -> str:
    return "" if v is None or v != v else str(v).strip()  # v != v: NaN from an empty cell


def fit_rows(rows) -> list[dict]:
    """One model per (op, dtype, redop, in_place, world_size) of collective.csv-shaped rows,
    from rows with status "ok" (or none) and time_us > 0, as JSON-ready dicts. A group no fit
    can use gets None values and the reason in "note"."""
    import pandas as pd

    status = rows["status"].map(_text)
    time = pd.to_numeric(rows["time_us"], errors="coerce")
    size = pd.to_numeric(rows["size_bytes"], errors="coerce")
    usable = status.isin(["ok", ""]) & (time > 0) & (size > 0)
    out = []
    data = rows.assign(_t=time, _s=size, _use=usable)
    for key, g in data.groupby(list(GROUP), sort=True, dropna=False):
        op, dtype, redop, root, in_place, world = key
        row = {"op": _text(op), "dtype": _text(dtype), "redop": _text(redop),
               "root": None if pd.isna(root) else int(root),
               "in_place": _text(in_place).lower() in ("1", "true", "1.0"),
               "world_size": None if pd.isna(world) else int(world)}
        acc = OPS.get(row["op"])
        g = g[g["_use"]]
        # the rows' own busbw / algbw where they have both (an nccl-tests log may not say how
        # many ranks ran), else the op's accounting at the world size
        ratio = pd.to_numeric(g.get("busbw_gbps"), errors="coerce") / pd.to_numeric(
            g.get("algbw_gbps"), errors="coerce") if "algbw_gbps" in g else pd.Series([])
        ratio = ratio[ratio > 0] if len(ratio) else ratio
        factor = (float(ratio.median()) if len(ratio) else
                  acc.accounting.factor(row["world_size"]) if acc and row["world_size"]
                  else 1.0)
        try:
            f = fit(g["_s"], g["_t"], factor)
            fields = {k: getattr(f, k) for k in (*MODEL, "note")}
        except ValueError as e:
            fields = dict.fromkeys(MODEL) | {"note": f"no fit: {e}"}
        if acc is None and not len(ratio):
            fields["note"] = "; ".join(filter(None, [fields["note"], "unknown op: bus factor 1"]))
        out.append(row | fields)
    return out


def parse_predict(text: str, fitted: Collection[str] = ()) -> tuple[str, int]:
    """``"all_reduce:1G"`` -> ("all_reduce", 1073741824); ValueError saying what is wrong. An op
    is known when distbench measures it, or when a run read fits it (`fitted`: an nccl-tests
    log's sendrecv and hypercube have no distbench collective)."""
    op, sep, size = text.strip().partition(":")
    op = op.strip()
    if not sep or not op or not size.strip():
        raise ValueError(f"--predict wants OP:SIZE such as all_reduce:1G, got {text!r}")
    if op not in OPS and op not in fitted:
        extra = sorted(set(fitted) - set(OPS))
        raise ValueError(f"unknown op {op!r} in --predict (valid: "
                         f"{', '.join([*names(), *extra])})")
    try:
        return op, parse_size(size)
    except ValueError as e:
        raise ValueError(f"--predict {text!r}: {e}") from e
