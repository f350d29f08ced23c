"""Labelled metric series for ``cusp bench detect --metrics`` (issue 16): real series that ship
with PyPI packages, with change points documented in their sources (or documented as having
none), and realistic simulations of what operators send: trends, seasons, autocorrelation,
counts, heavy tails, short series, raw units.

Every series is scored as TCPDBench does (``bench.detect``: F1 and covering with a margin of 5,
index 0 a change point of every annotation) after TCPDBench's standardisation, the same input
for every method. cusp runs with its defaults: the default portfolio of a univariate stream
(``models.registry.default_portfolio``), the stream's model-averaged change points, point by
point (``spec = "default"``). Nothing here is tuned to a series: the labels come from the
sources named beside each one, the simulations' parameters were fixed before cusp ran on them.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from bench.detect import Series, standardise

DEFAULT = "default"


def _real(key: str, title: str, raw: np.ndarray, annotations: dict[str, list[int]], note: str) -> Series:
    x = np.asarray(raw, dtype=np.float64)
    changes = tuple(sorted(set().union(*map(set, annotations.values())))) if annotations else ()
    return Series(key=f"real:{key}", group=f"real:{key}", title=title, data=standardise(x[:, None]), changes=changes,
                  annotations={k: list(v) for k, v in annotations.items()} or {"source": []}, spec=DEFAULT, chunk=1,
                  kind="real", data_key=f"real:{key}", note=note)


def us_gdp_growth() -> Series:
    """US real GDP growth (annualised quarterly log growth, %), 1959Q2-2009Q3, statsmodels
    ``macrodata``. The Great Moderation: the volatility of US output growth fell in 1984Q1
    (McConnell and Perez-Quiros, AER 2000; Kim and Nelson, REStat 1999 date it 1984Q1)."""
    from statsmodels.datasets import macrodata

    d = macrodata.load_pandas().data
    gdp = d["realgdp"].to_numpy(dtype=np.float64)
    growth = 400.0 * np.diff(np.log(gdp))  # growth[i] is the quarter of row i + 1
    at = int(np.flatnonzero((d["year"].to_numpy() == 1984) & (d["quarter"].to_numpy() == 1))[0]) - 1
    return _real("us-gdp-growth", "US real GDP growth 1959-2009 (statsmodels macrodata): volatility falls in 1984Q1",
                 growth, {"mcconnell-perez-quiros-2000": [at]}, "variance change")


def us_tbill_changes() -> Series:
    """Quarterly changes of the US 3-month Treasury bill rate (percentage points), 1959Q2-2009Q3,
    statsmodels ``macrodata``. On 6 October 1979 the Federal Reserve moved from targeting the
    federal funds rate to targeting nonborrowed reserves, and left that procedure in October 1982;
    short rates were far more volatile in between (Gilbert, Federal Reserve Bank of St. Louis
    Review 76(1), 1994; Bernanke and Mihov, QJE 1998, treat 1979:10-1982:10 as a regime of its
    own). The changes: the first quarter of each procedure, 1979Q4 and 1982Q4."""
    from statsmodels.datasets import macrodata

    d = macrodata.load_pandas().data
    rate = d["tbilrate"].to_numpy(dtype=np.float64)
    years, quarters = d["year"].to_numpy(), d["quarter"].to_numpy()

    def at(year: int, quarter: int) -> int:  # rate[i + 1] - rate[i] is row i: the quarter of row i + 1
        return int(np.flatnonzero((years == year) & (quarters == quarter))[0]) - 1

    return _real("us-tbill-changes", "US 3-month T-bill rate, quarterly changes 1959-2009 (statsmodels macrodata): "
                 "the Fed's reserves targeting, 1979Q4-1982Q3", np.diff(rate),
                 {"fed-operating-procedures": [at(1979, 4), at(1982, 4)]}, "variance up, then down")


def mauna_loa_co2() -> Series:
    """Weekly CO2 at Mauna Loa 1958-2001 (statsmodels ``co2``; gaps filled linearly): a smooth
    trend with a yearly cycle, no documented change (every report is a false alarm)."""
    from statsmodels.datasets import co2

    y = co2.load_pandas().data["co2"].interpolate().to_numpy(dtype=np.float64)
    return _real("co2", "Mauna Loa CO2, weekly 1958-2001 (statsmodels co2): trend and season, no change", y, {},
                 "no change: trend + season")


def sunspots() -> Series:
    """Yearly sunspot numbers 1700-2008 (statsmodels ``sunspots``): the ~11-year cycle, no change."""
    from statsmodels.datasets import sunspots as ss

    y = ss.load_pandas().data["SUNACTIVITY"].to_numpy(dtype=np.float64)
    return _real("sunspots", "sunspot numbers, yearly 1700-2008 (statsmodels sunspots): a cycle, no change", y, {},
                 "no change: cycle")


def airline_passengers() -> Series:
    """Monthly airline passengers 1949-1960 (the Box-Jenkins series, shipped by river): growth
    and a growing season, no documented change."""
    import river.datasets

    path = Path(river.datasets.__file__).parent / "airline-passengers.csv"
    with open(path, newline="") as f:
        y = [float(r["passengers"]) for r in csv.DictReader(f)]
    return _real("airline", "airline passengers, monthly 1949-1960 (river): trend and season, no change", np.array(y), {},
                 "no change: trend + season")


def real_series() -> list[Series]:
    """The Nile (``bench.detect.nile_series``, TCPD's annotations) is scored in every run already."""
    return [us_gdp_growth(), us_tbill_changes(), mauna_loa_co2(), sunspots(), airline_passengers()]


# --- simulations ----------------------------------------------------------------------------------


def _sim(key: str, title: str, y: np.ndarray, changes: tuple[int, ...], seed: int, chunk: int = 1) -> Series:
    return Series(key=f"sim:{key}", group=f"sim:{key}", title=title, data=standardise(y[:, None]),
                  changes=changes, annotations={"truth": list(changes)}, spec=DEFAULT, chunk=chunk,
                  kind="labelled" if changes else "stationary", data_key=f"sim:{key}#s{seed}", seed=seed)


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    e = rng.standard_normal(n) * math.sqrt(1 - phi * phi)
    z = np.empty(n)
    z[0] = rng.standard_normal()
    for i in range(1, n):
        z[i] = phi * z[i - 1] + e[i]
    return z


def simulations(seed: int) -> list[Series]:
    """Realistic metric series with known changes; the parameters are fixed here, in raw units."""
    r = np.random.default_rng([seed, 16])
    t = np.arange(1000)
    out = []
    y = 1e5 + 350 * t[:320] + r.normal(0, 200, 320)
    y[200:] += 1500
    out.append(_sim("trend-shift", "rising series (+350 a step, noise 200), level +1,500 at 200 (n = 320)", y, (200,), seed))
    y = 500 + 80 * np.sin(2 * np.pi * t[:480] / 24) + r.normal(0, 10, 480)
    y[300:] += 40
    out.append(_sim("season-shift", "daily cycle (period 24, amplitude 80, noise 10), level +40 at 300 (n = 480)", y,
                    (300,), seed))
    y = 250 + 20 * _ar1(r, 400, 0.7)
    y[250:] += 60
    out.append(_sim("ar-shift", "latency, AR(1) 0.7 (sd 20 around 250 ms), +60 ms at 250 (n = 400)", y, (250,), seed))
    y = 250 + 20 * _ar1(r, 1000, 0.7)
    out.append(_sim("ar-stationary", "latency, AR(1) 0.7, no change (n = 1,000)", y, (), seed))
    y = np.concatenate([r.poisson(20, 220), r.poisson(32, 180)]).astype(float)
    out.append(_sim("counts", "counts per minute, Poisson 20 -> 32 at 220 (n = 400)", y, (220,), seed))
    y = 250 + 20 * r.standard_t(3, 600)
    y[300:] += 60
    out.append(_sim("heavy-tails", "Student-t(3) noise (scale 20), +60 at 300 (n = 600)", y, (300,), seed))
    y = 250 + 20 * r.standard_t(3, 1000)
    out.append(_sim("heavy-stationary", "Student-t(3) noise, no change (n = 1,000)", y, (), seed))
    y = np.concatenate([r.normal(0.002, 1e-4, 300), r.normal(0.002, 3e-4, 300)])
    out.append(_sim("variance-up", "a small rate (0.002 +- 1e-4), sd x3 at 300 (n = 600)", y, (300,), seed))
    for n, at in ((20, 10), (30, 15), (50, 32)):
        y = 1e4 + 50 * r.standard_normal(n)
        y[at:] += 200
        out.append(_sim(f"short-{n}", f"short series: yearly values (1e4 +- 50), +200 at {at} (n = {n})", y, (at,), seed))
    # overdispersed counts (negative binomial, r = 4: sd 2.6x Poisson's at mean 40) and a heavier
    # tail (Student-t, 2 degrees of freedom: infinite variance), added for issue 16's negbin and
    # student-t after the others (so theirs draw the same numbers); parameters fixed before cusp
    # ran on them
    mean = np.concatenate([np.full(260, 40.0), np.full(240, 70.0)])
    y = r.negative_binomial(4, 4 / (4 + mean)).astype(float)
    out.append(_sim("nb-counts", "overdispersed counts, negative binomial r = 4, mean 40 -> 70 at 260 (n = 500)", y,
                    (260,), seed))
    y = r.negative_binomial(4, 4 / 44, 800).astype(float)
    out.append(_sim("nb-stationary", "overdispersed counts, negative binomial r = 4, mean 40, no change (n = 800)", y,
                    (), seed))
    y = 100 + 10 * r.standard_t(2, 700)
    y[350:] += 40
    out.append(_sim("t2-shift", "Student-t(2) noise (scale 10 around 100), +40 at 350 (n = 700)", y, (350,), seed))
    # isolated spikes (a retry storm, a GC pause: one reading of 8-12 sd) are not changes; added
    # after the others, parameters fixed before cusp ran on them
    y = 250 + 20 * r.standard_normal(800)
    y[400:] += 60
    spots = r.choice(np.r_[30:380, 420:780], size=4, replace=False)
    y[spots] += 20 * r.uniform(8, 12, size=4) * r.choice([-1.0, 1.0], size=4)
    out.append(_sim("spikes", "latency (250 +- 20 ms) with 4 single-reading spikes of 8-12 sd, +60 ms at 400 (n = 800)",
                    y, (400,), seed))
    # growth that slows, no jump (a kink): added with the slope-change restarts, after the others;
    # parameters fixed before cusp ran on them
    y = 2e4 + 40 * t[:400] - 30 * np.maximum(t[:400] - 260, 0) + r.normal(0, 150, 400)
    out.append(_sim("slope-change", "growth slows: +40 a step, +10 from 260 (noise 150, around 2e4; n = 400)", y, (260,),
                    seed))
    # growth and a daily cycle together, then a level shift: added after a similar series (other
    # numbers) showed that no model of the portfolio had both; parameters fixed before cusp ran on it
    y = 4000 + 1.5 * t[:600] + 60 * np.sin(2 * np.pi * t[:600] / 24) + r.normal(0, 25, 600)
    y[420:] += 100
    out.append(_sim("trend-season-shift", "hourly traffic growing 1.5 a step with a daily cycle (amplitude 60, noise 25), "
                    "+100 at 420 (n = 600)", y, (420,), seed))
    # per-minute latency over three days, posted an hour at a time: a daily cycle of 1,440 rows,
    # which no calendar period of ``seasonal`` held until the operational ones joined (a new user's
    # 5-minute and 1-minute series got a false alarm every few hours); its own generator, so the
    # series above stay as they were; parameters fixed before cusp ran on it
    rm = np.random.default_rng([seed, 17])
    tm = np.arange(4320)
    y = 250 + 30 * np.sin(2 * np.pi * tm / 1440) + rm.normal(0, 20, 4320)
    y[3000:] += 30
    out.append(_sim("minute-cycle-shift", "per-minute latency (250 +- 20 ms) with a daily cycle (amplitude 30), +30 ms at "
                    "3,000 (n = 4,320, chunks of 60)", y, (3000,), seed, chunk=60))
    # a table of three columns posted 50 rows at a time, one wild reading (a timeout of 2,500 ms among
    # 250 +- 20) in the first and a shift of 5 sd in the third (a new user's case, 2026-11-28: reported
    # at 151 or 302-304 before the detector took outliers out). Added with that, after the others, its
    # own generator; the case itself is the one the change was made on, so this row is not held out
    rw = np.random.default_rng([seed, 18])
    table = np.column_stack([rw.normal(250, 20, 600), rw.choice([4.0, 5.0, 6.0], 600, p=[0.1, 0.8, 0.1]),
                             rw.normal(1e4, 1e-3, 600)])
    table[int(rw.integers(100, 300)), 0] = 2500.0
    table[400:, 2] += 5e-3
    out.append(Series(key="sim:table-wild", group="sim:table-wild", data=standardise(table), changes=(400,),
                      title="three columns (latency 250 +- 20 ms with one reading of 2,500; a gauge 4-6; 1e4 +- 1e-3), "
                            "+5 sd in the third at 400 (n = 600, chunks of 50)",
                      annotations={"truth": [400]}, spec=DEFAULT, chunk=50, kind="labelled",
                      data_key=f"sim:table-wild#s{seed}", seed=seed))
    # a thermometer (21.3 +- 0.4, recorded to 0.01) that sticks at its last reading for 80-150 rows
    # and comes back, posted 5 rows at a time: added with the flat-run signal (``signals.FlatRun``),
    # which was built on a similar case (10 +- 0.5 stuck over 100 rows), so this row is not held out;
    # its own generator, parameters fixed before cusp ran on it
    rs = np.random.default_rng([seed, 19])
    y = (21.3 + 0.4 * rs.standard_normal(800)).round(2)
    at = int(rs.integers(300, 500))
    end = at + int(rs.integers(80, 151))
    y[at:end] = y[at - 1]
    out.append(_sim("stuck", f"a thermometer (21.3 +- 0.4, two decimals) stuck at its last reading over {at}-{end - 1} "
                    "(n = 800, chunks of 5)", y, (at, end), seed, chunk=5))
    return out


def metric_suite(seeds: int = 3) -> list[Series]:
    return real_series() + [s for seed in range(seeds) for s in simulations(seed)]
