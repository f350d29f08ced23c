"""``cusp bench detect``: change-point detection quality of cusp against peers, in one run.

``cusp bench detect [--quick] [--out docs/benchmarks.md] [--tcpd DIR ...] [--seeds N] [--only PATTERN ...] [--json PATH]``

What it measures (issue 4), everything in the same process, one thread, one after the other:

- **Data.** A labelled synthetic suite (``suite()``: seeded generators; each gives the data
  ``[T, C]`` float64, the true change locations, cusp's model spec and the chunk size),
  the paper's 3 -> 5 -> 7 clusters (``bench.data.distribution_shift_data``) in order and
  shuffled, the demo stream's rounds (``clusters_drop``: 7 clusters, then 3, 5 and 7 of them), stationary stretches for the false-alarm rate, the Nile river flow from
  statsmodels with the TCPD annotations, and any TCPD-format directory (``read_tcpd``).
- **Metrics** exactly as van den Burg & Williams, "An Evaluation of Change Point Detection
  Algorithms" (2020) define them (``f_measure``, ``covering``; their conventions: index 0
  is a change point of every annotation and of the prediction, precision is against the
  union of the annotations, recall is averaged over annotators, each true point is matched
  at most once, margin 5), the detection delay (``detection_delays``) and false alarms per
  100,000 stationary observations.
- **Methods.** cusp (``service.detect.detect_series`` with ``DetectorConfig()``), and with
  their default settings, no per-series tuning: BOCPD (Adams & MacKay 2007; ``BOCPD``,
  here in numpy), River's ``ADWIN`` and ``PageHinkley`` and ruptures' ``Pelt`` and
  ``Binseg`` (offline: they see the whole series, an upper reference, not a peer).

Conventions this module owns: a *location* is the 0-based index of the first observation
after a change; *detected_at* is the number of observations a method had seen when it
reported the change (``None`` for offline methods). Locations outside ``[1, T-1]`` are
dropped before scoring (index 0 is a change point by convention anyway).
"""

from __future__ import annotations

import argparse
import bisect
import fnmatch
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.report import write_section

MARGIN = 5
SECTION = "## Change-point detection"
METHODS = ("cusp", "BOCPD", "ADWIN", "PageHinkley", "PELT", "BinSeg", "none")
ONLINE_PEERS = ("BOCPD", "ADWIN", "PageHinkley")
OFFLINE = ("PELT", "BinSeg")
#: ruptures' Pelt and Binseg search in pure Python (Pelt is close to quadratic on these
#: data: ~1.6 s at n = 2,000; Binseg ~17 s at n = 20,000 on the benchmark machine); longer
#: series are skipped and marked.
RUPTURES_MAX_N = {"PELT": 5_000, "BinSeg": 20_000}

#: TCPD annotations of the Nile series (alan-turing-institute/TCPD, annotations.json):
#: annotator id -> change locations; index 28 is 1899 (the Aswan dam, built from 1898).
NILE_ANNOTATIONS: dict[str, list[int]] = {"6": [], "7": [28], "8": [], "12": [28], "13": [28]}


def _log(msg: str) -> None:
    print(f"[bench detect {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# === metrics (van den Burg & Williams 2020, TCPDBench analysis/scripts/metrics.py) ==============


def true_positives(truth: Iterable[int], predictions: Iterable[int], margin: int = MARGIN) -> set[int]:
    """The true change points matched by a prediction within ``margin``; each prediction
    matches at most one true point (the closest prediction is used, the smaller on a tie;
    true points are visited in increasing order)."""
    left = set(predictions)
    tp: set[int] = set()
    for tau in sorted(set(truth)):
        close = sorted((abs(tau - x), x) for x in left if abs(tau - x) <= margin)
        if close:
            tp.add(tau)
            left.remove(close[0][1])
    return tp


def f_measure(annotations: Mapping[str, Iterable[int]], predictions: Iterable[int], margin: int = MARGIN,
              alpha: float = 0.5, return_pr: bool = False) -> float | tuple[float, float, float]:
    """F-measure (F1 for ``alpha=0.5``) of ``predictions`` against several annotators.

    annotations: annotator -> change locations; predictions: change locations. Index 0 is
    added to every annotation and to the predictions; precision = |TP(union of annotations,
    X)| / |X|; recall = mean over annotators of |TP(T_k, X)| / |T_k|.
    """
    if not annotations:
        raise ValueError("f_measure needs at least one annotator")
    tks = [set(a) | {0} for a in annotations.values()]
    x = set(predictions) | {0}
    union = set().union(*tks)
    p = len(true_positives(union, x, margin)) / len(x)
    r = sum(len(true_positives(tk, x, margin)) / len(tk) for tk in tks) / len(tks)
    f = p * r / (alpha * r + (1 - alpha) * p)
    return (f, p, r) if return_pr else f


def segments(locations: Iterable[int], n_obs: int) -> list[tuple[int, int]]:
    """The partition of ``[0, n_obs)`` that change ``locations`` induce, as half-open
    intervals ``(start, end)``; locations outside ``[1, n_obs - 1]`` start no segment."""
    cuts = sorted({int(c) for c in locations if 0 < c < n_obs})
    bounds = [0, *cuts, n_obs]
    return list(zip(bounds[:-1], bounds[1:]))


def cover_single(predicted: Sequence[tuple[int, int]], true: Sequence[tuple[int, int]]) -> float:
    """Covering of the segmentation ``true`` by ``predicted`` (Arbelaez et al. 2010, eq. 8):
    sum over true segments R of |R| max_R' Jaccard(R, R') / T. Both are sorted half-open
    interval partitions of the same range (``segments``)."""
    total = true[-1][1] - true[0][0]
    if predicted[-1][1] - predicted[0][0] != total:
        raise ValueError("the segmentations cover different ranges")
    starts = [a for a, _ in predicted]
    c = 0.0
    for a, b in true:
        best = 0.0
        # only predicted segments that intersect [a, b) have a non-zero Jaccard index
        for i in range(max(bisect.bisect_right(starts, a) - 1, 0), len(predicted)):
            pa, pb = predicted[i]
            if pa >= b:
                break
            inter = min(b, pb) - max(a, pa)
            if inter > 0:
                best = max(best, inter / ((b - a) + (pb - pa) - inter))
        c += (b - a) * best
    return c / total


def covering(annotations: Mapping[str, Iterable[int]], predictions: Iterable[int], n_obs: int) -> float:
    """Segmentation covering of each annotator's segmentation by the predicted one, averaged
    over annotators."""
    if not annotations:
        raise ValueError("covering needs at least one annotator")
    pred = segments(predictions, n_obs)
    return sum(cover_single(pred, segments(a, n_obs)) for a in annotations.values()) / len(annotations)


def detection_delays(changes: Sequence[int], detected_at: Iterable[int | None], n_obs: int) -> list[int | None]:
    """Per true change tau (sorted): ``detected_at - tau`` of the first report made after the
    method saw tau's row and before it saw a row of the next regime (``tau < detected_at <=
    next change``), ``None`` when there is none (missed)."""
    fired = sorted(d for d in detected_at if d is not None)
    bounds = [*changes, n_obs]
    out: list[int | None] = []
    for tau, nxt in zip(bounds[:-1], bounds[1:]):
        i = bisect.bisect_right(fired, tau)
        out.append(fired[i] - tau if i < len(fired) and fired[i] <= nxt else None)
    return out


# === data ==========================================================================================


@dataclass(frozen=True)
class Series:
    """One labelled series. data: ``[T, C]`` float64; changes: true change locations (for the
    delay; the union of the annotations for real series); annotations: annotator ->
    locations (synthetic: one annotator, the truth); spec / chunk: cusp's model and chunk
    size; data_key: series with the same data_key share the data (peers run once); kind:
    'labelled', 'stationary' or 'real'; group: the dataset it aggregates into over seeds."""

    key: str
    group: str
    title: str
    data: np.ndarray
    changes: tuple[int, ...]
    annotations: dict[str, list[int]]
    spec: str
    chunk: int
    kind: str = "labelled"
    data_key: str = ""
    seed: int = 0
    note: str = ""

    @property
    def n(self) -> int:
        return int(self.data.shape[0])


def _rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(tag), 0xDE7])


def mean_shift(seed: int, magnitude: float, n: int = 1000, changes: tuple[int, ...] = (400, 700)):
    """Univariate N(mean, 1), mean 0 -> ``magnitude`` -> 0 at ``changes``. Returns (data [n, 1], changes, spec, chunk)."""
    rng = _rng(seed, 1)
    mean = np.zeros(n)
    mean[changes[0]:changes[1]] = magnitude
    return (mean + rng.standard_normal(n))[:, None], list(changes), "gaussian", 25


def variance_shift(seed: int, sd_before: float, sd_after: float, n: int = 1000, change: int = 500):
    """Univariate N(0, sd^2), sd ``sd_before`` -> ``sd_after`` at ``change``."""
    rng = _rng(seed, 2)
    sd = np.where(np.arange(n) < change, sd_before, sd_after)
    return (sd * rng.standard_normal(n))[:, None], [change], "gaussian", 25


def multivariate_mean_shift(seed: int, n: int = 2000, dims: int = 5, changes: tuple[int, ...] = (800, 1400)):
    """``dims`` independent N(mean_j, 1): mean 0, then +1 in columns 0-1, then also -1 in columns 2-3."""
    rng = _rng(seed, 3)
    mean = np.zeros((n, dims))
    mean[changes[0]:, :2] = 1.0
    mean[changes[1]:, 2:4] = -1.0
    return mean + rng.standard_normal((n, dims)), list(changes), "gaussian", 50


def regression_change(seed: int, n: int = 3000, features: int = 3, changes: tuple[int, ...] = (1000, 2000),
                      step: float = 1.5):
    """y = w_k . x + b_k + N(0, 1) with x ~ N(0, I); (w, b) starts from the N(0, 1) prior and
    moves by a random vector of length ``step`` at each change. y is the last column."""
    rng = _rng(seed, 4)
    wb = rng.standard_normal(features + 1)
    x = rng.standard_normal((n, features))
    noise = rng.standard_normal(n)
    y = np.empty(n)
    bounds = [0, *changes, n]
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a > 0:
            d = rng.standard_normal(features + 1)
            wb = wb + step * d / np.linalg.norm(d)
        y[a:b] = x[a:b] @ wb[:features] + wb[features] + noise[a:b]
    return np.column_stack([x, y]), list(changes), "linear-regression", 50


def class_balance_change(seed: int, n: int = 3000, changes: tuple[int, ...] = (1000, 2000),
                         biases: tuple[float, ...] = (-1.5, 1.5, -0.5)):
    """Binary logistic data: x ~ N(0, I_2), P(y = 1) = sigmoid(x . (1, -1) + b_k); the bias b_k
    (so the class balance: about 25% -> 75% -> 40% ones) changes at ``changes``."""
    rng = _rng(seed, 5)
    x = rng.standard_normal((n, 2))
    b = np.full(n, biases[0])
    for c, v in zip(changes, biases[1:]):
        b[c:] = v
    p = 1 / (1 + np.exp(-(x @ np.array([1.0, -1.0]) + b)))
    y = (rng.random(n) < p).astype(np.float64)
    return np.column_stack([x, y]), list(changes), "logistic-regression:classes=2", 50


def stationary(seed: int, n: int, dims: int = 1):
    """``n`` rows of ``dims`` independent N(0, 1): no change."""
    return _rng(seed, 6 + dims).standard_normal((n, dims)), [], "gaussian", 100


def clusters(n: int = 100_000, shuffle: bool = False, seed: int = 0):
    """The paper's 3 -> 5 -> 7 clusters (changes at 1,000 and 10,000), or their seeded shuffle (no change)."""
    from bench import data as D

    x, changes = D.distribution_shift_data(n, seed)
    if shuffle:
        return D.shuffled(x, seed).numpy(), []
    return x.numpy(), changes


def clusters_drop(before: int = 90_000, seed: int = 1):
    """The demo stream's rounds (``cusp serve --demo``): ``before`` rows of the paper's 7 clusters
    (a round's last 90,000), then a new round, 3 of them (1,000 rows), 5 (9,000), all 7 again
    (20,000). Clusters that drop out of the data leave a mixture's log predictive per observation
    where it was (the rows lose to the weights what they gain in entropy): changes at ``before``,
    + 1,000 and + 10,000."""
    from bench import data as D

    seven = D.distribution_shift_data(before + 2, seed, changes=(1, 2))[0].numpy()[2:]
    new_round = D.distribution_shift_data(30_000, seed + 1)[0].numpy()
    return np.concatenate([seven, new_round]), [before, before + 1_000, before + 10_000]


def _labelled(key: str, group: str, title: str, made, seed: int, kind: str = "labelled", chunk: int | None = None,
              data_key: str | None = None, note: str = "") -> Series:
    data, changes, spec, default_chunk = made
    ch = tuple(int(c) for c in changes)
    return Series(key=key, group=group, title=title, data=np.ascontiguousarray(data, dtype=np.float64), changes=ch,
                  annotations={"truth": list(ch)}, spec=spec, chunk=chunk or default_chunk,
                  kind="stationary" if not ch else kind, data_key=data_key or f"{group}#s{seed}", seed=seed, note=note)


def suite(quick: bool = False, seeds: int | None = None, cluster_components: Sequence[int] | None = None) -> list[Series]:
    """The synthetic suite. Full: 3 data seeds (``seeds``) for every generated series, the
    stationary stretches included; the paper's clusters once (their own seed 0) for each GMM
    size in ``cluster_components`` (default 3, 5, 7). Quick: one seed, shorter stationary
    stretches and the clusters cut to 20,000 rows (both changes inside) with K = 5 only."""
    from bench import data as D

    nseeds = seeds or (1 if quick else 3)
    out: list[Series] = []
    for s in range(nseeds):
        short = [
            ("mean-1", "mean shift 0 -> 1 -> 0 sd (n = 1,000)", mean_shift(s, 1.0)),
            ("mean-2", "mean shift 0 -> 2 -> 0 sd (n = 1,000)", mean_shift(s, 2.0)),
            ("mean-4", "mean shift 0 -> 4 -> 0 sd (n = 1,000)", mean_shift(s, 4.0)),
            ("var-up", "variance up, sd 1 -> 3 (n = 1,000)", variance_shift(s, 1.0, 3.0)),
            ("var-down", "variance down, sd 3 -> 1 (n = 1,000)", variance_shift(s, 3.0, 1.0)),
        ]
        for key, title, made in short:
            out.append(_labelled(key, key, title + ", chunks of 25", made, s))
            out.append(_labelled(f"{key}/pointwise", f"{key}/pointwise", title + ", point by point", made, s, chunk=1,
                                 data_key=f"{key}#s{s}"))
        out.append(_labelled("mv-mean", "mv-mean", "5-D mean shift (2 columns, then 2 more; n = 2,000), chunks of 50",
                             multivariate_mean_shift(s), s))
        out.append(_labelled("regression", "regression", "linear regression, coefficients move (n = 3,000), chunks of 50",
                             regression_change(s), s))
        out.append(_labelled("class-balance", "class-balance",
                             "logistic regression, class balance ~25% -> 75% -> 40% (n = 3,000), chunks of 50",
                             class_balance_change(s), s))
        # changes off the chunk grid: a sampled model's change placed at a row, not at its chunk's
        # first one (``Detector._within``; drawn here, not tuned: tag 0x0FF)
        r = _rng(s, 0x0FF)
        c = (int(r.integers(801, 1200)), int(r.integers(1801, 2200)))
        out.append(_labelled("class-balance/off-grid", "class-balance/off-grid",
                             "logistic regression, class balance ~25% -> 75% -> 40% at rows drawn in 801-1,199 and "
                             "1,801-2,199 (n = 3,000), chunks of 50", class_balance_change(s, changes=c), s))
        if not quick:
            c = (int(r.integers(801, 1800)), int(r.integers(3001, 4500)))
            x, c = D.distribution_shift_data(6_000, s, changes=c)
            out.append(_labelled("clusters-off-grid/K=5", "clusters-off-grid/K=5",
                                 "the paper's 3 -> 5 -> 7 clusters at rows drawn in 801-1,799 and 3,001-4,499 (n = 6,000), "
                                 "chunks of 500, GMM K = 5", (x.numpy(), c, "gmm:components=5", 500), s))
        n1 = 20_000 if quick else 100_000
        out.append(_labelled("stationary-1d", "stationary-1d", f"N(0, 1), no change (n = {n1:,}), chunks of 100",
                             stationary(s, n1), s))
        n1p = 1_000 if quick else 2_000
        out.append(_labelled("stationary-1d/pointwise", "stationary-1d/pointwise",
                             f"N(0, 1), no change (n = {n1p:,}), point by point", stationary(s, n1p), s, chunk=1))
        n5 = 10_000 if quick else 50_000
        out.append(_labelled("stationary-5d", "stationary-5d", f"N(0, I_5), no change (n = {n5:,}), chunks of 100",
                             stationary(s, n5, 5), s))
    ks = list(cluster_components or ((5,) if quick else (3, 5, 7)))
    n = 20_000 if quick else 100_000
    for shuffle in (False, True):
        x, changes = clusters(n, shuffle)
        name = "clusters-shuffled" if shuffle else "clusters"
        for k in ks:
            what = "the same rows shuffled (no change)" if shuffle else "3 -> 5 -> 7 clusters (changes at 1,000 and 10,000)"
            out.append(_labelled(f"{name}/K={k}", f"{name}/K={k}", f"paper: {what}, n = {n:,}, chunks of 500, GMM K = {k}",
                                 (x, changes, f"gmm:components={k}", 500), 0, data_key=f"{name}#s0"))
    x, changes = clusters_drop(5_000 if quick else 90_000)
    for k in ks:
        out.append(_labelled(f"clusters-drop/K={k}", f"clusters-drop/K={k}",
                             f"the demo's rounds: 7 clusters, then 3, 5 and 7 of them again (changes at {changes[0]:,}, "
                             f"{changes[1]:,}, {changes[2]:,}; n = {x.shape[0]:,}), chunks of 500, GMM K = {k}",
                             (x, changes, f"gmm:components={k}", 500), 1, data_key="clusters-drop#s1"))
    return out


def standardise(x: np.ndarray) -> np.ndarray:
    """TCPDBench's normalisation (``cpdbench_utils.load_dataset``): per column, subtract the
    mean and divide by the sample standard deviation (ddof 1), NaNs ignored."""
    sd = np.sqrt(np.nanvar(x, axis=0, ddof=1))
    return (x - np.nanmean(x, axis=0)) / np.where(sd > 0, sd, 1.0)


def nile_series() -> Series:
    """The Nile's annual flow at Aswan, 1871-1970 (statsmodels), standardised as TCPDBench
    does, with the TCPD annotations; cusp: its default for a univariate stream (the portfolio of
    ``models.registry.default_portfolio``, model-averaged), point by point."""
    from statsmodels.datasets import nile

    raw = nile.load_pandas().data["volume"].to_numpy(dtype=np.float64)
    ann = {k: list(v) for k, v in NILE_ANNOTATIONS.items()}
    changes = tuple(sorted(set().union(*map(set, ann.values()))))
    return Series(key="nile", group="nile", title="Nile flow at Aswan 1871-1970 (statsmodels; TCPD annotations)",
                  data=standardise(raw[:, None]), changes=changes, annotations=ann, spec="default", chunk=1,
                  kind="real", data_key="nile")


# --- TCPD format ---------------------------------------------------------------------------------


def read_tcpd_dataset(path: str | Path) -> tuple[str, np.ndarray, list[str]]:
    """One TCPD data set file: ``{"name", "n_obs", "time": {...}, "series": [{"label", "type",
    "raw": [...]}, ...]}``. Returns (name, data ``[n_obs, len(series)]`` float64 as stored,
    missing values (null / NaN) carried forward, leading ones back; the column labels)."""
    obj = json.loads(Path(path).read_text())
    if not isinstance(obj, dict) or "series" not in obj or "n_obs" not in obj:
        raise ValueError(f"{path}: not a TCPD data set (needs 'n_obs' and 'series')")
    n = int(obj["n_obs"])
    cols, labels = [], []
    for j, s in enumerate(obj["series"]):
        raw = s.get("raw")
        if not isinstance(raw, list) or len(raw) != n:
            raise ValueError(f"{path}: series {j} has {len(raw) if isinstance(raw, list) else 'no'} values, n_obs is {n}")
        cols.append(np.array([np.nan if v is None else float(v) for v in raw], dtype=np.float64))
        labels.append(str(s.get("label", f"V{j + 1}")))
    if not cols:
        raise ValueError(f"{path}: no series")
    x = np.column_stack(cols)
    for j in range(x.shape[1]):
        col = x[:, j]
        ok = np.isfinite(col)
        if not ok.any():
            raise ValueError(f"{path}: series {j} has no finite value")
        if not ok.all():
            idx = np.where(ok, np.arange(n), 0)
            np.maximum.accumulate(idx, out=idx)
            first = int(np.argmax(ok))
            col[:] = np.where(np.arange(n) < first, col[first], col[idx])
    return str(obj.get("name") or Path(path).stem), x, labels


def read_tcpd(directory: str | Path) -> list[Series]:
    """Every TCPD data set under ``directory`` (``*.json`` at any depth, e.g. TCPD's
    ``datasets/NAME/NAME.json``) that ``annotations.json`` (anywhere under it; series name ->
    annotator id -> locations) annotates, standardised as TCPDBench does. cusp: its default
    for a stream of that width (``models.registry.default_portfolio``, model-averaged), point by point."""
    root = Path(directory)
    ann_files = sorted(root.rglob("annotations.json"), key=lambda p: len(p.parts))
    if not ann_files:
        raise FileNotFoundError(f"{root}: no annotations.json")
    annotations = json.loads(ann_files[0].read_text())
    out: list[Series] = []
    for path in sorted(root.rglob("*.json")):
        if path.name == "annotations.json":
            continue
        try:
            name, x, _ = read_tcpd_dataset(path)
        except (ValueError, json.JSONDecodeError):
            continue  # other JSON files (results, metadata) in the tree
        if name not in annotations:
            _log(f"{path}: no annotations for {name!r}; skipped")
            continue
        ann = {str(k): sorted({int(i) for i in v}) for k, v in annotations[name].items()}
        changes = tuple(sorted(set().union(*map(set, ann.values())) - {0})) if ann else ()
        out.append(Series(key=f"tcpd:{name}", group=f"tcpd:{name}", title=f"TCPD {name} ({root.name})",
                          data=standardise(x), changes=changes, annotations=ann, spec="default", chunk=1, kind="real",
                          data_key=f"tcpd:{path}"))
    return out


def write_tcpd(directory: str | Path, name: str, data: np.ndarray, annotations: Mapping[str, Sequence[int]],
               labels: Sequence[str] | None = None, time_raw: Sequence[str] | None = None) -> Path:
    """Write ``data [n, d]`` as ``DIR/datasets/NAME/NAME.json`` in TCPD's format and merge its
    annotations into ``DIR/annotations.json`` (for fixtures and small labelled sets)."""
    root = Path(directory)
    x = np.asarray(data)
    x = x[:, None] if x.ndim == 1 else x
    n, d = x.shape
    integral = bool(np.all(np.isfinite(x)) and np.all(x == np.round(x)))
    obj = {
        "name": name, "longname": name, "n_obs": n, "n_dim": d,
        "time": {"type": "string", "format": "%Y", "index": list(range(n)), "raw": list(time_raw)} if time_raw else
        {"index": list(range(n))},
        "series": [{"label": (labels[j] if labels else f"V{j + 1}"), "type": "int" if integral else "float",
                    "raw": [int(v) if integral else (float(v) if np.isfinite(v) else None) for v in x[:, j]]}
                   for j in range(d)],
    }
    path = root / "datasets" / name / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent="\t") + "\n")
    ann_path = root / "annotations.json"
    ann = json.loads(ann_path.read_text()) if ann_path.exists() else {}
    ann[name] = {str(k): [int(i) for i in v] for k, v in annotations.items()}
    ann_path.write_text(json.dumps(ann, indent="\t", sort_keys=True) + "\n")
    return path


# === peers ==========================================================================================


@dataclass
class Outcome:
    """One method on one series: locations and when each was reported, wall time, what the
    method saw ('note'), or why it did not run ('skipped') / failed ('error')."""

    method: str
    locations: list[int] = field(default_factory=list)
    detected_at: list[int | None] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""
    skipped: str = ""
    error: str = ""
    #: cusp only: each event's confidence, and (observations seen, running log-evidence) per chunk
    confidences: list[float] = field(default_factory=list)
    evidence: list[tuple[int, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.skipped or self.error)


class BOCPD:
    """Bayesian online change-point detection (Adams & MacKay 2007) with independent Gaussian
    columns, unknown mean and variance, Normal-Gamma prior (so a Student-t predictive),
    constant hazard. Protocol: ``update(x [C])``, then read ``change_detected`` and
    ``location``.

    The run length r is the number of observations of the current segment including the
    newest; a change is reported when the MAP run length does not grow by one (it *drops*),
    at location t - r_MAP + 1 (t: the newest row's index), unless that location was reported
    already. Run lengths whose posterior falls below exp(``prune``) times the largest, and
    all but the ``max_runs`` most probable, are dropped.
    """

    def __init__(self, hazard: float = 1 / 100, mu0: float = 0.0, kappa0: float = 1.0, alpha0: float = 1.0,
                 beta0: float = 1.0, prune: float = -20.0, max_runs: int = 1000):
        self.hazard, self.mu0, self.kappa0, self.alpha0, self.beta0 = hazard, mu0, kappa0, alpha0, beta0
        self.prune, self.max_runs = prune, max_runs
        self._reset()

    def _reset(self) -> None:
        self.t = -1
        self.change_detected = False
        self.location: int | None = None
        self._last_reported = 0
        self._map = 0
        self._runs = np.zeros(0, dtype=np.int64)  # [K] run lengths
        self._logp = np.zeros(0)  # [K] log posterior of the run lengths, normalised
        self._mu = self._beta = np.zeros((0, 0))  # [K, C]
        self._lgt = np.zeros(0)  # lgamma(a + 1/2) - lgamma(a) for a = alpha0 + r / 2, by r

    def _gamma_ratio(self, runs: np.ndarray) -> np.ndarray:
        need = int(runs.max()) + 1 if runs.size else 1
        if need > self._lgt.size:
            from scipy.special import gammaln

            a = self.alpha0 + 0.5 * np.arange(max(need, 2 * self._lgt.size, 1024))
            self._lgt = gammaln(a + 0.5) - gammaln(a)
        return self._lgt[runs]

    def _log_predictive(self, x: np.ndarray, runs: np.ndarray, mu: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """Student-t log density of x [C] under each run's posterior; returns [K]."""
        kappa = (self.kappa0 + runs)[:, None]
        alpha = (self.alpha0 + 0.5 * runs)[:, None]
        nu = 2 * alpha
        s2 = beta * (kappa + 1) / (alpha * kappa)
        z = (x[None, :] - mu) ** 2 / (nu * s2)
        per = self._gamma_ratio(runs)[:, None] - 0.5 * np.log(nu * math.pi * s2) - 0.5 * (nu + 1) * np.log1p(z)
        return per.sum(1)

    def update(self, x) -> "BOCPD":
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        self.t += 1
        self.change_detected, self.location = False, None
        c = x.size
        prior_mu, prior_beta = np.full((1, c), self.mu0), np.full((1, c), self.beta0)
        zero = np.zeros(1, dtype=np.int64)
        new_lp = self._log_predictive(x, zero, prior_mu, prior_beta)
        if self._runs.size == 0:
            runs, logp, mu, beta = zero, np.zeros(1), prior_mu, prior_beta
        else:
            grow = self._logp + math.log1p(-self.hazard) + self._log_predictive(x, self._runs, self._mu, self._beta)
            cp = math.log(self.hazard) + new_lp
            runs = np.concatenate([zero, self._runs])
            logp = np.concatenate([cp, grow])
            mu = np.concatenate([prior_mu, self._mu])
            beta = np.concatenate([prior_beta, self._beta])
        # conjugate update of every run with x: the run lengths grow by one
        kappa = (self.kappa0 + runs)[:, None]
        d = x[None, :] - mu
        beta = beta + kappa * d * d / (2 * (kappa + 1))
        mu = mu + d / (kappa + 1)
        runs = runs + 1
        logp = logp - np.logaddexp.reduce(logp)
        keep = logp >= logp.max() + self.prune
        if keep.sum() > self.max_runs:
            keep &= logp >= np.sort(logp)[-self.max_runs]
        self._runs, self._logp, self._mu, self._beta = runs[keep], logp[keep], mu[keep], beta[keep]
        r_map = int(self._runs[int(np.argmax(self._logp))])
        if self.t > 0 and r_map <= self._map:
            loc = self.t - r_map + 1
            if loc > self._last_reported:
                self.change_detected, self.location, self._last_reported = True, loc, loc
        self._map = r_map
        return self


def run_bocpd(data: np.ndarray, hazard: float = 1 / 100) -> Outcome:
    det = BOCPD(hazard=hazard)
    out = Outcome("BOCPD", note="all columns, independent Gaussians" if data.shape[1] > 1 else "")
    for t in range(data.shape[0]):
        det.update(data[t])
        if det.change_detected:
            out.locations.append(int(det.location))
            out.detected_at.append(t + 1)
    return out


def _merge_columns(found: list[tuple[int, int]], margin: int = MARGIN) -> tuple[list[int], list[int]]:
    """Union of per-column reports (detected_at, location), in the order they fire; a report
    whose location is within ``margin`` of one already kept (another column's) is dropped."""
    locs: list[int] = []
    ats: list[int] = []
    for at, loc in sorted(found):
        if all(abs(loc - k) > margin for k in locs):
            locs.append(loc)
            ats.append(at)
    return locs, ats


def run_river(name: str, data: np.ndarray) -> Outcome:
    """River's ADWIN or PageHinkley with default settings, one detector per column. ADWIN's
    location is the start of its window right after the detection (it drops the part before
    the change); PageHinkley has no location estimate: the row where it fired."""
    from river import drift

    found: list[tuple[int, int]] = []
    for j in range(data.shape[1]):
        det = drift.ADWIN() if name == "ADWIN" else drift.PageHinkley()
        col = data[:, j].tolist()
        for t, v in enumerate(col):
            det.update(v)
            if det.drift_detected:
                loc = t + 1 - int(det.width) if name == "ADWIN" else t
                found.append((t + 1, max(loc, 1)))
    locs, ats = _merge_columns(found)
    note = f"one per column ({data.shape[1]}), union" if data.shape[1] > 1 else ""
    return Outcome(name, locs, list(ats), note=note)


def ruptures_penalty(data: np.ndarray) -> float:
    """BIC penalty for ruptures' l2 cost (a sum of squared residuals, so -2 log-likelihood
    times sigma^2): (C + 1) log(T) sigma^2 per change (C means and one location), sigma^2
    the mean over columns of a robust noise variance (MAD of first differences / 0.6745,
    squared, halved)."""
    n, c = data.shape
    d = np.diff(data, axis=0)
    mad = np.median(np.abs(d - np.median(d, axis=0)), axis=0) / 0.6745
    sigma2 = float(np.mean(mad**2 / 2)) if n > 2 else 1.0
    return math.log(n) * (c + 1) * max(sigma2, 1e-12)


def run_ruptures(name: str, data: np.ndarray) -> Outcome:
    """ruptures' ``Pelt`` or ``Binseg`` with their defaults (cost 'l2', min_size 2, jump 5)
    and the BIC-like penalty; offline: they see the whole series."""
    if data.shape[0] > RUPTURES_MAX_N[name]:
        return Outcome(name, skipped=f"n > {RUPTURES_MAX_N[name]:,} (pure-Python search too slow)")
    import ruptures as rpt

    algo = rpt.Pelt() if name == "PELT" else rpt.Binseg()
    bkps = algo.fit(data).predict(pen=ruptures_penalty(data))
    locs = [int(b) for b in bkps if 0 < b < data.shape[0]]
    return Outcome(name, locs, [None] * len(locs), note="l2 cost (mean changes)")


def run_cusp(series: Series, seed: int = 0) -> Outcome:
    """cusp's detector with its default settings over the series in chunks of ``series.chunk``;
    spec 'default' (or several specs joined by '+'): a stream of those models, its model-averaged
    change points (``service.detect.detect_stream``)."""
    import torch

    from service.detect import DetectorConfig, detect_series, detect_stream

    torch.set_num_threads(1)
    if series.spec == "default" or "+" in series.spec:
        specs = None if series.spec == "default" else series.spec.split("+")
        per_model, found = detect_stream(series.data, specs, chunk_size=series.chunk, seed=seed, config=DetectorConfig())
        note = ", ".join(f"{m}: {len(ev)}" for m, ev in per_model.items())
        return Outcome("cusp", [int(c.location) for c in found], [int(c.detected_at) for c in found],
                       note=f"{series.spec} (per model: {note}), chunks of {series.chunk}",
                       confidences=[float(c.confidence) for c in found])
    evidence: list[tuple[int, float]] = []
    events = detect_series(series.data, series.spec, chunk_size=series.chunk, seed=seed, config=DetectorConfig(),
                           on_chunk=lambda r, _: evidence.append((r.n, r.log_evidence)))
    return Outcome("cusp", [int(e.location) for e in events], [int(e.detected_at) for e in events],
                   note=f"{series.spec}, chunks of {series.chunk}", confidences=[float(e.confidence) for e in events],
                   evidence=evidence)


def cusp_available() -> str:
    """'' when ``service.detect.detect_series`` can be imported, else why not."""
    try:
        from service.detect import DetectorConfig, detect_series  # noqa: F401
    except Exception as exc:  # ImportError, or the module being half-written
        return f"service.detect not available ({type(exc).__name__}: {exc})"
    return ""


def run_method(method: str, series: Series) -> Outcome:
    """Run one method on one series, timed; failures are caught and recorded."""
    t0 = time.perf_counter()
    try:
        if method == "cusp":
            why = cusp_available()
            out = Outcome("cusp", skipped=why) if why else run_cusp(series)
        elif method == "BOCPD":
            out = run_bocpd(series.data)
        elif method in ("ADWIN", "PageHinkley"):
            out = run_river(method, series.data)
        elif method in OFFLINE:
            out = run_ruptures(method, series.data)
        elif method == "none":  # the baseline every method must beat: no change at all
            out = Outcome("none", [], [])
        else:
            raise KeyError(method)
    except Exception as exc:  # noqa: BLE001 - a failing method is a result, not a crash
        out = Outcome(method, error=f"{type(exc).__name__}: {exc}")
    out.seconds = time.perf_counter() - t0
    # keep [1, T-1], first report of each location
    seen: set[int] = set()
    locs, ats = [], []
    for loc, at in zip(out.locations, out.detected_at):
        if 0 < loc < series.n and loc not in seen:
            seen.add(loc)
            locs.append(loc)
            ats.append(at)
    out.locations, out.detected_at = locs, ats
    return out


# === scoring ========================================================================================


def score(series: Series, out: Outcome) -> dict:
    """F1 (with precision and recall), covering, delays, false alarms of one outcome."""
    if not out.ok:
        return {"ok": False}
    f, p, r = f_measure(series.annotations, out.locations, MARGIN, return_pr=True)
    matched = true_positives(series.changes, out.locations, MARGIN) if series.changes else set()
    online = all(a is not None for a in out.detected_at)
    return {
        "ok": True,
        "f1": f, "precision": p, "recall": r,
        "cover": covering(series.annotations, out.locations, series.n),
        "n_pred": len(out.locations),
        "false_alarms": len(out.locations) - len(matched),
        "fa_per_100k": (len(out.locations) - len(matched)) * 1e5 / series.n,
        "delays": detection_delays(series.changes, out.detected_at, series.n) if online and series.kind != "real" else None,
    }


@dataclass
class Result:
    series: Series
    outcomes: dict[str, Outcome]
    scores: dict[str, dict]


def _warm_up(methods: Sequence[str]) -> None:
    """Import what the methods need (and run cusp once on a few rows) before anything is timed."""
    if any(m in methods for m in ("ADWIN", "PageHinkley")):
        from river import drift  # noqa: F401
    if any(m in methods for m in OFFLINE):
        import ruptures  # noqa: F401
    if "BOCPD" in methods:
        run_bocpd(np.zeros((3, 1)))
    if "cusp" in methods and not cusp_available():
        run_cusp(Series("warm-up", "warm-up", "", np.zeros((20, 1)), (), {"truth": []}, "gaussian", 10))


def evaluate(series_list: Sequence[Series], methods: Sequence[str] = METHODS,
             progress: Callable[[str], None] = _log) -> list[Result]:
    """Run every method on every series (peers once per ``data_key``) and score them."""
    _warm_up(methods)
    cache: dict[tuple[str, str], Outcome] = {}
    results = []
    for s in series_list:
        outs: dict[str, Outcome] = {}
        for m in methods:
            key = (s.data_key or s.key, m)
            if m != "cusp" and key in cache:
                outs[m] = cache[key]
                continue
            o = run_method(m, s)
            cache[key] = o
            outs[m] = o
            state = o.error or o.skipped or f"{len(o.locations)} change(s)"
            progress(f"{s.key} (seed {s.seed}, n={s.n:,}): {m}: {state} in {o.seconds:.2f} s")
        results.append(Result(s, outs, {m: score(s, o) for m, o in outs.items()}))
    return results


def aggregate(results: Sequence[Result], methods: Sequence[str] = METHODS) -> dict[str, dict]:
    """Per group (dataset over seeds): per method mean F1, covering, detection rate, mean
    delay over the detected changes, false alarms per 100k, total seconds, runs."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.series.group, []).append(r)
    agg: dict[str, dict] = {}
    for g, rs in groups.items():
        s0 = rs[0].series
        row = {"title": s0.title, "kind": s0.kind, "n": s0.n, "chunk": s0.chunk, "spec": s0.spec, "seeds": len(rs),
               "changes": list(s0.changes), "methods": {}}
        for m in methods:
            sc = [r.scores[m] for r in rs if m in r.scores]
            outs = [r.outcomes[m] for r in rs if m in r.outcomes]
            if not sc:
                continue
            okd = [x for x in sc if x.get("ok")]
            entry: dict = {"runs": len(okd), "seconds": sum(o.seconds for o in outs),
                           "note": next((o.note for o in outs if o.note), ""),
                           "skipped": next((o.skipped for o in outs if o.skipped), ""),
                           "error": next((o.error for o in outs if o.error), "")}
            if okd:
                entry.update({k: float(np.mean([x[k] for x in okd])) for k in
                              ("f1", "precision", "recall", "cover", "n_pred", "false_alarms", "fa_per_100k")})
                delays = [d for x in okd if x["delays"] is not None for d in x["delays"]]
                if any(x["delays"] is not None for x in okd):
                    hit = [d for d in delays if d is not None]
                    entry["detected"] = (len(hit), len(delays))
                    entry["delay"] = float(np.mean(hit)) if hit else None
            row["methods"][m] = entry
        agg[g] = row
    return agg


# === the paper's experiment ==========================================================================


def paper_summary(results: Sequence[Result]) -> list[dict]:
    """For each K: cusp's events on the in-order clusters (location error and delay per true
    change; whether both are found within one chunk) and the false alarms in order and on
    the shuffled rows."""
    rows = []
    by_key = {r.series.key: r for r in results}
    for key, r in by_key.items():
        if not key.startswith("clusters/"):
            continue
        k = key.split("=", 1)[1]
        shuf = by_key.get(f"clusters-shuffled/K={k}")
        o = r.outcomes.get("cusp")
        row: dict = {"K": k, "chunk": r.series.chunk, "n": r.series.n, "ok": bool(o and o.ok),
                     "why": (o.skipped or o.error) if o else "not run"}
        if o and o.ok:
            per = []
            for tau in r.series.changes:
                # the closest event by location, its delay
                cand = sorted(zip(o.locations, o.detected_at), key=lambda e: (abs(e[0] - tau), e[1]))
                if cand and abs(cand[0][0] - tau) <= r.series.chunk:
                    per.append({"tau": tau, "location": cand[0][0], "detected_at": cand[0][1],
                                "delay": cand[0][1] - tau})
                else:
                    per.append({"tau": tau, "location": None, "detected_at": None, "delay": None})
            row["changes"] = per
            row["within_chunk"] = all(p["location"] is not None for p in per)
            row["events"] = len(o.locations)
            row["false_alarms"] = sum(all(abs(loc - t) > r.series.chunk for t in r.series.changes) for loc in o.locations)
        so = shuf.outcomes.get("cusp") if shuf else None
        row["shuffled_alarms"] = len(so.locations) if so and so.ok else None
        row["seconds"] = (o.seconds if o else 0.0, so.seconds if so else 0.0)
        rows.append(row)
    averaged = _model_averaged_row(by_key)
    return rows + ([averaged] if averaged else [])


def _stream_changes(by_key: Mapping[str, Result], prefix: str):
    """``service.detect.model_averaged_changes`` over the GMMs run on one data set (keys
    ``prefix`` + 'K=k'): the stream's change points when all of them watch it; None when fewer
    than two ran."""
    from service.detect import Event, model_averaged_changes

    runs = {k.split("/", 1)[1]: r for k, r in by_key.items() if k.startswith(prefix)}
    outs = {m: r.outcomes.get("cusp") for m, r in runs.items()}
    if len(outs) < 2 or not all(o and o.ok and o.evidence for o in outs.values()):
        return None, runs

    def ev(o: Outcome) -> list[Event]:
        return [Event(location=loc, chunk=loc, seq=0, detected_at=at, delay=at - loc, confidence=c, log_bayes_factor=0.0,
                      log_prior_odds=0.0, adapted=True) for loc, at, c in zip(o.locations, o.detected_at, o.confidences)]

    chunk = next(iter(runs.values())).series.chunk
    return model_averaged_changes({m: ev(o) for m, o in outs.items()},
                                  {m: [tuple(p) for p in o.evidence] for m, o in outs.items()}, window=chunk), runs


def _model_averaged_row(by_key: Mapping[str, Result]) -> dict | None:
    """The paper's experiment at the stream level: the GMMs' events weighted by their posterior
    probabilities (``service.detect.model_averaged_changes``), as a row of ``paper_summary``."""
    found, runs = _stream_changes(by_key, "clusters/")
    if found is None:
        return None
    shuffled, _ = _stream_changes(by_key, "clusters-shuffled/")
    series = next(iter(runs.values())).series
    per = []
    for tau in series.changes:
        near = [c for c in found if abs(c.location - tau) <= series.chunk]
        c = min(near, key=lambda c: (abs(c.location - tau), c.detected_at)) if near else None
        per.append({"tau": tau, "location": c.location if c else None, "detected_at": c.detected_at if c else None,
                    "delay": c.detected_at - tau if c else None,
                    "support": {m: round(p, 4) for m, (p, _) in c.support.items()} if c else None})
    return {"K": ", ".join(sorted(runs, key=lambda m: int(m.split("=")[1]))).replace("K=", "") + " (model-averaged)",
            "chunk": series.chunk, "n": series.n, "ok": True, "why": "", "changes": per,
            "within_chunk": all(p["location"] is not None for p in per), "events": len(found),
            "false_alarms": sum(all(abs(c.location - t) > series.chunk for t in series.changes) for c in found),
            "shuffled_alarms": None if shuffled is None else len(shuffled),
            "seconds": (sum(r.outcomes["cusp"].seconds for r in runs.values()),
                        sum(r.outcomes["cusp"].seconds for k, r in by_key.items() if k.startswith("clusters-shuffled/")))}


# === report ==========================================================================================


def _f(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _cell(entry: dict | None, key: str, digits: int = 2) -> str:
    if entry is None:
        return "—"
    if entry.get("skipped"):
        return "skipped"
    if entry.get("error"):
        return "error"
    return _f(entry.get(key), digits)


def _bold_best(cells: list[str], values: list[float | None]) -> list[str]:
    vals = [v for v in values if v is not None]
    if not vals:
        return cells
    best = max(vals)
    return [f"**{c}**" if v is not None and abs(v - best) < 1e-12 else c for c, v in zip(cells, values)]


def targets(agg: Mapping[str, dict], methods: Sequence[str]) -> list[dict]:
    """Per labelled or real dataset: cusp's F1 and covering against the best online peer and
    against predicting no change at all ('none', when it ran)."""
    rows = []
    for g, row in agg.items():
        if row["kind"] == "stationary":
            continue
        c = row["methods"].get("cusp")
        peers = [(m, row["methods"][m]) for m in ONLINE_PEERS + ("none",) if m in methods and m in row["methods"]
                 and row["methods"][m].get("f1") is not None]
        if not c or c.get("f1") is None or not peers:
            rows.append({"group": g, "ok": None})
            continue
        bf = max(peers, key=lambda p: p[1]["f1"])
        bc = max(peers, key=lambda p: p[1]["cover"])
        rows.append({"group": g, "f1": c["f1"], "cover": c["cover"], "peer_f1": (bf[0], bf[1]["f1"]),
                     "peer_cover": (bc[0], bc[1]["cover"]),
                     "ok": c["f1"] >= bf[1]["f1"] - 1e-12 and c["cover"] >= bc[1]["cover"] - 1e-12})
    return rows


def render(results: Sequence[Result], methods: Sequence[str], *, quick: bool, elapsed: float, tcpd_dirs: Sequence[str],
           cusp_note: str = "", source: str = "") -> str:
    """The markdown section (starts with ``SECTION``)."""
    from bench.report import machine, markdown_table

    agg = aggregate(results, methods)
    m = machine()
    lines = [
        SECTION, "",
        f"Generated by `cusp bench detect{' --quick' if quick else ''}` (`bench/detect.py`) on {m['date']}; the run took "
        f"{elapsed / 60:.1f} minutes. Every method ran on the same data in the same process, one after the other, "
        "with one thread (`torch.set_num_threads(1)`).", "",
        f"- Machine (`lscpu`): {m.get('Model name', 'unknown')}, {m.get('CPU(s)', '?')} CPUs"
        + (f" ({m['Hypervisor vendor']} guest)" if "Hypervisor vendor" in m else "")
        + f"; Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}"
        + "".join(f", {k} {v}" for k, v in _versions().items()) + ".",
        f"- Load average (1/5/15 min) at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}; the machine is "
        "shared, so the times below are indicative only.",
        f"- Mode: {'quick (one data seed, shorter stationary stretches, clusters cut to 20,000 rows, K = 5 only)' if quick else 'full'}.",
        "- Metrics as in van den Burg & Williams (2020), TCPD: F1 with a margin of 5 observations (index 0 is a change "
        "point of every annotation and of every prediction; precision against the union of the annotations, recall "
        "averaged over annotators; each true point matched at most once) and segmentation covering (each annotator's "
        "segmentation covered by the predicted one, averaged over annotators). Synthetic series have one annotator: "
        "the truth. Values are means over data seeds.",
        "- Detection delay: observations seen after the change when the first report after it came (before any row of "
        "the next regime); *detected* counts changes with such a report. False alarms: reports not within 5 "
        "observations of a true change, scaled to 100,000 observations.",
        "- cusp: `service.detect.detect_series` with `DetectorConfig()` defaults, model and chunk size per data set; model "
        "`default`: the stream a user gets without a model list (`service.detect.detect_stream` over "
        "`models.registry.default_portfolio`: level, ar, trend, student-t and seasonal for one column), its model-averaged change points; "
        f"(below), sampler seed 0; detector source {source or _source_digest()}." + (f" **{cusp_note}**" if cusp_note else ""),
        "- Peers, default settings, no per-series tuning: **BOCPD** (Adams & MacKay 2007, `bench.detect.BOCPD`: "
        "independent Gaussian columns, Normal-Gamma prior mu0 = 0, kappa0 = 1, alpha0 = 1, beta0 = 1 (the same prior as "
        "cusp's `gaussian`), Student-t predictive, hazard 1/100, run lengths below e^-20 of the most probable pruned; a "
        "change is reported when the MAP run length drops, at the start of the new MAP run); River **ADWIN** "
        "(delta 0.002; location = start of its window after the detection) and **PageHinkley** (threshold 50, delta "
        "0.005, alpha 0.9999; location = the row where it fired), univariate: one detector per column, reports "
        "merged (a report within 5 of one already kept is dropped); ruptures **PELT** and **BinSeg** (cost l2, "
        "min_size 2, jump 5, BIC penalty (C + 1) log(T) sigma^2 with sigma^2 a robust noise variance from first "
        "differences): offline, they see the whole series: an upper reference, not a peer; l2 models mean changes "
        f"only; skipped above n = {RUPTURES_MAX_N['PELT']:,} (PELT) and {RUPTURES_MAX_N['BinSeg']:,} (BinSeg), where "
        "their pure-Python search takes minutes.",
        "- No peer has a regression model: on `regression` and `class-balance` (marked †) they see the columns as "
        "they are (features and target side by side), cusp fits the linear / logistic model.",
        "",
    ]
    # --- targets
    trows = targets(agg, methods)
    lines += ["### Target: cusp at least as good as every online peer and as no change (F1 and covering)", ""]
    tr = []
    for t in trows:
        if t["ok"] is None:
            tr.append([t["group"], "—", "—", "—", "—", "n/a"])
            continue
        tr.append([t["group"], _f(t["f1"]), f"{_f(t['peer_f1'][1])} ({t['peer_f1'][0]})", _f(t["cover"]),
                   f"{_f(t['peer_cover'][1])} ({t['peer_cover'][0]})", "**met**" if t["ok"] else "**missed**"])
    lines.append(markdown_table(["data set", "cusp F1", "best online peer or none F1", "cusp cover",
                                 "best online peer or none cover",
                                 "result"], tr, align="lrrrrc"))
    judged = [t for t in trows if t["ok"] is not None]
    if judged:
        lines.append(f"Met on {sum(t['ok'] for t in judged)} of {len(judged)} data sets.\n")
    # --- F1 and covering
    supervised = ("regression", "class-balance")
    for key, title in (("f1", "F1 (margin 5)"), ("cover", "Segmentation covering")):
        lines += [f"### {title}", ""]
        rows = []
        for g, row in agg.items():
            if row["kind"] == "stationary":
                continue
            vals = [row["methods"].get(mm, {}).get(key) if row["methods"].get(mm, {}).get("runs") else None
                    for mm in methods]
            cells = [_cell(row["methods"].get(mm), key) for mm in methods]
            online_vals = [v if mm not in OFFLINE else None for v, mm in zip(vals, methods)]
            cells = _bold_best(cells, online_vals)
            name = g + (" †" if g.split("/")[0] in supervised else "")
            rows.append([name, row["title"], row["spec"], row["seeds"], *cells])
        labelled = [row for row in agg.values() if row["kind"] == "labelled"]
        if labelled:
            means = []
            for mm in methods:
                vals = [row["methods"][mm][key] for row in labelled
                        if row["methods"].get(mm, {}).get("runs") and row["methods"][mm].get(key) is not None]
                part = "" if len(vals) == len(labelled) else f" ({len(vals)} of {len(labelled)})"
                means.append(f"{_f(float(np.mean(vals)))}{part}" if vals else "—")
            rows.append(["**mean**", "synthetic labelled data sets", "", "", *means])
        lines.append(markdown_table(["data set", "what", "cusp model", "seeds", *methods], rows,
                                    align="llll" + "r" * (len(methods))))
        lines.append("Bold: the best online method (cusp and the online peers; PELT and BinSeg are offline references). "
                     "The mean row averages the synthetic labelled data sets (over those a method ran on).\n")
    # --- delay
    lines += ["### Detection delay (observations; mean over detected changes, detected / true changes)", ""]
    online = [mm for mm in methods if mm not in OFFLINE]
    rows = []
    for g, row in agg.items():
        if row["kind"] != "labelled":
            continue
        cells = []
        for mm in online:
            e = row["methods"].get(mm)
            if not e or not e.get("runs"):
                cells.append(_cell(e, "delay"))
            elif e.get("detected"):
                h, t = e["detected"]
                cells.append(f"{_f(e.get('delay'), 1)} ({h}/{t})")
            else:
                cells.append("—")
        rows.append([g, row["chunk"], *cells])
    lines.append(markdown_table(["data set", "cusp chunk", *online], rows))
    lines.append("cusp reports at the end of a chunk, so its delay is at least the rest of the chunk holding the change. "
                 "The first report after a change may be a false alarm that happens to follow it: read the delay of a "
                 "method that fires often (see the false alarms below) with that in mind.\n")
    # --- false alarms
    lines += ["### False alarms on stationary data (per 100,000 observations; reports in total)", ""]
    rows = []
    for g, row in agg.items():
        if row["kind"] != "stationary":
            continue
        cells = []
        for mm in methods:
            e = row["methods"].get(mm)
            if not e or not e.get("runs"):
                cells.append(_cell(e, "fa_per_100k"))
            else:
                cells.append(f"{_f(e['fa_per_100k'], 1)} ({round(e['false_alarms'] * e['runs'])})")
        rows.append([g, f"{row['n']:,} x {row['seeds']}", row["chunk"], *cells])
    lines.append(markdown_table(["data set", "n x seeds", "cusp chunk", *methods], rows))
    rows = []
    for g, row in agg.items():
        if row["kind"] != "labelled":
            continue
        rows.append([g, *[_cell(row["methods"].get(mm), "false_alarms", 1) for mm in methods]])
    lines += ["False alarms on the labelled series (reports not within 5 of a true change; mean per series):", "",
              markdown_table(["data set", *methods], rows)]
    # --- paper
    lines += ["### The paper's experiment: 3 -> 5 -> 7 clusters (papers/001 section 6.2)", ""]
    prow = paper_summary(results)
    if not prow:
        lines.append("Not run.\n")
    rows = []
    for p in prow:
        if not p["ok"]:
            rows.append([p["K"], "—", "—", "—", "—", "—", p["why"]])
            continue
        locs = "; ".join(f"{c['tau']:,}: " + (f"at {c['location']:,}, reported at {c['detected_at']:,} "
                                              f"(delay {c['delay'] / p['chunk']:.1f} chunks)" if c["location"] is not None
                                              else "missed") for c in p["changes"])
        note = "; ".join(f"{c['tau']:,}: p = " + ", ".join(f"{m} {v:.3g}" for m, v in sorted(c["support"].items()))
                         for c in p["changes"] if c.get("support"))
        rows.append([p["K"], locs, "**yes**" if p["within_chunk"] else "**no**", p["false_alarms"],
                     "—" if p["shuffled_alarms"] is None else p["shuffled_alarms"],
                     f"{p['seconds'][0]:.0f} s / {p['seconds'][1]:.0f} s",
                     f"posterior probability of each supporting model at the report: {note}" if note else ""])
    if rows:
        lines.append(markdown_table(["GMM K", "true change: cusp's event", "both within one chunk",
                                     "other events in order", "events on the shuffled rows", "time in order / shuffled",
                                     "note"], rows, align="llcrrrl"))
        lines.append("The last row is the stream's answer when the three GMMs watch it together: each model's events "
                     "weighted by its posterior probability (`service.detect.model_averaged_changes`; a model without "
                     "an event near a change counts 0, so the confidence is a lower bound). A 3-component model cannot "
                     "tell 3 clusters becoming 5 from its own misfit (the old clusters are part of the new five, so its "
                     "restart honestly loses the Bayes factor); what its miss costs the stream is its posterior "
                     "probability, in the note.\n")
        lines.append(f"Target: both changes found within one chunk ({prow[0]['chunk']} rows: the event's location within "
                     "one chunk of the truth) and no event on the shuffled rows. The peers on the same rows: "
                     "`clusters/K=*` and `clusters-shuffled/K=*` in the tables above (their results do not depend on K).\n")
    # --- timing
    lines += ["### Time (seconds, all series and seeds)", ""]
    tot = {mm: 0.0 for mm in methods}
    counted: set[tuple[str, str]] = set()
    for r in results:
        for mm, o in r.outcomes.items():
            k = (r.series.data_key or r.series.key, mm)
            if mm != "cusp" and k in counted:
                continue
            counted.add(k)
            tot[mm] += o.seconds
    lines.append(markdown_table(methods, [[f"{tot[mm]:.1f}" for mm in methods]], align="r" * len(methods)))
    if tcpd_dirs:
        lines.append(f"TCPD directories scored: {', '.join(f'`{d}`' for d in tcpd_dirs)}.\n")
    return "\n".join(lines).rstrip() + "\n"


def _source_digest() -> str:
    """The detector's source (the ``service/detect/`` package) as it was imported: the first 12
    hex digits of the SHA-256 over its files, in name order."""
    import hashlib

    root = Path(__file__).resolve().parent.parent / "service" / "detect"
    try:
        h = hashlib.sha256()
        for path in sorted(root.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        return f"`service/detect/` sha256 {h.hexdigest()[:12]}"
    except OSError:
        return "unknown"


def _versions() -> dict[str, str]:
    out = {}
    for mod in ("river", "ruptures", "statsmodels", "scipy"):
        try:
            out[mod] = __import__(mod).__version__.lstrip("v")
        except Exception:  # noqa: BLE001
            out[mod] = "not installed"
    return out


# === command line ===================================================================================


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="one data seed, shorter stationary stretches, the clusters cut to 20,000 rows with K = 5 only")
    p.add_argument("--out", default="docs/benchmarks.md",
                   help="markdown report whose 'Change-point detection' section is written (default: docs/benchmarks.md)")
    p.add_argument("--tcpd", action="append", default=[], metavar="DIR",
                   help="also score every TCPD-format data set under DIR (annotations.json plus NAME.json files)")
    p.add_argument("--seeds", type=int, default=None, help="data seeds of the synthetic suite (default: 3, quick: 1)")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="run only the data sets whose key matches PATTERN (shell-style, repeatable), e.g. mean-2, "
                        "'mean-*', nile, 'tcpd:*', 'clusters*'")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--no-synthetic", action="store_true", help="skip the synthetic suite (real series only)")
    p.add_argument("--metrics", action="store_true",
                   help="also run the metric-series set (bench/metrics_suite.py: real series shipped with statsmodels "
                        "and river, and simulations of trends, seasons, counts, heavy tails, short series)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every outcome and score as JSON here")


def collect(args: argparse.Namespace) -> list[Series]:
    items: list[Series] = []
    if not args.no_synthetic:
        items += suite(args.quick, args.seeds)
    items.append(nile_series())
    if args.metrics:
        from bench.metrics_suite import metric_suite

        items += metric_suite(args.seeds or (1 if args.quick else 3))
    for d in args.tcpd:
        items += read_tcpd(d)
    if args.only:
        items = [s for s in items if any(fnmatch.fnmatchcase(s.key, p) for p in args.only)]
    return items


def _dump(results: Sequence[Result], path: str) -> None:
    rows = []
    for r in results:
        s = r.series
        rows.append({"key": s.key, "group": s.group, "seed": s.seed, "n": s.n, "chunk": s.chunk, "spec": s.spec,
                     "changes": list(s.changes), "annotations": s.annotations,
                     "methods": {m: {"locations": o.locations, "detected_at": o.detected_at, "seconds": o.seconds,
                                     "confidences": o.confidences, "evidence": o.evidence,
                                     "note": o.note, "skipped": o.skipped, "error": o.error, "score": r.scores[m]}
                                 for m, o in r.outcomes.items()}})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=1) + "\n")


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        print(f"cusp bench detect: unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}", file=sys.stderr)
        return 2
    try:
        items = collect(args)
    except (OSError, ValueError) as exc:
        print(f"cusp bench detect: {exc}", file=sys.stderr)
        return 2
    if not items:
        print("cusp bench detect: no data set selected", file=sys.stderr)
        return 2
    why = cusp_available() if "cusp" in methods else ""
    if why:
        _log(f"cusp skipped: {why}")
    source = _source_digest() if "cusp" in methods and not why else ""
    _log(f"{len(items)} series x {len(methods)} methods")
    results = evaluate(items, methods)
    if source and _source_digest() != source:
        why = (why + " " if why else "") + ("service/detect/ changed during the run: the results are from the version "
                                            "imported at its start.")
    section = render(results, methods, quick=args.quick, elapsed=time.perf_counter() - t0, tcpd_dirs=args.tcpd,
                     cusp_note=why, source=source)
    write_section(args.out, "detect", section)
    if args.json:
        _dump(results, args.json)
    _log(f"wrote the '{SECTION[3:]}' section of {args.out}")
    return 0
