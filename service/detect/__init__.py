"""Change-point detection from SGAIS evidence: a Bayes-factor test between "the model
continues" and "the model restarted at candidate time t".

Per chunk the incumbent SGAIS instance gives log p(chunk | history) (its log predictive).
Cheap signals nominate candidate change points: a chunk whose log predictive per
observation is far from its running level (|z| >= ``surprise``, both directions: a
variance drop makes data *more* likely) or whose annealing-step count spikes; for models with
a closed form also the first chunk of a window of the last 4, 8 or 16 training samples whose
mean log predictive lies ``surprise`` standard errors off the level before it (``signals.
Windows``: a fall in volatility point by point, too small a row for the others); for a mixture
also a chunk its components take in other shares than an evenly spaced sample of the regime's
earlier rows (``signals.shares_moved``, a chi-square test at ``surprise``, its statistic
divided by the dispersion of shares between runs of the regime's recent rows, ``signals.
shares_dispersion``: rows that come in bursts; at most one a training sample): clusters that drop out of the data (7, then 3 of them) leave the log
predictive per observation where it was, the rows losing to the weights what they gain in
entropy. A candidate
starts a **challenger**: a fresh SGAIS instance of the same model, from the prior, fed the
same chunks from t on. After a short training sample (``train`` observations, so that the
comparison does not hinge on how vague the prior is: a partial / intrinsic Bayes factor),

    log BF(t) = [log Z_challenger(t..now) - log Z_challenger(t..t+train)]
                - sum of the incumbent's log predictives over the same chunks

and with a prior probability p of a change at the candidate (by default scale-free: p = 1 -
((1 + r) / (1 + r + B))^0.1 for a first chunk of B rows r rows after the regime began, so
about 0.1 B / r; with a fixed expected run length E, p = 1 - (1 - 1/E)^B) the posterior
probability of a change at t is sigmoid(log BF + log(p / (1-p))). A change must also beat
"its most telling row was an outlier and the old regime went on" (the log BF without that row's
term, L2, an outlier as likely as a change): P = 1 / (1 + e^-(log BF + log(p / (1-p))) + e^-L2)
(``Detector._log_odds``); in chunks of several rows that row is found row by row, from the two
models' one-step predictives (``row_fits``).

The metric-series regressions also get a **level shift** at each candidate: the incumbent's
posterior given the rows before t with the level alone drawn afresh from its prior
(``Model.exact_shift``), exact, compared after one training row (its one new parameter). In a
candidate chunk of several rows their restarts (from the prior, and the level shift) may start
inside it, where a level shift is most probable (``Detector._split``); on a model
with a slope one that wins is placed where a level shift or a slope change (``exact_kink``: a new
slope from the level reached) is most probable and restarts there as both at once
(``Detector._refine``). When it reaches
``threshold`` an Event is reported with that probability as its confidence. With ``adapt``
the challenger replaces the incumbent (its posterior and its history since t), so later
changes are measured against the new regime; the running log-evidence then continues as
log p(y_<t | incumbent) + log p(y_t.. | challenger), the evidence of the model with a
change at t.

A candidate whose first chunk is a training sample on its own (at least ``train`` rows) also
gets a **short-memory** restart: from the posterior given the rows just before it (as many as
its first chunk), compared from its first chunk on (log BF = log p(y_t.. | memory) - the
incumbent's log predictives). Changes that add to the old regime (new mixture components, a
new class balance) keep what still holds, so a restart from the prior, which must learn the
old parameters again, legitimately loses to the incumbent, while a model of the whole history
is slow to give the new part weight; the short memory wins within the chunk. The two
restarts of a candidate share its prior probability of a change (each log(2) less). When a
short memory wins for a unimodal model, the new incumbent is still the restart from the
prior at the change: the memory is old-regime rows, and an incumbent that kept them would
lose to the next restart a few chunks on when the change replaced the old regime.

Candidates come late or early: a CUSUM excursion may begin in noise chunks before the
change. A challenger that ages out while ahead nominates the chunk where its own advantage
began (``_where``), and every challenger is judged against the running level from before its
first chunk (kept with the recent chunks), not the level since, which follows the change. A
short memory that wins at once sits at its nomination, one chunk late when the change's
first chunk did not stand out; ``_earlier`` moves it back when a change one chunk earlier
has the higher evidence. The exact method then places the change at a row (``_refine``); a
sampled model with one mode (logistic regression) instead compares the chunk found with the
ones before and after it, each by the evidence of a change there from a restart from the
prior (``_place``). Every sampled model's change (a mixture's chunk comes from ``_where``) is
then placed at a row of that chunk or the ones before by each row's log predictive under the
winner less that under the incumbent, summed from the row on (``_within``: after clusters
appear, the first row of a new cluster; the chunk's first row stays unless another row is
``SUPPORT_NATS`` ahead and the winner explains the rows from there on better; while the
span's first row is the most probable, the chunk before it is scored too, back to the last
change).

For models whose posterior has poor local modes (``model.multimodal``: mixtures) a winning
restart must also show that the data moved, not the incumbent: ``_data_moved`` (the incumbent's
fit of the rows before the candidate moved with it, or a restart at the candidate fits those
rows, which it never saw, as well as the incumbent, allowing for the rows each saw). A
candidate nominated late, chunks after a change its incumbent's predictive hardly showed, has
new-regime rows before it, which a restart fits better without any poor mode; such a restart
is judged once more on the incumbent's own older rows (an evenly spaced sample of its
reservoir, which the worker and ``OfflineRun`` pass in): a poor mode fits those worse too, a
change does not.

A winning restart of a sampled model must also show that the incumbent's own predictive moved
off its running level (``level_shift`` standard errors, ``_moved``), or for a mixture that its
components took other shares of the restart's rows than of the regime's rows before them (the
same test at ``level_shift``): a restart beats particles stuck in a poor mode without any
change. The exact method on a unimodal model skips this
(``_eligible``): no particles, so a restart that wins wins on the data, while an incumbent that
follows the new regime part way (an AR model's intercept after a level shift) brings its
predictive back to its level as the restart's lead grows.

A challenger retires when it is clearly losing (log BF < ``retire_log_bf``) or older than
``max_age`` observations, except one: of those ahead at their age the one with the highest
log BF is watched on, up to ``Detector.long_age`` = 20 x max(train, 10) observations (a
``max_age`` set in the config is the limit), since a model with few parameters gains its last
nats on a small sustained shift slowly. Everything random comes from the detector's own generator, saved
with its state; challengers' rows are not saved (they are the stream's own chunks since t,
re-read from the input stream on restore), so the state stays small.

    det = Detector(sampler, DetectorConfig())
    dstate = det.init(seed)
    step = det.update(dstate, seq, chunk, inc_before, inc_after, result)
"""

from __future__ import annotations

from service.detect.answer import StreamAnswer, StreamChange, StreamWithdrawal, model_averaged_changes
from service.detect.config import DetectorConfig
from service.detect.detector import SUPPORT_NATS, Detector, detector_seed, stream_window, training_rows
from service.detect.offline import OfflineRun, detect_series, detect_stream
from service.detect.state import MAGIC, Challenger, DetectorState, Event, Recent, Refined, Step

__all__ = [
    "MAGIC", "SUPPORT_NATS", "Challenger", "Detector", "DetectorConfig", "DetectorState", "Event", "OfflineRun", "Recent",
    "Refined", "Step", "StreamAnswer", "StreamChange", "StreamWithdrawal", "detect_series", "detect_stream", "detector_seed",
    "model_averaged_changes", "stream_window", "training_rows",
]
