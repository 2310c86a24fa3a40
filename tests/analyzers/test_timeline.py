import numpy as np
import pytest

from pardiag.analyzers.timeline import Windowed, attribute, clip, coverage, forward_fill


def iv(*pairs: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float)


def test_priority_and_gaps_by_hand() -> None:
    # window 0-100; A covers 10-40, B covers 30-60 and 90-120 (clipped to 100)
    a = iv((10, 40))
    b = iv((30, 60), (90, 120))
    times, gap = attribute((0, 100), [a, b])
    assert times == [30.0, 30.0]  # A wins 30-40: A 10-40, B 40-60 and 90-100
    assert gap == 40.0  # 0-10, 60-90
    times, gap = attribute((0, 100), [b, a])
    assert times == [40.0, 20.0] and gap == 40.0  # B 30-60 and 90-100, A 10-30


def test_fill_gaps_inherits_previous_label() -> None:
    a = iv((10, 20))
    b = iv((50, 60))
    times, gap = attribute((0, 100), [a, b], fill_gaps=True)
    # 0-10 leading gap stays; 20-50 goes to A; 60-100 goes to B
    assert times == [40.0, 50.0] and gap == 10.0


def test_coverage_matrix() -> None:
    length, cov = coverage((0, 10), [iv((0, 5)), iv((3, 10))])
    assert length.tolist() == [3.0, 2.0, 5.0]
    assert cov.tolist() == [[True, True, False], [False, True, True]]
    empty_len, empty_cov = coverage((5, 5), [iv((0, 1))])
    assert empty_len.size == 0 and empty_cov.shape == (1, 0)


def test_forward_fill() -> None:
    assert forward_fill(np.array([-1, 2, -1, -1, 0, -1])).tolist() == [-1, 2, 2, 2, 0, 0]


def test_sums_to_window_on_random_input() -> None:
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(4):
        s = rng.uniform(-10, 110, 50)
        layers.append((s, s + rng.uniform(0, 8, 50)))
    for fill in (False, True):
        times, gap = attribute((0, 100), layers, fill_gaps=fill)
        assert sum(times) + gap == pytest.approx(100.0)


def test_windowed_takes_every_interval_that_overlaps_and_clips_the_same() -> None:
    # a long interval that starts well before the window, one inside, one touching its
    # start, one after it, one with no start (NaN, as an odd value reads)
    starts = np.array([500.0, 0.0, 120.0, 80.0, np.nan, 150.0])
    ends = np.array([600.0, 130.0, 140.0, 100.0, np.nan, 160.0])
    w = Windowed((starts, ends))
    got = w.within(100.0, 150.0)
    # start before 150 and from the first whose running end passes 100: the long one
    # (0-130) holds the running end up, so 80-100 comes along; clip drops it
    assert sorted(zip(got[0].tolist(), got[1].tolist())) == [(0.0, 130.0), (80.0, 100.0), (120.0, 140.0)]
    assert [a.tolist() for a in clip(got, 100.0, 150.0)] == [a.tolist() for a in clip((starts, ends), 100.0, 150.0)]
    assert [a.size for a in w.within(700.0, 800.0)] == [0, 0]
    assert [a.size for a in Windowed((np.empty(0), np.empty(0))).within(0.0, 1.0)] == [0, 0]


def test_windowed_step_by_step_equals_the_whole_arrays() -> None:
    rng = np.random.default_rng(7)
    starts = np.sort(rng.uniform(0, 10_000, 2000))
    ends = starts + rng.exponential(40, 2000)
    w = Windowed((starts, ends))
    for lo in range(0, 10_000, 250):
        whole = coverage((lo, lo + 250.0), [(starts, ends)])
        part = coverage((lo, lo + 250.0), [w.within(lo, lo + 250.0)])
        assert np.array_equal(whole[0], part[0]) and np.array_equal(whole[1], part[1])
