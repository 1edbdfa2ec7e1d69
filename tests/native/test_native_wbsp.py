"""WBSP download gate: a worker downloads only after the slowest worker has uploaded since its last download."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_elastic import _native as N


def test_gate_opens_only_with_the_slowest_workers_upload():
    assert N.wbsp_may_download([False, True, True], 0) is False
    assert N.wbsp_may_download([True, False, False], 0) is True


def test_unknown_slowest_waits_for_every_worker():
    assert N.wbsp_may_download([True, True, False], -1) is False
    assert N.wbsp_may_download([True, True, True], -1) is True


events = st.lists(
    st.tuples(st.sampled_from(["up", "down"]), st.integers(0, 4), st.integers(-1, 4)), min_size=1, max_size=200
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), events)
def test_wbsp_state_matches_a_set_based_model(n, evs):
    state = N.WbspState(n)
    pending = [set() for _ in range(n)]  # uploaders since each worker's last download
    for kind, w, slowest in evs:
        w %= n
        slowest = -1 if slowest < 0 else slowest % n
        if kind == "up":
            state.on_upload(w)
            for p in range(n):
                pending[p].add(w)
        else:
            expected = slowest in pending[w] if slowest >= 0 else len(pending[w]) == n
            assert state.may_download(w, slowest) == expected
            assert state.uploaded_since_last_download(w) == [q in pending[w] for q in range(n)]
            assert N.wbsp_may_download(state.uploaded_since_last_download(w), slowest) == expected
            if expected:  # a worker downloads only when the gate is open
                state.on_download(w)
                pending[w].clear()
    assert sum(state.uploads(q) for q in range(n)) == sum(1 for k, _, _ in evs if k == "up")


def test_downloads_see_the_slowest_workers_upload_in_every_round():
    # Worker 1 is slowest (longest measured interval); worker 0 trains 3 local steps per slow step.
    clocks, state = N.WorkerClocks(2), N.WbspState(2)
    t0 = t1 = 0
    clocks.record_push(0, 0)  # training starts: first timestamps, no upload yet
    clocks.record_push(1, 0)
    opened = []
    for _ in range(30):
        t0 += 10
        clocks.record_push(0, t0)
        state.on_upload(0)
        if t0 % 30 == 0:
            t1 += 30
            clocks.record_push(1, t1)
            state.on_upload(1)
        # Until every worker's iteration time is measured, any of them may be the slowest: -1 waits for all.
        slowest = clocks.slowest_by_interval() if min(clocks.last_intervals) >= 0 else -1
        if state.may_download(0, slowest):
            assert state.uploaded_since_last_download(0)[1]
            state.on_download(0)
            opened.append(t0)
    assert clocks.slowest_by_interval() == 1
    assert opened == list(range(30, 301, 30))
    assert state.downloads(0) == 10


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: N.wbsp_may_download([], 0), "must not be empty"),
        (lambda: N.wbsp_may_download([True], 1), "out of range"),
        (lambda: N.wbsp_may_download([True], -2), "out of range"),
        (lambda: N.WbspState(0), "n must be"),
        (lambda: N.WbspState(2).on_upload(2), "out of range"),
        (lambda: N.WbspState(2).on_download(-1), "out of range"),
        (lambda: N.WbspState(2).may_download(0, 2), "out of range"),
        (lambda: N.WbspState(2).uploads(5), "out of range"),
    ],
)
def test_bad_wbsp_inputs_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
