"""``cusp bench paper``: the experiments of papers/001 (sections 6-7, Appendix B) on this machine.

Sections (each measured in one run of this command, peers run sequentially, one thread each):
  1. linear regression accuracy against the exact evidence: 'paper' and 'accurate' presets, several seeds;
  2. SGAIS against full-data AIS (``full_data_ais``) and dynesty for linear and logistic regression
     and the Gaussian mixture, with in-order against shuffled agreement;
  3. speed: observations per second, time per chunk early against late, peak memory, a profile;
  4. the distribution-shift experiment (3 -> 5 -> 7 clusters) with 3-, 5- and 7-component mixtures.

Every SGAIS, AIS and dynesty run happens in its own child process (``bench.tasks.isolated``).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench import tasks as T
from bench.data import SHIFT_CHANGES, SHIFT_MEANS, SHIFT_PHASES, distribution_shift_data
from bench.report import fmt_n, fmt_num, fmt_seconds, machine, markdown_table, verdict, write_section

CHUNK = 500

# targets (the acceptance figures)
TARGET_PAPER_REL = 1.5e-3
TARGET_ACCURATE_REL = 1e-4
TARGET_ACCURATE_TIME = 10.0
TARGET_LINEAR_RATE = 200_000
TARGET_GMM_RATE = 100_000
TARGET_CHUNK_RATIO = 1.2
MEMORY_FLAT_MIB = 2.0


@dataclass
class Plan:
    quick: bool
    cap: float
    lin_ns: list[int]
    lin_seeds: int
    ref_ns: list[int]
    n_max: dict[str, int]
    dynesty_keys: tuple[str, ...]
    dynesty_max_n: int
    shift_n: int
    shift_seeds: int
    profile_n: int
    notes: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, quick: bool, cap: float | None) -> "Plan":
        if quick:
            return cls(True, 45.0 if cap is None else cap, [1_000, 10_000, 100_000], 3, [1_000, 10_000],
                       {"linear": 100_000, "logistic": 20_000, "gmm": 100_000}, ("linear",), 1_000, 20_000, 1, 30_000)
        return cls(False, 600.0 if cap is None else cap, [1_000, 10_000, 100_000, 1_000_000], 5,
                   [1_000, 10_000, 100_000, 1_000_000],
                   {"linear": 1_000_000, "logistic": 1_000_000, "gmm": 1_000_000}, ("linear", "logistic", "gmm"),
                   1_000_000, 100_000, 3, 60_000)


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _checked(r: dict, what: str) -> dict:
    if r["status"] == "error":
        raise RuntimeError(f"{what} failed: {r['error']}\n{r.get('traceback', '')}")
    return r


def _at(trace: dict, n: int, col: str) -> float:
    idx = np.searchsorted(trace["n"], n)
    if idx >= len(trace["n"]) or trace["n"][idx] != n:
        return float("nan")
    return float(trace[col][idx])


# --- exact evidence along a linear-regression stream ------------------------------------------

def linear_exact_trace(n: int, chunk: int = CHUNK, data_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ends, exact log Z of the first n_i rows) for every chunk end, from cumulative Gram matrices."""
    model = T.make_model("linear")
    rows = model.featurize(T.make_data("linear", n, data_seed)).numpy()
    d = model.dim
    ends = np.arange(chunk, n + 1, chunk)
    if n % chunk:
        ends = np.append(ends, n)
    grams = np.zeros((len(ends), d + 1, d + 1))
    start = 0
    for i, e in enumerate(ends):
        r = rows[start:e]
        grams[i] = r.T @ r
        start = e
    grams = np.cumsum(grams, axis=0)
    s2, v = model.prior_scale**2, model.noise**2
    out = np.empty(len(ends))
    eye = np.eye(d) * (v / s2)
    for i, (m, g) in enumerate(zip(ends, grams)):
        a = eye + g[:d, :d]
        chol = np.linalg.cholesky(a)
        xty = g[:d, d]
        sol = np.linalg.solve(a, xty)
        logdet = 2.0 * np.log(np.diag(chol)).sum() - d * math.log(v / s2)
        quad = (g[d, d] - xty @ sol) / v
        out[i] = -0.5 * m * (math.log(2 * math.pi) + math.log(v)) - 0.5 * logdet - 0.5 * quad
    # cross-check against the model's own closed form at the largest n
    ref = model.exact_log_evidence(torch.from_numpy(rows))
    if abs(ref - out[-1]) > 1e-8 * abs(ref):
        raise AssertionError(f"cumulative exact log Z {out[-1]} disagrees with the model's {ref}")
    return ends, out


# --- reference runs with a time cap ---------------------------------------------------------------

def _skip(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def _reference(r: dict, what: str) -> dict:
    """A reference run's result; one that failed (out of memory, a library's error) is a
    table cell that says so, and the larger n after it are skipped: a reference is there to
    check cusp, and one that cannot run does not end the benchmark."""
    if r["status"] != "error":
        return r
    _log(f"{what} failed: {r['error']}")
    first = r["error"].splitlines()[0] if r["error"] else "error"
    return _skip(f"failed ({first[:120]})")


def _after(pn: int, pr: dict) -> dict:
    """The cell of a larger n after the reference at ``pn`` gave no result (``pr``)."""
    why = "failed" if pr.get("reason", "").startswith("failed") else "did not finish within the cap"
    return _skip(f"n={fmt_n(pn)} {why}")


def run_ais(key: str, ns: list[int], cap: float, per_row: bool = False) -> dict[int, dict]:
    out: dict[int, dict] = {}
    prev: tuple[int, dict] | None = None
    for n in ns:
        if prev is not None:
            pn, pr = prev
            if pr["status"] != "ok":
                out[n] = _after(pn, pr)
                continue
            pred = pr["seconds"] * (n / pn) * 1.2
            if pred > 2 * cap:
                out[n] = _skip(f"predicted ~{fmt_seconds(pred)} from n={fmt_n(pn)} (> 2x cap)")
                prev = (n, out[n])
                continue
        _log(f"AIS{' per-row' if per_row else ''} {key} n={n}")
        r = _reference(T.isolated("ais_run", timeout=cap, key=key, n=n, per_row=per_row), f"AIS {key} n={n}")
        out[n] = r
        prev = (n, r)
    return out


def run_dynesty(key: str, ns: list[int], cap: float) -> dict[int, dict]:
    out: dict[int, dict] = {}
    prev: tuple[int, dict] | None = None
    for n in ns:
        if prev is not None:
            pn, pr = prev
            if not (pr["status"] == "ok" and pr.get("finished")):
                out[n] = _after(pn, pr)
                continue
            # predicted = calls x (dynesty's own overhead per call + one full-data likelihood at n)
            c_prev = _checked(T.isolated("loglike_cost", key=key, n=pn), "loglike_cost")["seconds"]
            c_next = _checked(T.isolated("loglike_cost", key=key, n=n), "loglike_cost")["seconds"]
            overhead = max(pr["seconds"] / pr["calls"] - c_prev, 0.0)
            pred = pr["calls"] * 1.15 * (overhead + c_next)
            if pred > 2 * cap:
                out[n] = _skip(f"predicted ~{fmt_seconds(pred)} ({pr['calls']:,} calls at n={fmt_n(pn)}) > 2x cap")
                prev = (n, out[n])
                continue
        _log(f"dynesty {key} n={n}")
        r = _reference(T.isolated("dynesty_run", timeout=cap + 120, key=key, n=n, cap=cap), f"dynesty {key} n={n}")
        if r["status"] == "timeout":
            r = {"status": "ok", "finished": False, "seconds": cap}
        out[n] = r
        prev = (n, r)
    return out


def _ref_cell(r: dict | None, exact: float | None = None) -> tuple[str, str]:
    """(log Z cell, time cell) for an AIS or dynesty result."""
    if r is None:
        return "not run", "—"
    if r["status"] == "skipped":
        return f"skipped: {r['reason']}", "—"
    if r["status"] == "timeout":
        return "killed at the cap", f"> {fmt_seconds(r['wall'])}"
    if r.get("finished") is False:
        dl = r.get("delta_logz")
        extra = f"; remaining dlogz {fmt_num(dl)} after {r.get('niter', 0):,} iterations" if dl is not None else ""
        return f"not finished in the cap{extra}", f"> {fmt_seconds(r['seconds'])}"
    z = r["log_evidence"]
    cell = fmt_num(z, 7)
    if "log_evidence_err" in r:
        cell += f" ± {r['log_evidence_err']:.2f}"
    if exact is not None:
        cell += f" (rel. err {abs(z - exact) / abs(exact):.1e})"
    return cell, fmt_seconds(r["seconds"])


def _ref_time(r: dict | None) -> float | None:
    if r is None or r["status"] != "ok" or r.get("finished") is False:
        return None
    return r["seconds"]


# --- the benchmark -----------------------------------------------------------------------------

class PaperBench:
    def __init__(self, plan: Plan, out: Path, img: Path):
        self.plan, self.out, self.img = plan, out, img
        self.t_start = time.perf_counter()
        self.load_start = os.getloadavg()
        self.figs: dict[str, str] = {}
        self.summary: list[list[str]] = []

    # 1 -----------------------------------------------------------------------------------------
    def linear_accuracy(self) -> str:
        p = self.plan
        n_max = p.n_max["linear"]
        ends, exact = linear_exact_trace(n_max)
        self.lin_exact = (ends, exact)
        runs: dict[str, list[dict]] = {"paper": [], "accurate": []}
        for preset in runs:
            for seed in range(p.lin_seeds):
                _log(f"SGAIS linear {preset} seed={seed} n={n_max}")
                r = _checked(T.isolated("sgais_run", key="linear", n=n_max, seed=seed, preset=preset,
                                        checkpoints=tuple(p.lin_ns)), "SGAIS linear")
                runs[preset].append(r)
        self.lin_runs = runs
        rel = {k: np.array([np.abs(r["trace"]["log_evidence"] - exact) / np.abs(exact) for r in v]) for k, v in runs.items()}
        wall = {k: np.array([r["trace"]["wall"] for r in v]) for k, v in runs.items()}
        self.lin_rel, self.lin_wall = rel, wall
        idx = {n: int(np.searchsorted(ends, n)) for n in p.lin_ns}
        rows = []
        for n in p.lin_ns:
            i = idx[n]
            cells = [fmt_n(n), fmt_num(exact[i], 7)]
            for k in ("paper", "accurate"):
                e = rel[k][:, i]
                cells += [f"{e.mean():.2e} ± {e.std(ddof=1) if len(e) > 1 else 0:.1e}", f"{e.min():.1e} – {e.max():.1e}",
                          fmt_seconds(wall[k][:, i].mean())]
            cells.append(f"{wall['accurate'][:, i].mean() / wall['paper'][:, i].mean():.2f}x")
            rows.append(cells)
        table = markdown_table(
            ["n", "exact log Z", "paper: rel. error mean ± sd", "paper: min – max", "paper: time",
             "accurate: rel. error mean ± sd", "accurate: min – max", "accurate: time", "time accurate / paper"], rows)

        # targets
        for n in (100_000, 1_000_000):
            if n not in idx:
                self.summary.append([f"paper preset rel. error <= {TARGET_PAPER_REL:g} at n={fmt_n(n)}", "not measured (quick mode)", "n/a"])
                self.summary.append([f"accurate preset rel. error <= {TARGET_ACCURATE_REL:g} at n={fmt_n(n)}", "not measured (quick mode)", "n/a"])
                self.summary.append([f"accurate time <= {TARGET_ACCURATE_TIME:g}x paper at n={fmt_n(n)}", "not measured (quick mode)", "n/a"])
                continue
            i = idx[n]
            for k, tgt in (("paper", TARGET_PAPER_REL), ("accurate", TARGET_ACCURATE_REL)):
                e = rel[k][:, i]
                self.summary.append([f"{k} preset rel. error <= {tgt:g} at n={fmt_n(n)}",
                                     f"mean {e.mean():.2e} (worst seed {e.max():.2e}; {int((e <= tgt).sum())}/{len(e)} seeds within)",
                                     verdict(bool(e.mean() <= tgt))])
            ratio = wall["accurate"][:, i].mean() / wall["paper"][:, i].mean()
            self.summary.append([f"accurate time <= {TARGET_ACCURATE_TIME:g}x paper at n={fmt_n(n)}", f"{ratio:.2f}x", verdict(bool(ratio <= TARGET_ACCURATE_TIME))])

        capped = {k: sum(int(r["trace"]["capped"].sum()) for r in v) for k, v in runs.items()}
        steps = {k: np.mean([r["trace"]["steps"].sum() for r in v]) for k, v in runs.items()}
        nchunks = len(ends)
        text = [
            "## 1. Linear regression: accuracy against the exact evidence",
            "",
            f"Data: `bench.data.linear_regression_data(n, seed=0)` (x ~ N(0, I_5), y = w.x + b + N(0, 1), w and b drawn from "
            f"the prior). One SGAIS pass per seed over the first {fmt_n(n_max)} rows in chunks of {CHUNK}; the estimate after "
            f"the chunk ending at n is compared with the closed-form log Z of the first n rows, so every n comes from the "
            f"same online run, as in the paper. {p.lin_seeds} sampler seeds per preset (same data). Relative error is "
            "|log Z_hat - log Z| / |log Z|. Time is the sampler's cumulative wall time up to n (one thread).",
            "",
            "- `paper` preset: M = 10, lr = 0.1 (eta = 0.1/n), alpha = 0.2, 20 SGHMC steps, target ESS 0.5 M, mini-batch 500, Euler SGHMC.",
            "- `accurate` preset: the same plus BAOAB splitting, control-variate history gradients and M = 30.",
            "",
            table,
            f"Annealing steps per run (mean over seeds): paper {steps['paper']:.0f}, accurate {steps['accurate']:.0f} "
            f"for {nchunks} chunks; chunks that hit the step cap: paper {capped['paper']}, accurate {capped['accurate']}.",
            "",
        ]
        self._fig_linear()
        text += [f"![linear regression accuracy](img/{self.figs['linear_accuracy']})", ""]
        return "\n".join(text)

    # 2 -----------------------------------------------------------------------------------------
    def references(self) -> str:
        p = self.plan
        parts = [
            "## 2. SGAIS against full-data AIS and dynesty",
            "",
            "References on the first n rows of the same data sets (section 7 of the paper): `full_data_ais` (the same kernel, "
            "schedule and `paper` settings, every gradient on the whole data set, seed 0) and dynesty's static `NestedSampler` "
            "with its defaults (500 live points, multi-ellipsoid bounds, automatic sampler choice: uniform below 10 "
            "dimensions, random walk for 10-20, slice sampling above; seed 0) whose likelihood is the model's own "
            "`log_likelihood` summed over all n rows. Each reference runs in its own process with a time cap of "
            f"{fmt_seconds(p.cap)}; a larger n is skipped when a smaller one did not finish, or when its predicted time "
            "(AIS: time x n ratio x 1.2; dynesty: calls so far x 1.15 x (dynesty's own time per call + one likelihood "
            "call timed at the new n)) exceeds twice the cap. The SGAIS time at n is the cumulative time of the one online "
            "pass up to n (section 1's seed mean for linear regression; one run, seed 0, otherwise); speedups are "
            "reference time / SGAIS time, measured in this run.",
            "",
        ]
        self.refs: dict[str, dict] = {}
        self.sgais_other: dict[str, dict] = {}
        for key in ("linear", "logistic", "gmm"):
            ns = [n for n in p.ref_ns if n <= p.n_max[key]]
            refs = {"ais": run_ais(key, ns, p.cap)}
            if T.make_model(key).has_stats:
                refs["ais_per_row"] = run_ais(key, ns, p.cap, per_row=True)
            if key in p.dynesty_keys:
                refs["dynesty"] = run_dynesty(key, [n for n in ns if n <= p.dynesty_max_n], p.cap)
            self.refs[key] = refs
            if key == "linear":
                trace_n = self.lin_exact[0]
                z = np.array([r["trace"]["log_evidence"] for r in self.lin_runs["paper"]]).mean(0)
                t = self.lin_wall["paper"].mean(0)
                sg = {"n": trace_n, "log_evidence": z, "wall": t}
            else:
                runs = {}
                for order in ("in-order", "shuffled"):
                    _log(f"SGAIS {key} {order} n={p.n_max[key]}")
                    runs[order] = _checked(T.isolated("sgais_run", key=key, n=p.n_max[key], seed=0, order=order,
                                                      checkpoints=tuple(n for n in (10_000, 100_000, 1_000_000) if n <= p.n_max[key])),
                                           f"SGAIS {key}")
                self.sgais_other[key] = runs
                sg = runs["in-order"]["trace"]
            parts.append(self._ref_table(key, ns, sg, refs))
        parts.append(self._order_table())
        self._fig_refs()
        parts += [f"![SGAIS against AIS and dynesty: log Z / n and time](img/{self.figs['references']})", ""]
        parts.append(self._ais_settings())
        return "\n".join(parts)

    def _ais_settings(self) -> str:
        """How far full-data AIS is from the exact answer as its settings change (linear regression)."""
        n = 100_000 if not self.plan.quick else 10_000
        variants = [
            ("paper preset (the reference above)", "paper", {}),
            ("accurate preset (BAOAB, control variates, M = 30)", "accurate", {}),
            ("paper, 200 SGHMC steps per temperature", "paper", {"sghmc_steps": 200}),
            ("paper, lr = 1.0", "paper", {"lr": 1.0}),
            ("paper, M = 100, target ESS 0.9 M", "paper", {"particles": 100, "target_ess": 0.9}),
        ]
        ends, ex = self.lin_exact
        exact = float(ex[np.searchsorted(ends, n)])
        rows = []
        for label, preset, ov in variants:
            _log(f"AIS settings linear n={n}: {label}")
            r = T.isolated("ais_run", timeout=self.plan.cap, key="linear", n=n, preset=preset, overrides=ov)
            if r["status"] != "ok":
                rows.append([label, r["status"], "—", "—", "—"])
                continue
            rows.append([label, fmt_num(r["log_evidence"], 8), f"{abs(r['log_evidence'] - exact) / abs(exact):.1e}",
                         f"{r['steps']}", fmt_seconds(r["seconds"])])
        sg = float(np.array([r["trace"]["log_evidence"] for r in self.lin_runs["paper"]]).mean(0)[np.searchsorted(ends, n)])
        return "\n".join([
            f"### How good is the AIS reference? (linear regression, n = {fmt_n(n)}, exact log Z = {fmt_num(exact, 8)})",
            "",
            "`full_data_ais` with the paper's settings anneals from the prior to the full posterior in few, large "
            "temperature steps while each SGHMC run (20 steps of size sqrt(0.1/n)) barely moves the particles, so its "
            "estimate is far less accurate than the online SGAIS estimate on the same data "
            f"(SGAIS `paper` seed mean: rel. error {abs(sg - exact) / abs(exact):.1e}). More mixing per temperature, "
            "a larger step or more particles close most of the gap:",
            "",
            markdown_table(["AIS setting", "log Z", "rel. error", "annealing steps", "time"], rows),
        ])

    def _ref_table(self, key: str, ns: list[int], sg: dict, refs: dict) -> str:
        headers = ["n"]
        exact = None
        if key == "linear":
            headers.append("exact log Z")
            ends, ex = self.lin_exact
            exact = {n: float(ex[np.searchsorted(ends, n)]) for n in ns}
        headers += ["SGAIS log Z", "SGAIS time", "AIS log Z", "AIS time"]
        if "ais_per_row" in refs:
            headers.append("AIS time, per-row gradients")
        if "dynesty" in refs:
            headers += ["dynesty log Z", "dynesty time"]
        headers += ["speedup vs AIS"] + (["vs AIS per-row"] if "ais_per_row" in refs else []) + (["vs dynesty"] if "dynesty" in refs else [])
        rows = []
        for n in ns:
            z, t = _at(sg, n, "log_evidence"), _at(sg, n, "wall")
            ex = exact[n] if exact else None
            cells = [fmt_n(n)] + ([fmt_num(ex, 7)] if exact else [])
            zc = fmt_num(z, 7) + (f" (rel. err {abs(z - ex) / abs(ex):.1e})" if ex else "")
            cells += [zc, fmt_seconds(t)]
            cells += list(_ref_cell(refs["ais"].get(n), ex))
            if "ais_per_row" in refs:
                cells.append(_ref_cell(refs["ais_per_row"].get(n))[1])
            if "dynesty" in refs:
                cells += list(_ref_cell(refs["dynesty"].get(n), ex)) if n in refs["dynesty"] else ["not run (quick mode)", "—"]
            for m in ("ais", "ais_per_row", "dynesty"):
                if m in refs:
                    rt = _ref_time(refs[m].get(n))
                    cells.append(f"{rt / t:.1f}x" if rt is not None and t > 0 else "—")
            rows.append(cells)
        title = T.DATASETS[key].title
        note = ""
        if key == "linear":
            note = ("\n`AIS time` is `full_data_ais` as the engine runs it: linear regression has additive sufficient "
                    "statistics, so a full-data gradient costs O(1) after one pass and only the log-likelihood of each "
                    "annealing step touches all rows. `per-row gradients` switches that fast path off (same estimates, "
                    "same random numbers) to reproduce the paper's AIS cost model, where every SGHMC step reads every row.\n")
        return f"### {title}\n\n" + markdown_table(headers, rows) + note

    def _order_table(self) -> str:
        rows = []
        for key, runs in self.sgais_other.items():
            a, b = runs["in-order"], runs["shuffled"]
            za, zb = a["trace"]["log_evidence"][-1], b["trace"]["log_evidence"][-1]
            n = int(a["trace"]["n"][-1])
            rows.append([T.DATASETS[key].title, fmt_n(n), fmt_num(za, 8), fmt_num(zb, 8), fmt_num(za - zb, 4),
                         f"{abs(za - zb) / abs(zb):.1e}", fmt_seconds(a["seconds"]), fmt_seconds(b["seconds"])])
        return ("### In-order against shuffled data (final estimate, paper section 7.2)\n\n"
                "The shuffled run sees a seeded permutation of the same rows; i.i.d. data, so the final evidence should agree.\n\n"
                + markdown_table(["model", "n", "log Z in order", "log Z shuffled", "difference", "rel. difference",
                                  "time in order", "time shuffled"], rows))

    # 3 -----------------------------------------------------------------------------------------
    def speed(self) -> str:
        p = self.plan
        # linear: the run with the median time of section 1's paper-preset seeds; mixture: section 2's in-order run
        lin_runs = sorted(self.lin_runs["paper"], key=lambda r: r["seconds"])
        lin = lin_runs[len(lin_runs) // 2]
        self.speed_lin = lin
        gmm = self.sgais_other["gmm"]["in-order"]
        rows, mem_rows, chunk_rows = [], [], []
        for key, run, target in (("linear", lin, TARGET_LINEAR_RATE), ("gmm", gmm, TARGET_GMM_RATE)):
            tr = run["trace"]
            n = int(tr["n"][-1])
            rate = n / run["seconds"]
            spread = ""
            if key == "linear" and len(lin_runs) > 1:
                spread = f" (median of {len(lin_runs)} seeds; {n / lin_runs[-1]['seconds']:,.0f} – {n / lin_runs[0]['seconds']:,.0f})"
            steal = run.get("steal")
            rows.append([T.DATASETS[key].title, fmt_n(n), fmt_seconds(run["seconds"]), f"{rate:,.0f}{spread}",
                         "n/a" if steal is None else f"{100 * steal:.1f}%", f"{target:,}",
                         f"{rate / target:.2f}", verdict(rate >= target) if n >= 1_000_000 else "n/a (quick: n < 1e6)"])
            self.summary.append([f"{key} throughput >= {target:,} obs/s over 1e6 (paper preset)",
                                 f"{rate:,.0f} obs/s over {fmt_n(n)}{spread}", verdict(rate >= target) if n >= 1_000_000 else "n/a"])
            sec, steps, ns = tr["seconds"], tr["steps"], tr["n"]
            early = (ns > 5_000) & (ns <= 20_000)
            late = ns > n // 2
            e_med, l_med = np.median(sec[early]), np.median(sec[late])
            e_step, l_step = np.median(sec[early] / steps[early]), np.median(sec[late] / steps[late])
            ratio = l_med / e_med
            chunk_rows.append([T.DATASETS[key].title, f"{int(early.sum())} chunks, n in (5e3, 2e4]", fmt_seconds(e_med),
                               f"{steps[early].mean():.2f}", f"{int(late.sum())} chunks, n in ({fmt_n(n // 2)}, {fmt_n(n)}]",
                               fmt_seconds(l_med), f"{steps[late].mean():.2f}", f"{ratio:.2f}", f"{l_step / e_step:.2f}"])
            self.summary.append([f"{key}: median time per chunk at n~{fmt_n(n)} / at n~1e4 <= {TARGET_CHUNK_RATIO}",
                                 f"{ratio:.2f} (per annealing step: {l_step / e_step:.2f})", verdict(ratio <= TARGET_CHUNK_RATIO)])
            mem = run["memory"]
            for m in mem:
                mem_rows.append([T.DATASETS[key].title, fmt_n(m["n"]), f"{m['rss_mib']:.1f}", f"{m['maxrss_mib']:.1f}"])
            after = [m for m in mem if m["n"] >= 100_000]
            if len(after) >= 2:
                grow = max(after[-1]["maxrss_mib"] - after[0]["maxrss_mib"], after[-1]["rss_mib"] - after[0]["rss_mib"])
                self.summary.append([f"{key}: memory flat beyond the reservoir (peak and current RSS growth 1e5 -> {fmt_n(after[-1]['n'])} <= {MEMORY_FLAT_MIB:g} MiB)",
                                     f"{grow:+.1f} MiB", verdict(grow <= MEMORY_FLAT_MIB)])
        profiles = []
        for key, n in (("linear", 5 * p.profile_n), ("gmm", p.profile_n)):
            warm = min(20_000, n // 2)
            _log(f"profile {key} n={n}")
            prof = _checked(T.isolated("profile_run", key=key, n=n, warm=warm), "profile")
            rows_p = [[f"`{r['function']}`", f"{r['calls']:,}", fmt_seconds(r["own"]), fmt_seconds(r["cumulative"]),
                       f"{100 * r['share']:.0f}%"] for r in prof["rows"]]
            profiles += [
                f"Profile (cProfile) of {T.DATASETS[key].title}, `paper` preset, rows {fmt_n(warm)} to {fmt_n(n)} "
                f"({prof['total']:.1f} s profiled, profiler overhead included); the functions with the most own time:",
                "",
                markdown_table(["function", "calls", "own time", "cumulative", "share of own time"], rows_p),
            ]
        self._fig_speed()
        return "\n".join([
            "## 3. Speed and memory",
            "",
            "Throughput is observations / the sampler's wall time for one `paper`-preset pass (chunks of 500, one thread; "
            "data generation excluded); the linear run is the median-time one of section 1's `paper` seeds, the mixture run "
            "section 2's in-order run; the per-chunk, memory and figure rows below come from the same two runs. CPU steal "
            "is the share of the machine's CPU time the hypervisor gave to other guests during that run (/proc/stat): "
            "time the run waited for a CPU it could not see, so a high figure means the machine, not the code, was slow.",
            "",
            markdown_table(["model", "n", "time", "obs/s", "CPU steal during the run", "target obs/s", "measured / target",
                            "target"], rows),
            "Time per chunk early against late (median of many chunks, from the same runs). Chunks early in a stream need "
            "more annealing steps, so the time per annealing step is shown too: it isolates the cost of one step as the "
            "history grows.",
            "",
            markdown_table(["model", "early window", "median s/chunk", "mean steps/chunk", "late window", "median s/chunk",
                            "mean steps/chunk", "late / early (chunk)", "late / early (step)"], chunk_rows),
            "Memory: resident set size growth in MiB over the process's state after building the data and the sampler, "
            "at each n (rss: current; peak: high-water mark, reset at that point). The reservoir holds at most 100,000 featurized rows "
            "(linear: 7 columns, 5.3 MiB; mixture: 4 columns, 3.1 MiB), so growth should stop at n = 1e5.",
            "",
            markdown_table(["model", "n", "rss growth MiB", "peak growth MiB"], mem_rows),
            f"![time per chunk and annealing steps](img/{self.figs['speed']})",
            "",
            *profiles,
        ])

    # 4 -----------------------------------------------------------------------------------------
    def shift(self) -> str:
        p = self.plan
        runs: dict[tuple[int, str, int], dict] = {}
        for seed in range(p.shift_seeds):
            for k in SHIFT_PHASES:
                for order in ("in-order", "shuffled"):
                    _log(f"SGAIS shift K={k} {order} seed={seed} n={p.shift_n}")
                    runs[(k, order, seed)] = _checked(T.isolated("sgais_run", key=f"shift{k}", n=p.shift_n, seed=seed,
                                                                 data_seed=0, order=order), "SGAIS shift")
        self.shift_runs = runs
        rows = []
        for k in SHIFT_PHASES:
            zi = np.array([runs[(k, "in-order", s)]["trace"]["log_evidence"][-1] for s in range(p.shift_seeds)])
            zs = np.array([runs[(k, "shuffled", s)]["trace"]["log_evidence"][-1] for s in range(p.shift_seeds)])
            sd = (lambda a: f" ± {a.std(ddof=1):.1f}" if len(a) > 1 else "")
            d = zi.mean() - zs.mean()
            rows.append([f"K = {k}", fmt_num(zi.mean(), 8) + sd(zi), fmt_num(zs.mean(), 8) + sd(zs), fmt_num(d, 4),
                         f"{abs(d) / abs(zs.mean()):.1e}",
                         f"{np.mean([runs[(k, 'in-order', s)]['trace']['steps'].sum() for s in range(p.shift_seeds)]):.0f}",
                         f"{np.mean([runs[(k, 'shuffled', s)]['trace']['steps'].sum() for s in range(p.shift_seeds)]):.0f}"])
        seed_rows = [[f"K = {k}"] + [
            f"{fmt_num(runs[(k, 'in-order', s)]['trace']['log_evidence'][-1], 8)} / {fmt_num(runs[(k, 'shuffled', s)]['trace']['log_evidence'][-1], 8)}"
            for s in range(p.shift_seeds)] for k in SHIFT_PHASES]
        # the change-point signal: steps and log predictive per observation around each change (seed 0)
        cp_rows = []
        for k in SHIFT_PHASES:
            tr = runs[(k, "in-order", 0)]["trace"]
            lp = np.diff(np.concatenate([[0.0], tr["log_evidence"]])) / np.diff(np.concatenate([[0], tr["n"]]))
            for c in SHIFT_CHANGES:
                if c >= p.shift_n:
                    continue
                j = int(np.searchsorted(tr["n"], c, side="right"))  # first chunk holding rows >= c
                before = slice(max(1, j - 4), j)  # not the first chunk (prior -> first posterior)
                cp_rows.append([f"K = {k}", f"{c:,}", f"{tr['steps'][before].mean():.1f}", f"{tr['steps'][j]}",
                                f"{lp[before].mean():.3f}", f"{lp[j]:.3f}"])
        self._fig_shift()
        return "\n".join([
            "## 4. Distribution shift (paper sections 6.2 and 7.2)",
            "",
            f"Data: `bench.data.distribution_shift_data(n={p.shift_n:,}, seed=0)`: rows 0-999 from 3 equally weighted 2-D "
            "Gaussian clusters, rows 1,000-9,999 from 5 (the 3 plus 2, one overlapping), the rest from 7. Mixtures with "
            "K = 3, 5 and 7 components, `paper` preset, on the rows in order and on a seeded shuffle of the same rows "
            f"({p.shift_seeds} sampler seed{'s' if p.shift_seeds > 1 else ''}; mean ± sd over seeds).",
            "",
            f"![distribution-shift data](img/{self.figs['shift_data']})",
            "",
            f"![distribution shift](img/{self.figs['shift']})",
            "",
            "Final log-evidence:",
            "",
            markdown_table(["model", "log Z in order", "log Z shuffled", "difference", "rel. difference",
                            "annealing steps in order", "annealing steps shuffled"], rows),
            "Per seed (in order / shuffled):",
            "",
            markdown_table(["model"] + [f"seed {s}" for s in range(p.shift_seeds)], seed_rows),
            "The change-point signal in the in-order runs (seed 0): annealing steps and log predictive per observation of "
            "the first chunk holding post-change rows against the mean of the (up to) 4 chunks before it (the first "
            "chunk, which starts from the prior, left out).",
            "",
            markdown_table(["model", "change at", "steps before", "steps at change", "log pred./obs before",
                            "log pred./obs at change"], cp_rows),
        ])

    # figures ------------------------------------------------------------------------------------
    def _save(self, fig, name: str) -> None:
        self.img.mkdir(parents=True, exist_ok=True)
        fname = f"bench_{name}{'_quick' if self.plan.quick else ''}.png"
        fig.savefig(self.img / fname, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
        self.figs[name] = fname

    def _fig_linear(self) -> None:
        import matplotlib.pyplot as plt

        ends, _ = self.lin_exact
        fig, ax = plt.subplots(1, 1, figsize=(7, 4))
        for k, c in (("paper", "C0"), ("accurate", "C1")):
            for i, e in enumerate(self.lin_rel[k]):
                ax.plot(ends, e, color=c, lw=0.7, alpha=0.6, label=f"SGAIS {k} ({len(self.lin_rel[k])} seeds)" if i == 0 else None)
        ax.axhline(TARGET_PAPER_REL, color="C0", ls=":", lw=1, label="target, paper preset")
        ax.axhline(TARGET_ACCURATE_REL, color="C1", ls=":", lw=1, label="target, accurate preset")
        ax.set(xscale="log", yscale="log", xlabel="n (observations)", ylabel="|log Z_hat - log Z| / |log Z|",
               title="Linear regression: relative error of the online estimate")
        ax.legend(fontsize=8)
        self._save(fig, "linear_accuracy")

    def _fig_refs(self) -> None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 3, figsize=(15, 8))
        for col, key in enumerate(("linear", "logistic", "gmm")):
            refs = self.refs[key]
            if key == "linear":
                ends, ex = self.lin_exact
                curves = {f"SGAIS {k} (seed mean)": (ends, np.array([r["trace"]["log_evidence"] for r in self.lin_runs[k]]).mean(0),
                                                     self.lin_wall[k].mean(0)) for k in ("paper", "accurate")}
                axes[0, col].plot(ends, ex / ends, color="k", lw=1, ls="--", label="exact")
            else:
                labels = {"in-order": "SGAIS in order", "shuffled": "SGAIS shuffled (other rows until the last n)"}
                curves = {labels[o]: (r["trace"]["n"], r["trace"]["log_evidence"], r["trace"]["wall"])
                          for o, r in self.sgais_other[key].items()}
            for i, (lab, (n, z, t)) in enumerate(curves.items()):
                axes[0, col].plot(n, z / n, lw=1, color=f"C{i}", label=lab)
                axes[1, col].plot(n, t, lw=1, color=f"C{i}", label=lab)
            for j, (m, lab) in enumerate((("ais", "AIS"), ("ais_per_row", "AIS per-row grads"), ("dynesty", "dynesty"))):
                if m not in refs:
                    continue
                pts = [(n, r) for n, r in refs[m].items() if _ref_time(r) is not None]
                if not pts:
                    continue
                ns = np.array([n for n, _ in pts])
                if m != "ais_per_row":
                    axes[0, col].plot(ns, [r["log_evidence"] / n for n, r in pts], "o", color=f"C{j + 2}", label=lab)
                axes[1, col].plot(ns, [r["seconds"] for _, r in pts], "o", color=f"C{j + 2}", label=lab)
            axes[0, col].set(xscale="log", xlabel="n", ylabel="log Z / n", title=T.DATASETS[key].title)
            axes[1, col].set(xscale="log", yscale="log", xlabel="n", ylabel="seconds (cumulative for SGAIS)")
            axes[0, col].legend(fontsize=7)
            axes[1, col].legend(fontsize=7)
        fig.tight_layout()
        self._save(fig, "references")

    def _fig_speed(self) -> None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for key, run in (("linear", self.speed_lin), ("gmm", self.sgais_other["gmm"]["in-order"])):
            tr = run["trace"]
            w = 25  # trailing windows of up to w chunks (fewer at the start)
            med = np.array([np.median(tr["seconds"][max(0, i - w + 1): i + 1]) for i in range(len(tr["n"]))])
            c = np.concatenate([[0.0], np.cumsum(tr["steps"], dtype=np.float64)])
            i = np.arange(1, len(c))
            stp = (c[i] - c[np.maximum(i - w, 0)]) / np.minimum(i, w)
            axes[0].plot(tr["n"], med * 1000, lw=1, label=T.DATASETS[key].title)
            axes[1].plot(tr["n"], stp, lw=1, label=T.DATASETS[key].title)
        axes[0].set(xscale="log", yscale="log", xlabel="n", ylabel="ms per chunk (trailing median of 25)",
                    title="time per chunk of 500")
        axes[1].set(xscale="log", xlabel="n", ylabel="annealing steps per chunk (trailing mean of 25)", title="annealing steps")
        for a in axes:
            a.legend(fontsize=8)
        fig.tight_layout()
        self._save(fig, "speed")

    def _fig_shift(self) -> None:
        import matplotlib.pyplot as plt

        x, changes = distribution_shift_data(self.plan.shift_n, 0)
        x = x.numpy()
        fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharex=True, sharey=True)
        bounds = [0, *changes, len(x)]
        titles = [f"rows {a:,}-{b - 1:,}" for a, b in zip(bounds[:-1], bounds[1:])] + ["all rows"]
        parts = [x[a:b] for a, b in zip(bounds[:-1], bounds[1:])] + [x]
        for ax, part, t in zip(axes, parts, titles):
            ax.hist2d(part[:, 0], part[:, 1], bins=80, range=[[-8, 8], [-7, 8]], cmap="viridis")
            ax.plot(SHIFT_MEANS[:, 0], SHIFT_MEANS[:, 1], "r+", ms=6)
            ax.set_title(t)
        fig.tight_layout()
        self._save(fig, "shift_data")

        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for i, k in enumerate(SHIFT_PHASES):
            for order, ls in (("in-order", "-"), ("shuffled", "--")):
                tr = self.shift_runs[(k, order, 0)]["trace"]
                axes[0].plot(tr["n"], tr["log_evidence"] / tr["n"], ls=ls, color=f"C{i}", lw=1.2, label=f"K={k} {order}")
                for seed in range(1, self.plan.shift_seeds):  # other seeds, faint
                    tr = self.shift_runs[(k, order, seed)]["trace"]
                    axes[0].plot(tr["n"], tr["log_evidence"] / tr["n"], ls=ls, color=f"C{i}", lw=0.6, alpha=0.35)
            tr = self.shift_runs[(k, "in-order", 0)]["trace"]
            axes[1].plot(tr["n"], tr["steps"], color=f"C{i}", lw=0.8, label=f"K={k} in order")
        for a in axes:
            for c in changes:
                a.axvline(c, color="gray", ls=":", lw=1)
            a.set_xscale("log")
            a.set_xlabel("n (observations)")
            a.legend(fontsize=8)
        axes[0].set(ylabel="log Z / n", title="log Z / n, seed 0 (faint: other seeds; dotted: change points)")
        axes[1].set(ylabel="annealing steps per chunk", title="annealing steps, in-order data")
        fig.tight_layout()
        self._save(fig, "shift")

    # document -----------------------------------------------------------------------------------
    def run(self) -> str:
        p = self.plan
        sections = []
        _log(f"{'quick' if p.quick else 'full'} mode, time cap {p.cap:.0f} s")
        sections.append(self.linear_accuracy())
        sections.append(self.references())
        sections.append(self.speed())
        sections.append(self.shift())
        elapsed = time.perf_counter() - self.t_start
        return self._document(sections, elapsed)

    def _document(self, sections: list[str], elapsed: float) -> str:
        p = self.plan
        m = machine()
        load_end = os.getloadavg()
        head = [  # the file's title stays outside: write_section puts this between the paper's markers
            f"Generated by `cusp bench paper{' --quick' if p.quick else ''}` (`bench/paper.py`) on {m['date']}; "
            f"the whole run took {elapsed / 60:.1f} minutes. Everything below, every ratio included, was measured in that one "
            "run, the peers of each ratio one after the other on the same machine.",
            "",
            f"- Machine: {m.get('Model name', 'unknown')}, {m.get('CPU(s)', '?')} cores"
            + (f" ({m['Hypervisor vendor']} guest)" if "Hypervisor vendor" in m else "")
            + f"; Python {m['python']}, torch {m['torch']}, numpy {m['numpy']}, dynesty {m['dynesty']}; "
            f"mixture kernel: {m['mixture kernel']}.",
            "- Every run uses one thread (`torch.set_num_threads(1)`) in its own process, as in the paper (section 6.1).",
            f"- Load average (1/5/15 min) at the start: {', '.join(f'{v:.2f}' for v in self.load_start)}; at the end: "
            f"{', '.join(f'{v:.2f}' for v in load_end)}. The machine is shared and noisy: absolute times drift from run "
            "to run (tens of percent); ratios between peers measured in the same run are more stable.",
            f"- Mode: {'quick (smaller n, fewer seeds, dynesty only for linear regression at n = 1e3)' if p.quick else 'full'}; "
            f"reference time cap {fmt_seconds(p.cap)}.",
            "- Data sets: `bench/data.py` (seeded, prefix-consistent: the first n rows of the largest set).",
        ]
        head += [f"- {note}" for note in p.notes]
        head += [
            "",
            "## Targets",
            "",
            markdown_table(["target", "measured", "result"], self.summary, align="llc"),
        ]
        return "\n".join(head) + "\n" + "\n\n".join(sections) + "\n"


def run(args) -> int:
    torch.set_num_threads(1)
    plan = Plan.make(args.quick, args.time_cap)
    out = Path(args.out)
    img = Path(args.img_dir) if args.img_dir else out.parent / "img"
    bench = PaperBench(plan, out, img)
    doc = bench.run()
    write_section(out, "paper", doc)
    _log(f"wrote {out} and {len(bench.figs)} figures under {img}")
    return 0
