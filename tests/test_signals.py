"""The detector's parts one at a time (issue 16 item 7): each nomination signal pinned to exact
values and indices on hand-made inputs, the decision rule, and the versioned state codec."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from service.detect import MAGIC, DetectorState
from service.detect.decision import decide, posterior
from service.detect.signals import (Cusum, FlatRun, RunningLevel, StepSpike, Windows, chi2_quantile, shares_dispersion,
                                    shares_moved, weight)


def test_running_level_is_a_plain_mean_first_then_exponential():
    lv = RunningLevel()
    w = [weight(0.1, k) for k in range(4)]
    assert w == [1.0, 0.5, 1 / 3, 0.25]  # 1 / (count + 1) while above the smoothing
    assert weight(0.1, 20) == 0.1
    for x, wk in zip((1.0, 2.0, 3.0), w):
        lv.update(x, 1, wk)
    # by hand: mean 1 -> 1.5 -> 2.0; var 0 -> 0.5 * (0 + 0.5 * 1) = 0.25 -> (2/3) * (0.25 + (1/3) * 1.5^2) = 2/3
    assert (lv.count, lv.mean) == (3, 2.0)
    assert lv.var == pytest.approx(2 / 3, rel=1e-15)
    # a chunk of 4 rows: its mean's sd is spread / 2
    assert lv.sd(4) == pytest.approx(math.sqrt(2 / 3) / 2, rel=1e-15)
    assert lv.z(2.0 - 2 * lv.sd(4), 4) == pytest.approx(-2.0, rel=1e-12)
    lv.reset()
    lv.update(-7.0, 1, weight(0.1, lv.count))  # after a reset the next chunk is the level
    assert (lv.count, lv.mean, lv.var) == (1, -7.0, 0.0)
    assert RunningLevel().spread == 1e-6  # no variance yet: the floor, never a division by zero


def test_step_spike_fires_above_mean_plus_k_sd_plus_one():
    st = StepSpike().update(3.0, 1.0, first=True)
    assert (st.mean, st.var) == (3.0, 0.0)
    # sd floored at 0.5: 3 + 3 x 0.5 + 1 = 5.5
    assert not st.fires(5.5, 3.0) and st.fires(5.6, 3.0)
    st.update(5.0, 0.5, first=False)  # mean 4, var 0.5 * (0 + 0.5 * 4) = 1
    assert (st.mean, st.var) == (4.0, 1.0)
    assert not st.fires(8.0, 3.0) and st.fires(8.01, 3.0)


def test_cusum_nominates_where_the_excursion_began():
    """z = 0, 0, then -1 from index 2 on: the low side drops 0.5 per chunk (drift 0.5) and
    reaches -5 at index 11; it names index 2, where the excursion began, and starts again."""
    cu = Cusum()
    zs = [0.0, 0.0] + [-1.0] * 10 + [-1.0]
    alarms = []
    for i, z in enumerate(zs):
        cu.update(z, i)
        alarms.append(cu.alarms(5.0))
    assert alarms[:11] == [[]] * 11 and alarms[11] == [2]
    assert cu.lo == -0.5 and cu.lo_from == 12  # started again: the chunk after the alarm begins one
    # the high side is symmetric; dropping the oldest recent chunk moves the indices down
    up = Cusum()
    for i, z in enumerate([3.0, 3.0]):
        up.update(z, i + 4)
    assert up.hi == 5.0 and up.alarms(5.0) == [4]
    up.update(1.0, 6)
    up.dropped_oldest()
    assert (up.hi_from, up.lo_from) == (5, 5)
    up.reset()
    assert (up.lo, up.hi) == (0.0, 0.0)


def test_windows_nominate_the_first_chunk_of_a_window_that_moved_off_its_level():
    """Rows of one, level 0 and spread 1 before each: 40 rows at 0, then 0.6 a row (far inside
    the 3 sd surprise; 0.1 a row above the CUSUM's drift, 50 rows to its threshold of 5 even
    were the running level not to follow). The 32-row window's z is
    0.6 k / sqrt(32) with k rows at 0.6 in it: below 3 for k = 28, 3.08 for k = 29, so it fires
    first when row 68 arrives, naming the window's first row, 37; the 8-row window never does
    (at most 0.6 x 8 / sqrt(8) = 1.7)."""
    win = Windows((8, 32), 3.0)
    rows = [(0.0, 1, 0.0, 1.0)] * 40 + [(0.6, 1, 0.0, 1.0)] * 40
    fired = {n: win.nominate(rows[:n]) for n in range(1, 81)}
    assert all(fired[n] == [] for n in range(1, 69))
    assert fired[69] == [37]
    # the other side alike (a variance rise makes rows less likely; a fall, more)
    assert Windows((32,), 3.0).nominate([(0.0, 1, 0.0, 1.0)] * 40 + [(-0.6, 1, 0.0, 1.0)] * 29) == [37]


def test_windows_clip_each_chunk_as_the_cusum_does_and_need_two_chunks_and_a_level():
    win = Windows((8,), 3.0)
    # one wild row (log predictive -100, 100 sd) among 7 at the level: clipped at -3, the
    # window's mean is -3 / 8, z = -3 / sqrt(8) = -1.06: nothing (unclipped, z would be -35)
    assert win.nominate([(0.0, 1, 0.0, 1.0)] * 7 + [(-100.0, 1, 0.0, 1.0)]) == []
    # ... while 8 rows at -1.1 each (z = -1.1 x sqrt(8) = -3.11) fire
    assert win.nominate([(0.0, 1, 0.0, 1.0)] * 3 + [(-1.1, 1, 0.0, 1.0)] * 8) == [3]
    # a chunk of 10 rows is a window only with another: one chunk is the surprise signal's business
    assert win.nominate([(-20.0, 10, 0.0, 1.0)]) == []
    # two chunks of 10 at -1 a row: z = -1 x sqrt(20) = -4.5 (clipping at 3 x 1 / sqrt(10) = 0.95
    # a row: -0.95 x sqrt(20) = -4.2), from the first chunk
    assert win.nominate([(-10.0, 10, 0.0, 1.0), (-10.0, 10, 0.0, 1.0)]) == [0]
    # no level before the window (spread 0: the warm-up, or a new regime): nothing to compare with
    assert win.nominate([(0.0, 1, 0.0, 0.0)] + [(-2.0, 1, 0.0, 1.0)] * 7) == []
    # a window longer than the rows kept: none, and no longer one either
    assert Windows((50,), 3.0).nominate([(-2.0, 1, 0.0, 1.0)] * 20) == []
    assert Windows((8, 50), 3.0).nominate([(-2.0, 1, 0.0, 1.0)] * 20) == [12]


@dataclass
class Ch:
    name: str
    log_bf: float
    compared: int = 1


def test_flat_run_nominates_a_rare_run_of_one_value_at_its_first_row_once():
    tail = 0.5 * math.erfc(3.0 / math.sqrt(2.0))  # the detector's at surprise 3: 1.35e-3
    f = FlatRun()
    # 40 distinct readings (stream index 100-139): no repeat in the 39 pairs of the runs that ended
    assert f.update([[float(v)] for v in range(40)], 100, tail) == []
    # then 39 held on: two rows equal is no run yet; the third, (0.5 / 40) (1.5 / 41) = 4.6e-4, nominates
    assert f.update([[39.0]], 140, tail) == []
    assert f.update([[39.0], [39.0]], 141, tail) == [139]  # the run began at the last distinct reading, 139
    assert f.update([[39.0]] * 5, 143, tail) == []  # once per run
    assert (f.run, f.start, f.fired, f.repeats, f.pairs) == ([9], [139], [True], [0], [39])
    # the run ends: its 8 repeats count, and the next run of L rows needs prod_{i < L-1} (8.5 + i) / (49 + i) <= tail
    assert f.update([[1.0]], 148, tail) == []
    assert (f.repeats, f.pairs) == ([8], [48])
    need, prob = 1, 1.0
    while prob > tail:
        prob *= (8.5 + need - 1) / (49.0 + need - 1)
        need += 1
    assert need == 6  # 5 repeats: 3.5e-4 (4 give 1.5e-3, just above the tail)
    assert f.update([[2.0]] * (need - 1), 149, tail) == []
    assert f.update([[2.0]], 149 + need - 1, tail) == [149]
    # per column, in one chunk: the second column's run nominates its own first row
    g = FlatRun()
    rows = [[float(i), float(i)] for i in range(30)] + [[float(30 + i), 7.0] for i in range(3)]
    assert g.update(rows, 0, tail) == [30]
    # a new regime counts its repeat rate afresh; the run in progress goes on
    g.reset()
    assert (g.repeats, g.pairs, g.run) == ([0, 0], [0, 0], [1, 3])
    # small counts repeat most rows: a run of 0s among them is no surprise, and neither is the
    # first run of 19 with no history (a repeat rate still unknown: probability 0.13)
    h = FlatRun()
    counts = [[0.0]] * 19 + [[1.0]]
    assert h.update(counts * 10, 0, tail) == []
    assert h.update([[0.0]] * 40, 200, tail) == []


def test_flat_run_counts_the_same_in_any_chunks_and_a_zero_tail_never_fires():
    """Row by row (the few-rows path), in chunks of 37 and all at once (whole runs at a time): the same
    counts and the same runs nominated, on few-valued data with stuck stretches. A review found a
    ``surprise`` above about 38.5 made the tail 0 and every chunk raise (log 0); it never fires now.
    ``defer``: a nomination the detector could not use comes again at the run's next row."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 4, (3000, 3)).astype(float)
    x[700:760, 1] = 2.0
    x[2000:2100, :] = 9.0
    tail = 0.5 * math.erfc(3.0 / math.sqrt(2.0))
    runs = []
    for size in (1, 37, 3000):
        f, got = FlatRun(), []
        for lo in range(0, 3000, size):
            got += f.update(x[lo:lo + size], lo, tail)
        runs.append((sorted(set(got)), f))  # (a run of several columns from one row: once per call)
    assert runs[0] == runs[1] == runs[2]
    assert {700, 2000} <= set(runs[0][0]), runs[0][0]
    never = FlatRun()
    assert never.update(x, 0, 0.5 * math.erfc(1e9)) == [] and never.pairs[0] > 0
    f = FlatRun()
    assert f.update([[1.0], [2.0], [3.0], [4.0], [4.0], [4.0]], 0, 0.05) == [3]  # (0.5 / 4) (1.5 / 5) = 0.0375
    f.defer([3])
    assert f.update([[4.0]], 6, 0.05) == [3] and f.update([[4.0]], 7, 0.05) == []


def test_flat_run_survives_the_codec_and_a_state_without_it_reads():
    g = torch.Generator().manual_seed(3)
    st = DetectorState(rng=g.get_state())
    assert "flat" not in json.loads(st.to_bytes())  # nothing counted yet: not written
    st.flat.update([[0.1 * i, 2.5] for i in range(12)], 0, 1e-3)
    back = DetectorState.from_bytes(st.to_bytes())
    assert back.flat == st.flat and back.to_bytes() == st.to_bytes()
    copy = st.copy()
    copy.flat.update([[9.0, 2.5]], 12, 1e-3)
    assert st.flat.run == [12 * 0 + 1, 12] and copy.flat.run == [1, 13]  # the copy's lists are its own
    head = json.loads(st.to_bytes())
    del head["flat"]  # a state saved before the signal: read with the runs counted from its next chunk
    assert DetectorState.from_bytes(json.dumps(head).encode()).flat == FlatRun()


def test_chi2_quantile_is_wilson_hilferty_close_to_the_exact_and_above_it_far_out():
    """Two degrees of freedom have a closed form (an exponential of mean 2: q = -2 log p); one is a
    squared normal. Wilson and Hilferty's cube, measured against both: -1.8 % to +2.5 % at z = 2
    and 3 (3, the defaults of ``surprise`` and ``level_shift``); beyond, above the exact quantile (a
    test that fires less): +6 % and +9 % at z = 4, +16 % and +26 % at z = 6."""
    for z, lo_rel, hi_rel in ((2.0, -0.03, 0.03), (3.0, -0.03, 0.03), (4.0, 0.0, 0.1), (6.0, 0.0, 0.3)):
        p = 0.5 * math.erfc(z / math.sqrt(2.0))  # the upper tail at z
        assert lo_rel <= chi2_quantile(2, z) / (-2.0 * math.log(p)) - 1 <= hi_rel
        # chi2(1): P(Z^2 > q) = 2 P(Z > sqrt q) = p -> sqrt q is the normal quantile at p / 2
        lo, hi = 0.0, 40.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p / 2 else (lo, mid)
        assert lo_rel <= chi2_quantile(1, z) / (lo * lo) - 1 <= hi_rel
    assert chi2_quantile(6, 3.0) == pytest.approx(6 * (1 - 2 / 54 + 3 * math.sqrt(2 / 54)) ** 3, rel=1e-12)


def test_shares_moved_is_a_two_sample_g_test_per_particle():
    """By hand: one particle, shares (0.5, 0.5) of 100 old rows and (0.9, 0.1) of 100 new ones:
    pooled (0.7, 0.3), G = 2 (100 (0.9 log(0.9/0.7) + 0.1 log(0.1/0.3)) + 100 (0.5 log(0.5/0.7) +
    0.5 log(0.5/0.3))). The same shares on both sides give 0; particles are averaged by their weights;
    one component, or no rows on a side, never fires."""
    old, new = torch.tensor([[0.5, 0.5]], dtype=torch.float64), torch.tensor([[0.9, 0.1]], dtype=torch.float64)
    g = 2 * (100 * (0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3))
             + 100 * (0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)))
    one = torch.ones(1, dtype=torch.float64)
    assert shares_moved(new, 100, old, 100, one, 3.0) == (True, pytest.approx(g, rel=1e-12))
    assert g > chi2_quantile(1, 3.0) > 0
    assert shares_moved(old, 100, old, 300, one, 3.0) == (False, 0.0)
    two = torch.tensor([0.25, 0.75], dtype=torch.float64)
    both = shares_moved(torch.cat([new, old]), 100, torch.cat([old, old]), 100, two, 3.0)
    assert both[1] == pytest.approx(0.25 * g, rel=1e-12) and both[0] == (0.25 * g >= chi2_quantile(1, 3.0))
    assert shares_moved(torch.ones(1, 1, dtype=torch.float64), 100, torch.ones(1, 1, dtype=torch.float64), 100, one, 3.0) \
        == (False, 0.0)
    assert shares_moved(new, 0, old, 100, one, 3.0) == (False, 0.0)


def test_shares_dispersion_is_the_runs_g_per_degree_of_freedom_at_least_one():
    """By hand: one particle, two runs of 50 rows with shares (0.9, 0.1) and (0.5, 0.5): pooled
    (0.7, 0.3), G = 2 * 50 * (0.9 log(0.9/0.7) + 0.1 log(0.1/0.3) + 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3)),
    over (2 - 1)(2 - 1) degrees of freedom. Runs alike give 1 (never below); one run, 1; and the
    statistic ``shares_moved`` compares is divided by it."""
    one = torch.ones(1, dtype=torch.float64)
    runs = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]], dtype=torch.float64)
    g = 100 * (0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3) + 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3))
    assert shares_dispersion(runs, 50, one) == pytest.approx(g, rel=1e-12)
    assert shares_dispersion(torch.full((1, 4, 3), 1 / 3, dtype=torch.float64), 50, one) == 1.0
    assert shares_dispersion(runs[:, :1], 50, one) == 1.0
    new, old = runs[:, 0], runs[:, 1]
    plain = shares_moved(new, 100, old, 100, one, 3.0)[1]
    assert shares_moved(new, 100, old, 100, one, 3.0, dispersion=4.0)[1] == pytest.approx(plain / 4, rel=1e-12)
    assert shares_moved(new, 100, old, 100, one, 3.0, dispersion=0.5)[1] == plain  # never below 1


def test_decide_takes_the_most_probable_eligible_challenger():
    odds = -math.log(999.0)  # prior: a change 1 in 1,000
    assert posterior(math.log(999.0), odds) == pytest.approx(0.5, rel=1e-12)
    a, b, c, training = Ch("a", 14.0), Ch("b", 12.5), Ch("c", 20.0), Ch("t", 50.0, compared=0)
    pool = [a, b, c, training]
    # c is the most probable but not eligible; the one still training is never judged
    best, p = decide(pool, lambda ch: odds, 0.99, eligible=lambda ch: ch is not c, data_moved=lambda ch, others: True)
    assert best is a and p == pytest.approx(posterior(14.0, odds), rel=1e-15)
    # a is rejected (the incumbent moved, not the data): dropped, and b is judged next
    best, p = decide(pool, lambda ch: odds, 0.99, eligible=lambda ch: ch is not c, data_moved=lambda ch, others: ch is not a)
    assert best is b and a not in pool and p == pytest.approx(posterior(12.5, odds), rel=1e-15)
    # below the threshold: no change, the best probability is reported
    best, p = decide([Ch("d", 5.0)], lambda ch: odds, 0.99, eligible=lambda ch: True, data_moved=lambda ch, others: True)
    assert best is None and p == pytest.approx(posterior(5.0, odds), rel=1e-15)
    assert decide([], lambda ch: odds, 0.99, eligible=lambda ch: True, data_moved=lambda ch, others: True) == (None, 0.0)


def test_state_codec_reads_its_layout_and_refuses_others_by_name():
    g = torch.Generator().manual_seed(3)
    st = DetectorState(rng=g.get_state(), offset_n=7, chunks=4)
    st.level.update(-1.25, 10, 1.0)
    st.steps.update(6.0, 1.0, first=True)
    st.cusum.update(-2.0, 0)
    back = DetectorState.from_bytes(st.to_bytes())
    assert back.to_bytes() == st.to_bytes()
    assert (back.level, back.steps, back.cusum) == (st.level, st.steps, st.cusum)
    # the layout's fields are where version 1 put them (states saved before the signals were objects)
    head = json.loads(st.to_bytes())
    assert head["magic"] == MAGIC == "cusp-detector-1"
    assert (head["count"], float.fromhex(head["level"]), float.fromhex(head["steps_mean"])) == (1, -1.25, 6.0)
    assert head["cusum"][0] == (-1.5).hex() and head["cusum"][2] == 0
    with pytest.raises(ValueError, match="cusp-detector-9.*known: cusp-detector-1"):
        DetectorState.from_bytes(json.dumps({**head, "magic": "cusp-detector-9"}).encode())
    assert base64.b64decode(head["rng"]) == g.get_state().numpy().tobytes()
    # memory_rows came later: written only when set, read as 0 from states saved before it
    assert "memory_rows" not in head
    st.memory_rows = 1_000
    assert DetectorState.from_bytes(st.to_bytes()).memory_rows == 1_000


def test_a_challengers_best_row_survives_the_codec():
    """``Challenger.top_row`` (its largest one-row advantage, ``Detector._log_odds``' outlier
    alternative in chunks of several rows) is saved with the state, written only when set and read
    as 0 from states saved before it: a restarted worker decides as the one before it."""
    from models import build_model
    from service.detect.state import Challenger
    from service.sgais import build_sampler

    state = build_sampler(build_model("gaussian", 1)).init(0)
    st = DetectorState(rng=torch.Generator().manual_seed(1).get_state(), offset_n=0, chunks=3)
    st.challengers = [Challenger(start=10, chunk=1, seqs=[1, 2], state=state, base_log_evidence=-3.5, first_rows=10,
                                 top_row=12.25),
                      Challenger(start=20, chunk=2, seqs=[2], state=state, base_log_evidence=-7.0, first_rows=10)]
    back = DetectorState.from_bytes(st.to_bytes())
    assert [c.top_row for c in back.challengers] == [12.25, 0.0]
    head = json.loads(st.to_bytes())
    assert [("top" in c) for c in head["challengers"]] == [True, False]


def test_the_most_telling_row_counts_by_how_far_it_stands_out():
    """``detector._top_excess``: for j = 1 .. ``MAX_OUTLIERS``, a chunk's j largest one-row advantages
    less j times its next largest (when positive), ``Detector._log_odds``' alternatives of j outliers.
    One wild row among ordinary ones keeps its advantage at j = 1, two at j = 2; among rows alike (a
    new cluster: each row scored as if it came first) they keep only their lead."""
    from service.detect.detector import _top_excess

    t = torch.tensor
    assert _top_excess(t([0.5, 20.0, 0.25], dtype=torch.float64)) == [19.5, 20.0]
    assert _top_excess(t([1082.0, 3.0, 1000.0], dtype=torch.float64)) == [82.0, 2076.0]
    # a pair of wild rows: alone each keeps only its lead over the other; together, their advantage
    assert _top_excess(t([45.0, 0.3, 44.0, -0.5, 0.1], dtype=torch.float64)) == pytest.approx([1.0, 88.4, 89.0, 89.4])
    assert _top_excess(t([9.0] * 8, dtype=torch.float64)) == [0.0] * 4  # rows alike: nothing at any j
    assert _top_excess(t([20.0, -4.0], dtype=torch.float64)) == [20.0]  # a next row behind counts as 0
    assert _top_excess(t([-1.0, -2.0], dtype=torch.float64)) == [-1.0]
    assert _top_excess(t([5.0], dtype=torch.float64)) == [5.0]
    assert _top_excess(t([math.inf, math.inf], dtype=torch.float64)) == [math.inf]  # not NaN


def test_a_burst_is_wild_rows_close_together_with_the_old_regime_between():
    """``detector._bursts``: whether a chunk's j most telling rows (j as ``_top_excess``) are a burst of
    outliers (``BURST_LOG_PRIOR`` for each after the first): within ``STALE_ROWS`` rows, a row
    between them that the challenger does not predict better, and each ahead of the next row by what
    it costs. A new level's first rows (all ahead, side by side) never are, nor with an ordinary row
    a little ahead among them; two wild rows 20 rows apart are not."""
    from service.detect.detector import _bursts, _followed

    t = torch.tensor
    assert _bursts(t([45.0, -0.3, 44.0, -0.5, 0.1], dtype=torch.float64)) == [False, True, False, False]
    assert _bursts(t([-0.2, 1.0, -0.3, -0.1, 30.0, 31.0, 29.0], dtype=torch.float64)) == [False] * 4
    # ... and whether the old regime goes on after them (a j-row alternative that is no burst)
    assert _followed(t([45.0, -0.3, 44.0, -0.5, 0.1], dtype=torch.float64)) == [True, True, False, False]
    assert _followed(t([-0.2, 0.1, -0.3, 30.0, 31.0, 29.0], dtype=torch.float64)) == [False, False, False, False]
    assert _bursts(t([9.0, 10.0, 11.0, 12.0, 13.0], dtype=torch.float64)) == [False] * 4
    far = torch.full((30,), -0.2, dtype=torch.float64)
    far[0], far[20] = 40.0, 41.0
    assert _bursts(far) == [False, False, False, False]
    assert _bursts(t([5.0], dtype=torch.float64)) == [False]
