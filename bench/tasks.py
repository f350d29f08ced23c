"""Benchmark work units. Each runs in its own single-threaded child process (``isolated``) so
that a time cap can stop it, its peak memory is its own, and one run's heap does not slow
the next. Work units take only small arguments (a data-set key, n, seeds) and build their
data inside the child.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import resource
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench import data as D

# --- data sets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSet:
    key: str
    spec: str
    columns: int
    title: str


DATASETS = {
    # SGAIS on request: the paper bench measures the sampler, not the closed form cusp uses by default
    "linear": DataSet("linear", "linear-regression:sampler=sgais", 6, "linear regression (5 features, noise 1; 6 parameters)"),
    "logistic": DataSet("logistic", "logistic-regression:classes=4", 11, "logistic regression (10 features, 4 classes; 44 parameters)"),
    "gmm": DataSet("gmm", "gmm:components=5", 2, "Gaussian mixture (2-D, 5 components; 25 parameters)"),
    "shift3": DataSet("shift3", "gmm:components=3", 2, "distribution shift, GMM K=3"),
    "shift5": DataSet("shift5", "gmm:components=5", 2, "distribution shift, GMM K=5"),
    "shift7": DataSet("shift7", "gmm:components=7", 2, "distribution shift, GMM K=7"),
}


def make_data(key: str, n: int, seed: int = 0, order: str = "in-order", shuffle_n: int | None = None) -> torch.Tensor:
    """The first ``n`` rows of data set ``key``; ``order='shuffled'``: the first ``n`` rows of a
    seeded permutation of the first ``shuffle_n`` (default ``n``) rows."""
    total = max(n, shuffle_n or 0) if order == "shuffled" else n
    if key == "linear":
        x = D.linear_regression_data(total, seed)
    elif key == "logistic":
        x = D.logistic_regression_data(total, seed)
    elif key == "gmm":
        x = D.gmm_data(total, seed)
    elif key.startswith("shift"):
        x, _ = D.distribution_shift_data(total, seed)
    else:
        raise KeyError(f"unknown data set {key!r}")
    if order == "shuffled":
        x = D.shuffled(x, seed)
    elif order != "in-order":
        raise ValueError(f"unknown order {order!r}")
    return x[:n].contiguous()


def make_model(key: str):
    from models import build_model

    ds = DATASETS[key]
    return build_model(ds.spec, n_columns=ds.columns)


# --- process isolation ----------------------------------------------------------------------

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        # fork: no re-import of torch or of the caller's __main__ per run (the parent keeps
        # torch single-threaded, so there is no thread pool to break in the child)
        try:
            _CTX = mp.get_context("fork")
        except ValueError:  # pragma: no cover - platforms without fork
            _CTX = mp.get_context("spawn")
    return _CTX


#: the share of the machine's memory a work unit's address space may take (``_limit_memory``)
MEMORY_SHARE = 0.6


def _limit_memory(share: float = MEMORY_SHARE) -> None:
    """Cap this process's address space at ``share`` of the machine's memory, so that a run that
    grows without bound fails in its own process with MemoryError, which ``_child`` reports,
    instead of waking the kernel's OOM killer (seen: dynesty on 1e6 rows of linear regression
    reached 24 GB beside another benchmark; the killer ended it, and ``cusp bench paper`` with
    it, after 30 minutes, and might as well have ended the other job)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = int(total * share) if hard == resource.RLIM_INFINITY else min(int(total * share), hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):  # pragma: no cover - no such limit here
        pass


def _child(conn, name: str, kwargs: dict) -> None:
    torch.set_num_threads(1)
    _limit_memory()
    try:
        out = {"status": "ok", **globals()[name](**kwargs)}
    except BaseException as exc:  # report everything, the parent decides
        out = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    conn.send(out)
    conn.close()


def isolated(name: str, timeout: float | None = None, **kwargs: Any) -> dict:
    """Run work unit ``name(**kwargs)`` in a fresh child (its address space capped at
    ``MEMORY_SHARE`` of the machine's memory); returns its dict with ``status`` 'ok', 'error' or
    'timeout' (killed after ``timeout`` seconds) and ``wall`` (parent-side)."""
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(send, name, kwargs), daemon=True)
    t0 = time.perf_counter()
    p.start()
    send.close()
    out: dict
    try:
        if recv.poll(timeout):
            out = recv.recv()
        else:
            out = {"status": "timeout"}
    except EOFError:
        out = {"status": "error", "error": f"child exited with code {p.exitcode}"}
    if out["status"] == "timeout":
        p.terminate()
    p.join(10)
    if p.is_alive():  # pragma: no cover - stuck child
        p.kill()
        p.join()
    recv.close()
    out["wall"] = time.perf_counter() - t0
    return out


# --- memory ---------------------------------------------------------------------------------

def _status_kib(field_name: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return float(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        pass
    return None


def reset_peak() -> None:
    """Reset this process's peak-RSS mark (Linux >= 4.0: ``clear_refs`` 5), so a forked child
    does not report its parent's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - not Linux or not permitted
        pass


def maxrss_mib() -> float:
    """Peak resident memory of this process since ``reset_peak`` (VmHWM; ru_maxrss elsewhere)."""
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # pragma: no cover


def cpu_jiffies() -> tuple[int, int] | None:
    """(steal, total) jiffies of the whole machine since boot (/proc/stat), or None where not
    available. Steal is time this guest's CPUs were runnable but the hypervisor ran something
    else: the neighbours' share of a shared machine, which slows a timed run without any sign in
    the run itself."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):  # pragma: no cover - not Linux
        return None
    if len(fields) < 8:  # pragma: no cover - very old kernels
        return None
    return fields[7], sum(fields[:8])


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The fraction of the machine's CPU time stolen by the hypervisor between two ``cpu_jiffies``."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - not Linux
        return float("nan")


# --- work units -----------------------------------------------------------------------------

def sgais_run(key: str, n: int, seed: int = 0, preset: str = "paper", order: str = "in-order",
              data_seed: int = 0, chunk_size: int = 500, checkpoints: tuple[int, ...] = (),
              overrides: dict | None = None) -> dict:
    """SGAIS over the first ``n`` rows; per-chunk trace, cumulative wall time of the sampler
    alone (data generation and bookkeeping excluded) and memory at ``checkpoints``."""
    from service.sgais import SGAISConfig, build_sampler

    x = make_data(key, n, data_seed, order)
    model = make_model(key)
    sampler = build_sampler(model, SGAISConfig.preset(preset, **(overrides or {})))
    reset_peak()
    base_maxrss, base_rss = maxrss_mib(), rss_mib()
    cps = set(checkpoints)
    cols = {k: [] for k in ("n", "log_evidence", "steps", "seconds", "wall", "capped", "resamples", "ess_min")}
    mem = []
    elapsed = 0.0
    jiffies0 = cpu_jiffies()
    it = sampler.run(x, chunk_size, seed=seed)
    while True:
        t0 = time.perf_counter()
        try:
            _, r, _ = next(it)
        except StopIteration:
            break
        elapsed += time.perf_counter() - t0
        cols["n"].append(r.n)
        cols["log_evidence"].append(r.log_evidence)
        cols["steps"].append(r.annealing_steps)
        cols["seconds"].append(r.seconds)
        cols["wall"].append(elapsed)
        cols["capped"].append(r.capped)
        cols["resamples"].append(r.resamples)
        cols["ess_min"].append(r.ess_min)
        if r.n in cps:
            mem.append({"n": r.n, "maxrss_mib": maxrss_mib() - base_maxrss, "rss_mib": rss_mib() - base_rss})
    return {
        "trace": {k: np.asarray(v) for k, v in cols.items()}, "memory": mem,
        "base_maxrss_mib": base_maxrss, "seconds": elapsed, "steal": steal_share(jiffies0, cpu_jiffies()),
    }


def _no_stats_model(model):
    """The same model with its additive-statistics fast path switched off, so that full-data
    AIS evaluates every gradient over every row (the paper's AIS cost model)."""
    from dataclasses import dataclass as _dataclass, fields

    base = type(model)
    cls = _dataclass(frozen=True)(type(f"{base.__name__}PerRow", (base,), {"has_stats": False, "__module__": __name__}))
    return cls(**{f.name: getattr(model, f.name) for f in fields(model)})


def ais_run(key: str, n: int, seed: int = 0, preset: str = "paper", data_seed: int = 0, per_row: bool = False,
            overrides: dict | None = None) -> dict:
    """``full_data_ais`` on the first ``n`` rows (``overrides``: config settings over the preset)."""
    from service.sgais import SGAISConfig, full_data_ais

    x = make_data(key, n, data_seed)
    model = make_model(key)
    if per_row and model.has_stats:
        model = _no_stats_model(model)
    t0 = time.perf_counter()
    r = full_data_ais(model, x, SGAISConfig.preset(preset, **(overrides or {})), seed)
    return {
        "seconds": time.perf_counter() - t0, "log_evidence": r.log_evidence, "steps": r.annealing_steps,
        "resamples": r.resamples, "capped": r.capped, "ess_min": r.ess_min,
    }


def prior_transform(key: str, model):
    """Unit cube -> the model's unconstrained parameters, distributed as its prior."""
    from scipy.special import ndtri

    if key in ("linear", "logistic"):
        scale = float(getattr(model, "prior_scale", 1.0))
        return lambda u: scale * ndtri(u)
    k, d = model.components, model.n_columns

    def gmm(u: np.ndarray) -> np.ndarray:
        e = -np.log1p(-u)  # Exp(1) draws
        z = np.log(e[:k])  # g_k ~ Exp(1), weights = g / sum g ~ Dirichlet(1)
        var = 1.0 / e[k + k * d:]  # 1 / Gamma(1, 1) = InvGamma(1, 1)
        mu = np.sqrt(4.0 * var) * ndtri(u[k: k + k * d])
        return np.concatenate([z, mu, np.log(var)])

    return gmm


class _OutOfTime(Exception):
    pass


def dynesty_run(key: str, n: int, seed: int = 0, data_seed: int = 0, cap: float = 300.0) -> dict:
    """dynesty's static NestedSampler with its defaults on the first ``n`` rows; the
    likelihood is the model's own ``log_likelihood`` summed over all rows. Stops itself
    after ``cap`` seconds and reports how far it got."""
    import dynesty

    x = make_data(key, n, data_seed)
    model = make_model(key)
    rows = model.featurize(x)
    calls = [0]

    def loglike(theta: np.ndarray) -> float:
        calls[0] += 1
        with torch.inference_mode():
            v = float(model.log_likelihood(torch.from_numpy(theta)[None], rows).sum())
        return v if math.isfinite(v) else -1e300

    progress = {}
    t0 = time.perf_counter()

    def watch(results, niter, ncall, **kw):
        progress.update(niter=niter, ncall=ncall, logz=float(results.logz), delta_logz=float(results.delta_logz))
        if time.perf_counter() - t0 > cap:
            raise _OutOfTime

    sampler = dynesty.NestedSampler(loglike, prior_transform(key, model), model.dim, rstate=np.random.default_rng(seed))
    try:
        sampler.run_nested(print_progress=True, print_func=watch)
    except _OutOfTime:
        return {"finished": False, "seconds": time.perf_counter() - t0, "calls": calls[0], **progress}
    res = sampler.results
    return {
        "finished": True, "seconds": time.perf_counter() - t0, "calls": calls[0], "niter": int(res.niter),
        "log_evidence": float(res.logz[-1]), "log_evidence_err": float(res.logzerr[-1]),
    }


def allocate(gib: float) -> dict:
    """Reserve ``gib`` GiB (not touched): checks ``_limit_memory`` (tests)."""
    return {"bytes": np.empty(int(gib * 2**30), dtype=np.uint8).nbytes}


def loglike_cost(key: str, n: int, data_seed: int = 0, reps: int = 20) -> dict:
    """Seconds per single-particle full-data log-likelihood call (predicts dynesty's cost)."""
    x = make_data(key, n, data_seed)
    model = make_model(key)
    rows = model.featurize(x)
    theta = model.sample_prior(torch.Generator().manual_seed(0), 1)
    with torch.inference_mode():
        float(model.log_likelihood(theta, rows).sum())
        t0 = time.perf_counter()
        for _ in range(reps):
            float(model.log_likelihood(theta, rows).sum())
    return {"seconds": (time.perf_counter() - t0) / reps}


def profile_run(key: str, n: int, warm: int = 20_000, preset: str = "paper", top: int = 8) -> dict:
    """cProfile of SGAIS over rows ``warm..n`` (after ``warm`` rows unprofiled): the functions
    with the most own time, as (function, calls, own seconds, cumulative seconds, share)."""
    import cProfile
    import pstats

    from service.sgais import SGAISConfig, build_sampler

    x = make_data(key, n)
    sampler = build_sampler(make_model(key), SGAISConfig.preset(preset))
    it = sampler.run(x, 500, seed=0)
    for _ in range(warm // 500):
        next(it)
    prof = cProfile.Profile()
    prof.enable()
    for _ in it:
        pass
    prof.disable()
    st = pstats.Stats(prof)
    total = st.total_tt
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        where = f"{os.path.relpath(file, root)}:{line}({fn})" if file.startswith(root) else (fn if file == "~" else f"{fn}")
        rows.append({"function": where, "calls": nc, "own": tt, "cumulative": ct, "share": tt / total if total else 0.0})
    return {"total": total, "rows": rows, "observations": n - warm}
