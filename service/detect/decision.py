"""The decision rule, in one place: which challenger, if any, is a change.

A challenger that has finished its training (``compared``) has a log Bayes factor against the
incumbent; with its prior log odds of a change (hazard and first chunk, ``Detector.
restart_log_prior_odds``) the posterior probability of a change at its start is

    P(change) = sigmoid(log BF + log prior odds).

The most probable challenger that passes the model's sanity checks (``eligible``: for a
mixture, the incumbent's own fit moved off its level) is the candidate; it is a change when
P(change) >= ``threshold`` and the data moved, not just the incumbent (``data_moved``: a mixture
stuck in a poor mode that a restart escapes is not a change). A candidate that fails the second
check is dropped and the next one is judged."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

C = TypeVar("C")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def posterior(log_bayes_factor: float, log_prior_odds: float) -> float:
    """P(change) from a log Bayes factor and the prior log odds of a change."""
    return _sigmoid(log_bayes_factor + log_prior_odds)


def decide(challengers: list[C], log_prior_odds: Callable[[C], float], threshold: float,
           eligible: Callable[[C], bool], data_moved: Callable[[C, Sequence[C]], bool]) -> tuple[C | None, float]:
    """(the winning challenger, its posterior probability) or (None, the best probability seen,
    0.0 if none was eligible). ``challengers`` loses the candidates ``data_moved`` rejects (they
    are no evidence of a change). Each challenger needs ``compared`` and ``log_bf``."""
    while True:
        best, best_post = None, -math.inf
        for c in challengers:
            post = c.log_bf + log_prior_odds(c)
            if c.compared and post > best_post and eligible(c):
                best, best_post = c, post
        confidence = 0.0 if best is None else _sigmoid(best_post)
        if best is None or confidence < threshold:
            return None, confidence
        if data_moved(best, challengers):
            return best, confidence
        challengers.remove(best)  # the incumbent moved, not the data: no change here
