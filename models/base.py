"""The model protocol every cusp model implements, and the errors models raise.

Conventions (owned here, relied on by the engine):
- Parameters ``theta: [M, D]`` live in an unconstrained space; a model that needs
  constraints transforms them and adds the log-Jacobian inside ``log_prior`` so that the
  induced prior on the constrained parameters is exactly the one the model documents.
- Data arrive as raw rows ``[B, C]`` (float64, the stream's columns in order);
  ``featurize`` turns them into the model's working rows ``[B, F]`` once (the engine keeps
  these in its reservoir), and every likelihood function takes featurized rows.
- ``log_likelihood(theta [M, D], rows [B, F]) -> [M, B]``: per observation.
- ``grad_log_likelihood(theta [M, D], rows [B, F], weights [B]) -> [M, D]``: the gradient of
  ``sum_b weights[b] * log p(rows[b] | theta)`` — the engine's only gradient call, so the
  tempered chunk and the scaled mini-batch share one pass. The base class computes it with
  autograd; models override it with closed forms (checked against autograd in the tests).
- Everything is float64 and runs under ``torch.inference_mode`` in the engine. The autograd
  defaults of ``grad_log_prior`` and ``grad_log_likelihood`` leave inference mode for their
  own computation, so a model that gives only ``dim``, ``sample_prior``, ``log_prior`` and
  ``log_likelihood`` runs (a plug-in, ``models.registry``); closed forms are faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import ClassVar

import torch

LOG_2PI = math.log(2.0 * math.pi)

#: ``grad(theta [M, D], i) -> [M, D]``: the gradient of the log target at SGHMC evaluation ``i``
RunGradient = Callable[[torch.Tensor, int], torch.Tensor]


class ModelError(ValueError):
    """A model specification or a data set that does not fit a model (bad settings, wrong width, bad labels).
    ``row`` and ``column``: the value it names, where it names one (``column j`` in the message)."""

    def __init__(self, message: str, *, row: int | None = None, column: int | None = None):
        super().__init__(message)
        self.row, self.column = row, column

    def naming(self, columns) -> str:
        """The message with its column named as the stream names it (a new user's trial: `poisson` said
        "row 0, column 0 has 1.5" where every other error said column 'errors')."""
        text = str(self)
        if self.column is None or not 0 <= self.column < len(columns):
            return text
        return text.replace(f"column {self.column} ", f"column {columns[self.column]!r} ", 1)


def check_counts(name: str, y: torch.Tensor) -> torch.Tensor:
    """``y`` as float64 when every value is a whole number >= 0 (at most 2^53), else a ModelError
    naming the first that is not (the count models' ``featurize``)."""
    y = y.to(torch.float64)
    bad = ~torch.isfinite(y) | (y < 0) | (y != torch.round(y)) | (y > 2**53)
    if bool(bad.any()):
        i, j = (int(v) for v in torch.nonzero(bad)[0])
        v = float(y[i, j])
        why = (f"counts must be at most 2^53 = {2**53:,} (beyond it a float64 holds no exact count)" if v > 2**53
               and math.isfinite(v) else "counts must be whole numbers >= 0")
        raise ModelError(f"{name}: {why}; row {i}, column {j} has {v!r}", row=i, column=j)
    return y


@dataclass(frozen=True)
class Model:
    """Base class. Subclasses are frozen dataclasses whose fields are the model's settings."""

    name: ClassVar[str] = ""
    #: the posterior can have poor local modes (label switching, merged components): a
    #: restart may beat the incumbent with no change in the data (``service.detect``)
    multimodal: ClassVar[bool] = False
    #: the model has a closed-form posterior and evidence (``exact_init`` / ``exact_update`` /
    #: ``exact_row_log_predictive``): conjugate models
    conjugate: ClassVar[bool] = False
    #: the model has no particle form (no prior sampler or likelihood for SGAIS): exact method only
    exact_only: ClassVar[bool] = False
    #: exact models whose rows are exchangeable given the parameters (no lags, no time) and whose
    #: ``exact_update`` is costly: the evidence of every suffix of some rows is then one pass over
    #: them backwards (``service.detect.Detector._refine``)
    exchangeable: ClassVar[bool] = False
    #: whether the detector takes rows out as outliers with ``exact_skip`` (``Detector._watch``,
    #: ``_outlier_log_bf``); False where a model can skip a row but the detector does better without
    skips_outliers: ClassVar[bool] = True
    #: number of raw columns the model reads (set by the factory from the stream's columns)
    n_columns: int = field(default=1, kw_only=True)
    #: how the evidence is computed: 'exact' (closed form; conjugate models only), 'sgais', or
    #: 'auto' (exact where the model has a closed form, else SGAIS). A spec setting like any other
    #: (``gaussian:sampler=sgais``), so it is chosen per model.
    sampler: str = field(default="auto", kw_only=True)

    # --- shape -------------------------------------------------------------------------
    @property
    def dim(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def feature_width(self) -> int:
        """Width F of featurized rows."""
        return self.n_columns

    def parameter_names(self) -> list[str]:
        return [f"theta[{i}]" for i in range(self.dim)]

    # --- data ----------------------------------------------------------------------------
    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        """Raw rows ``[B, C]`` -> working rows ``[B, F]``; raises ModelError on data the model cannot take."""
        self.check_width(data)
        return data.to(torch.float64)

    def check_width(self, data: torch.Tensor) -> None:
        if data.dim() != 2 or data.shape[1] != self.n_columns:
            raise ModelError(
                f"model {self.name!r} reads {self.n_columns} columns per row, got rows of shape {tuple(data.shape)}"
            )

    # --- densities -------------------------------------------------------------------------
    def sample_prior(self, generator: torch.Generator, n: int) -> torch.Tensor:  # pragma: no cover - abstract
        """``n`` draws from the prior, in unconstrained space: ``[n, D]``."""
        raise NotImplementedError

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Log prior density of unconstrained ``theta [M, D]`` (log-Jacobian included): ``[M]``."""
        raise NotImplementedError

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """``[M, D]``; autograd by default (``autograd_input``: it works inside the engine's inference mode)."""
        with torch.inference_mode(False), torch.enable_grad():
            t = autograd_input(theta).requires_grad_(True)
            (g,) = torch.autograd.grad(self.log_prior(t).sum(), t)
        return g

    def log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Per-observation log-likelihood: ``theta [M, D]``, ``rows [B, F]`` -> ``[M, B]``."""
        raise NotImplementedError

    #: rows per block of ``total_log_likelihood``
    TOTAL_BLOCK_ROWS: ClassVar[int] = 8192

    def total_log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``sum_b log p(rows[b] | theta)`` per particle, ``[M]``, over blocks of ``TOTAL_BLOCK_ROWS``
        rows. Why blocks: ``log_likelihood`` over a whole reservoir writes an [M, R] array (8 MB for
        10 particles and 100,000 rows) only to sum it; a worker's resident set then keeps the peak of
        those transients (the allocator's high-water mark), which looked like growth with n."""
        if rows.shape[0] <= self.TOTAL_BLOCK_ROWS:
            return self.log_likelihood(theta, rows).sum(1)
        out = torch.zeros(theta.shape[0], dtype=torch.float64)
        for start in range(0, rows.shape[0], self.TOTAL_BLOCK_ROWS):
            out += self.log_likelihood(theta, rows[start : start + self.TOTAL_BLOCK_ROWS]).sum(1)
        return out

    def grad_log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Gradient of ``sum_b weights[b] * log p(rows[b] | theta)`` per particle: ``[M, D]``; autograd by default."""
        with torch.inference_mode(False), torch.enable_grad():
            t = autograd_input(theta).requires_grad_(True)
            ll = self.log_likelihood(t, autograd_input(rows))
            (g,) = torch.autograd.grad((ll * autograd_input(weights)).sum(), t)
        return g

    # --- additive sufficient statistics (optional fast path) ---------------------------------
    #: True when the model implements ``stats`` and ``grad_from_stats``: its weighted
    #: log-likelihood gradient is a function of additive per-row statistics, so the engine can
    #: reduce a whole SGHMC run's mini-batches in one batched product.
    has_stats: ClassVar[bool] = False
    #: The arithmetic of ``sampled_run_gradient``, the gradient that moves the particles ('float64'
    #: or 'float32'). It never enters the evidence (log-likelihoods are float64), and float32
    #: rounding (about 1e-7 relative) sits far under the mini-batch noise of that gradient;
    #: tests hold each model's run gradient to the rounding of its declared precision.
    run_precision: ClassVar[str] = "float64"
    #: The largest |value| the model takes in its frame, (y - centre) / scale (without a frame: |y|;
    #: a stream's values are within 1e150 anyway). Beyond it the model's statistics or its sampler's
    #: kernels leave their floating point: the API refuses such a chunk (422 naming the model, row
    #: and column), ``cusp.Detector`` raises ``InputError``, a worker dead-letters it
    #: (``service.sgais.engine.beyond_limit``). The exact models took 1e153 (one value among rows
    #: in a frame of sd 1.6e-5; ``student-t`` overflowed at 6.7e153).
    value_limit: ClassVar[float] = 1e150

    def stats(self, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:  # pragma: no cover - optional
        """``sum_b weights[b] * phi(rows[..., b, :])`` for rows ``[..., B, F]``: ``[..., S]``
        (``weights`` None: all ones, without the multiply)."""
        raise NotImplementedError

    def grad_from_stats(self, theta: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:  # pragma: no cover - optional
        """``[M, D]``, equal to ``grad_log_likelihood(theta, rows, weights)`` for ``stats = stats(rows, weights)``."""
        raise NotImplementedError

    def sampled_stats(self, pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``stats`` of each mini-batch ``pool[idx[i]]`` (``idx [E, Bm]``, Bm > 0), unweighted: ``[E, S]``.
        The default gathers the rows; a model can reduce them inside its own kernel instead."""
        return self.stats(gather(pool, idx))

    # --- one SGHMC run's gradients (the engine's hot loop) -------------------------------------
    # An SGHMC run evaluates the gradient E times on rows fixed before it starts. These hooks
    # let a model prepare, once per run, whatever every evaluation reuses; the defaults just
    # call the per-evaluation functions. Overrides must equal the defaults up to rounding
    # (tests/test_models.py checks them).
    def run_gradient(self, rows: torch.Tensor, weights: torch.Tensor) -> RunGradient:
        """Gradient of ``sum_b weights[b] log p(rows[i, b] | theta) + log p(theta)`` at evaluation
        ``i``, for rows ``[E, B, F]`` and weights ``[B]``."""
        return lambda theta, i: self.grad_log_likelihood(theta, rows[i], weights) + self.grad_log_prior(theta)

    def sampled_run_gradient(
        self, chunk: torch.Tensor, lam: float, pool: torch.Tensor, idx: torch.Tensor, pool_weight: float,
    ) -> RunGradient:
        """The engine's form of ``run_gradient``: evaluation ``i`` sees the chunk ``[B, F]`` with
        weight ``lam`` followed by the mini-batch ``pool[idx[i]]`` (``idx [E, Bm]``, Bm may be 0)
        with weight ``pool_weight``. The default gathers those rows and calls ``run_gradient``; a
        model can gather inside its own kernel instead. The returned gradient may also carry
        ``euler(theta, v, noise, eta, decay, steps)``, the whole run's Euler integration in place on
        numpy arrays, which ``service.sgais.kernel.euler`` then uses."""
        return self.run_gradient(*sampled_rows(chunk, lam, pool, idx, pool_weight))

    def stats_gradient(self, stats: torch.Tensor) -> RunGradient:
        """As ``run_gradient``, from the statistics of each evaluation's weighted rows ``[E, S]``."""
        return lambda theta, i: self.grad_from_stats(theta, stats[i]) + self.grad_log_prior(theta)

    # --- a check against the dominant mode (optional; models with poor local modes) -------------
    #: True when the model gives ``mode_gap(theta, fit_rows, generator, all_rows, all_scale)
    #: -> float``: how far (nats of the log joint, the history's log-likelihood estimated by
    #: ``all_rows`` times ``all_scale``) the best particle sits below the best mode the model's own
    #: optimiser finds from ``fit_rows`` (``models/mixture.py``); with ``mode_fit`` (the gap and the fit)
    #: and ``propose_configuration`` (whole configurations drawn around the fit), the sampler also moves
    #: particles that sit far below the fit (``Sampler._check_modes``)
    checks_modes: ClassVar[bool] = False

    # --- exact answers (conjugate models only) ---------------------------------------------
    # The posterior is a flat float64 vector of its parameters ``post [P]``; these functions are
    # pure (inputs unchanged) and O(rows) per call, O(1) in the history.
    def exact_init(self) -> torch.Tensor:  # pragma: no cover - conjugate models only
        """The prior's parameters ``[P]``."""
        raise NotImplementedError

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:  # pragma: no cover
        """(the posterior after featurized ``rows [B, F]``, log p(rows | post)): the chunk's exact
        log predictive given everything ``post`` has seen."""
        raise NotImplementedError

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """log p(row_b | post) of each featurized row on its own: ``[B]``."""
        raise NotImplementedError

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """The posterior after featurized ``rows`` seen and not learned from (rows the detector judged
        outliers, ``service.detect.Detector._watch``): time and lags go on past them, what the
        parameters' posterior knows stays. None (the default): the model cannot skip a row, and
        keeps every row it is given."""
        return None

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """The posterior a restart at a change point starts from, given the incumbent's ``post``:
        the prior, unless the model fixes a frame from data (``models/timeseries.py``)."""
        return self.exact_init()

    def exact_conditioned(self, post: torch.Tensor, rows: int) -> int:
        """How many of the next ``rows`` observations ``exact_update`` conditions on without scoring
        them (a model's warm-up, ``models/timeseries.py``); their log predictive is not in its result."""
        return 0

    def exact_log_evidence(self, rows: torch.Tensor) -> float | None:
        """Closed-form log p(rows) for conjugate models (featurized rows); None where there is none."""
        if not self.conjugate:
            return None
        return self.exact_update(self.exact_init(), rows)[1]

    @property
    def has_frame(self) -> bool:
        """Is the prior on a frame fixed from the data's first rows (``frame_info`` not None)?"""
        return hasattr(self, "frame") and bool(getattr(self, "warmup", 0))

    def frame_info(self, post: torch.Tensor | None) -> dict | None:
        """The frame a prior fixed from the data's first rows is on, for users to see (issue 20):
        None for a model without one (``gaussian`` without a warm-up: its prior is in the data's
        units). Else ``warmup_rows``; ``centre`` and ``scale`` (None while ``post``, the exact
        posterior, is in its warm-up or None; one per column for ``gaussian`` and a several-column
        ``student-t``); ``periods``,
        ``seasonal`` without a period only: each candidate period's posterior probability (the
        prior's before any ``post``). The stream's ``GET``, ``POST /v1/detect`` and ``cusp replay``
        show it."""
        if not self.has_frame:
            return None
        frame = self.frame(post) if post is not None else None
        probabilities = getattr(self, "period_probabilities", None)
        periods = probabilities(post if post is not None else self.exact_init()) if probabilities else None
        return {"warmup_rows": self.warmup, "centre": frame[0] if frame else None, "scale": frame[1] if frame else None,
                "periods": None if periods is None else {_period_label(p): w for p, w in periods.items()}}

    @property
    def exact(self) -> bool:
        """Does the engine compute this model's evidence in closed form (``service.sgais.exact``)?"""
        return self.conjugate and self.sampler != "sgais"

    def check_sampler(self) -> None:
        if self.sampler not in ("auto", "exact", "sgais"):
            raise ModelError(f"model {self.name!r}: sampler must be 'auto', 'exact' or 'sgais', got {self.sampler!r}")
        if self.sampler == "sgais" and self.exact_only:
            raise ModelError(f"model {self.name!r} runs with the exact method only (no sampler=sgais)")
        if self.sampler == "exact" and not self.conjugate:
            raise ModelError(f"model {self.name!r} has no closed-form evidence: sampler=exact is for conjugate "
                             "models (gaussian, linear-regression); use sampler=sgais or leave it out")

    def spec(self) -> str:
        """The ``name:key=value,...`` spec that rebuilds this model (with the same column count)."""
        from dataclasses import fields

        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if f.name != "n_columns" and not (f.name == "sampler" and self.sampler == "auto")]
        return self.name + (":" + ",".join(parts) if parts else "")


def autograd_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, as a tensor autograd may record: the engine runs under
    ``torch.inference_mode``, whose tensors autograd can neither differentiate nor save for
    backward, so an inference tensor is cloned (outside inference mode; the caller's
    ``torch.inference_mode(False)`` block) and any other is detached without a copy."""
    return x.clone() if x.is_inference() else x.detach()


def gather(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``pool[idx]`` for ``idx [E, Bm]``: ``[E, Bm, F]``. torch's gather, not np.take: as fast with a
    pool out of cache, and numpy's buffers among torch's fragmented the heap (RSS crept ~2 MiB
    per 1e6 rows)."""
    e, bm = idx.shape
    return pool.index_select(0, idx.reshape(-1)).view(e, bm, -1)


def sampled_rows(chunk: torch.Tensor, lam: float, pool: torch.Tensor, idx: torch.Tensor,
                 pool_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows and weights of ``Model.sampled_run_gradient``'s run, gathered: ``[E, B + Bm, F]``
    (the chunk, then ``pool[idx[i]]``) and ``[B + Bm]`` (``lam``, then ``pool_weight``)."""
    e, bm = idx.shape
    b = chunk.shape[0]
    rows = chunk.expand(e, b, chunk.shape[1])
    weights = torch.full((b + bm,), float(lam), dtype=torch.float64)
    if bm:
        rows = torch.cat([rows, gather(pool, idx)], dim=1)
        weights[b:] = pool_weight
    return rows, weights


def normal_logpdf(x: torch.Tensor, mean: torch.Tensor | float, var: torch.Tensor | float) -> torch.Tensor:
    var_t = torch.as_tensor(var, dtype=torch.float64)
    return -0.5 * (LOG_2PI + torch.log(var_t) + (x - mean) ** 2 / var_t)


def _period_label(period: float | tuple[float, ...]) -> str:
    """A candidate period's name in ``frame``'s ``periods``: "24", or "168+24" for a pair of cycles."""
    return "+".join(f"{p:g}" for p in period) if isinstance(period, tuple) else f"{period:g}"
