"""The job lane: bounded queue, deadlines, per-job timeouts, failures; the lane keeps serving."""

from __future__ import annotations

import threading
import time

from ipc.frames import ErrorReply, SmartTurnResult
from workers.jobs import Job, JobLane

MS = 1_000_000


def result(job: Job) -> SmartTurnResult:
    return SmartTurnResult(call_id=job.call_id, end_pos=1, probability=0.5, queued_us=0, took_us=0)


class Lane:
    def __init__(self, runner, **kw):
        self.woken = threading.Event()
        self.lane = JobLane("t", runner, self.woken.set, **kw)
        self.lane.start()

    def collect(self, n: int, timeout: float = 5.0) -> list:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            while self.lane.results:
                out.append(self.lane.results.popleft())
            out.extend(self.lane.check_timeouts())
            time.sleep(0.002)
        return out


def job(call: str, deadline_ms: float = 1000, timeout_ms: float = 1000) -> Job:
    now = time.monotonic_ns()
    return Job("smart_turn", call, None, now + int(deadline_ms * MS), int(timeout_ms * MS))


def test_jobs_run_and_answer():
    lane = Lane(result)
    assert lane.lane.submit(job("a")) and lane.lane.submit(job("b"))
    done = lane.collect(2)
    assert sorted(d.reply.call_id for d in done) == ["a", "b"]
    assert all(isinstance(d.reply, SmartTurnResult) for d in done)
    assert lane.woken.is_set()
    lane.lane.stop()


def test_a_full_queue_refuses_and_counts():
    gate = threading.Event()

    def slow(j: Job):
        gate.wait(5)
        return result(j)

    lane = Lane(slow, capacity=2)
    accepted = [lane.lane.submit(job(f"c{i}")) for i in range(6)]
    # one may already be running; the queue holds 2 more
    assert accepted.count(True) in (2, 3) and lane.lane.counters["refused"] == accepted.count(False)
    gate.set()
    assert len(lane.collect(accepted.count(True))) == accepted.count(True)
    lane.lane.stop()


def test_a_job_past_its_deadline_is_not_started():
    ran = []
    gate = threading.Event()

    def runner(j: Job):
        ran.append(j.call_id)
        if j.call_id == "blocker":
            gate.wait(5)
        return result(j)

    lane = Lane(runner)
    lane.lane.submit(job("blocker"))
    time.sleep(0.02)
    lane.lane.submit(job("late", deadline_ms=10))
    time.sleep(0.05)
    gate.set()
    done = {d.job.call_id: d.reply for d in lane.collect(2)}
    assert isinstance(done["late"], ErrorReply) and done["late"].kind == "expired"
    assert "late" not in ran
    assert lane.lane.counters["expired"] == 1
    lane.lane.stop()


def test_a_job_over_its_timeout_is_answered_once_and_its_late_result_dropped():
    release = threading.Event()

    def runner(j: Job):
        if j.call_id == "hang":
            release.wait(5)
        return result(j)

    lane = Lane(runner)
    lane.lane.submit(job("hang", timeout_ms=30))
    done = lane.collect(1)
    assert done[0].reply.kind == "timeout" and done[0].job.call_id == "hang"
    release.set()
    lane.lane.submit(job("next"))
    after = lane.collect(1)
    assert [d.job.call_id for d in after] == ["next"]  # the hung job's result never surfaces
    time.sleep(0.02)
    assert lane.lane.counters["late_results"] == 1 and lane.lane.counters["timeouts"] == 1
    lane.lane.stop()


def test_a_failing_job_is_answered_and_the_lane_serves_on():
    def runner(j: Job):
        if j.call_id == "bad":
            raise RuntimeError("model exploded")
        return result(j)

    lane = Lane(runner)
    lane.lane.submit(job("bad"))
    lane.lane.submit(job("good"))
    done = {d.job.call_id: d.reply for d in lane.collect(2)}
    assert done["bad"].kind == "job_failed" and "model exploded" in done["bad"].detail
    assert isinstance(done["good"], SmartTurnResult)
    lane.lane.stop()


def test_queue_wait_and_run_time_are_summed_with_their_maxima():
    """A job behind a running one waits about as long as that one runs (injected clock)."""
    now = [0]
    gate = threading.Event()
    first_started = threading.Event()

    def runner(j: Job):
        if j.call_id == "a":
            first_started.set()
            gate.wait(5)
            now[0] += 30 * MS  # the first job runs 30 ms on the lane's clock
        else:
            now[0] += 10 * MS
        return result(j)

    lane = Lane(runner, threads=1, clock_ns=lambda: now[0])
    assert lane.lane.submit(Job("smart_turn", "a", None, 10**12, 0))
    assert first_started.wait(5)
    assert lane.lane.submit(Job("smart_turn", "b", None, 10**12, 0))  # queued at t=0
    gate.set()
    assert len(lane.collect(2)) == 2
    c = lane.lane.counters
    assert c["done"] == 2
    assert c["wait_us_max"] == 30_000 and c["wait_us_total"] == 30_000  # b waited for a; a did not wait
    assert c["run_us_max"] == 30_000 and c["run_us_total"] == 40_000
    lane.lane.stop()


def test_cpu_time_is_the_job_threads_own_and_recent_gives_wait_and_cpu_percentiles():
    """A job that spins ~20 ms of CPU is counted ~20 ms; one that sleeps 20 ms almost nothing;
    the percentiles of the queue wait come from the jobs that started (injected clock)."""
    now = [0]

    def runner(j: Job):
        if j.call_id.startswith("spin"):
            t_end = time.thread_time_ns() + 20 * MS
            while time.thread_time_ns() < t_end:
                pass
        else:
            time.sleep(0.02)
        now[0] += 10 * MS  # each job takes 10 ms on the lane's clock: the k-th waited (k - 1) * 10 ms
        return result(j)

    lane = Lane(runner, threads=1, clock_ns=lambda: now[0])
    assert lane.lane.recent() == {}  # nothing started yet
    gate, started = threading.Event(), threading.Event()
    orig = lane.lane.runner

    def first(j: Job):  # hold the thread until the other 19 jobs are queued at t = 0
        if j.call_id == "hold":
            started.set()
            gate.wait(5)
            return result(j)
        return orig(j)

    lane.lane.runner = first
    assert lane.lane.submit(Job("smart_turn", "hold", None, 10**12, 0))
    assert started.wait(5)
    for i in range(19):
        assert lane.lane.submit(Job("smart_turn", f"{'spin' if i < 10 else 'sleep'}{i}", None, 10**12, 0))
    gate.set()
    assert len(lane.collect(20)) == 20
    c, r = lane.lane.counters, lane.lane.recent()
    assert 10 * 20_000 * 0.9 <= c["cpu_us_total"] <= 10 * 20_000 + 9 * 5_000  # the spins, hardly the sleeps
    assert r["cpu_p95_us"] >= 18_000 and r["cpu_p50_us"] < 5_000  # 10 of 20 spun: the 10th smallest slept
    # waits: hold 0, then the 19 queued at 0 started at 0, 10, ..., 180 ms: the 10th smallest of the 20 is 80
    assert r["wait_p50_us"] == 80_000 and r["wait_p95_us"] == 180_000
    lane.lane.stop()


def _blocked_lane(ran: list[str]):
    """A one-thread lane whose first job ("blocker") holds the thread until the gate opens."""
    gate = threading.Event()
    started = threading.Event()

    def runner(j: Job):
        ran.append(j.call_id)
        if j.call_id == "blocker":
            started.set()
            gate.wait(5)
        return result(j)

    lane = Lane(runner, threads=1)
    lane.lane.submit(job("blocker"))
    assert started.wait(5)
    return lane, gate


def test_queued_jobs_start_by_order_earliest_turn_end_first_then_fifo():
    ran: list[str] = []
    lane, gate = _blocked_lane(ran)
    now = time.monotonic_ns()
    for name, ended_ms_ago in (("late-end", 10), ("early-end", 300), ("mid-end", 100)):
        j = job(name)
        j.order_ns = now - ended_ms_ago * MS
        assert lane.lane.submit(j)
    assert lane.lane.submit(job("fifo-a")) and lane.lane.submit(job("fifo-b"))  # order = arrival
    assert lane.lane.queued == 5
    gate.set()
    assert len(lane.collect(6)) == 6
    assert ran == ["blocker", "early-end", "mid-end", "late-end", "fifo-a", "fifo-b"]
    lane.lane.stop()


def test_the_queue_stays_bounded_whatever_the_order():
    ran: list[str] = []
    gate = threading.Event()
    lane = Lane(lambda j: (ran.append(j.call_id), gate.wait(5), result(j))[-1], threads=1, capacity=2)
    lane.lane.submit(job("blocker"))
    time.sleep(0.02)
    early = job("early")
    early.order_ns = 1
    assert lane.lane.submit(job("x")) and lane.lane.submit(job("y"))
    assert not lane.lane.submit(early)  # full: refused even though it would go first
    assert lane.lane.counters["refused"] == 1
    gate.set()
    assert len(lane.collect(3)) == 3
    lane.lane.stop()


def test_a_newer_request_for_the_same_key_supersedes_the_queued_one():
    ran: list[str] = []
    lane, gate = _blocked_lane(ran)
    old, other, new = job("a"), job("b"), job("a")
    old.args["n"], new.args["n"] = 1, 2
    for j in (old, other, new):
        j.supersede = ("smart_turn", j.call_id)
        assert lane.lane.submit(j)
    assert lane.lane.queued == 2  # a's older request left the queue
    gate.set()
    done = lane.collect(4)
    assert len(done) == 4
    by_job = {id(d.job): d.reply for d in done}
    assert isinstance(by_job[id(old)], ErrorReply) and by_job[id(old)].kind == "superseded"
    assert isinstance(by_job[id(new)], SmartTurnResult) and isinstance(by_job[id(other)], SmartTurnResult)
    assert ran == ["blocker", "b", "a"]  # the new one took its own place in the order, the old never ran
    assert lane.lane.counters["superseded"] == 1 and lane.lane.counters["done"] == 3
    lane.lane.stop()


def test_a_running_job_is_never_superseded_and_a_full_queue_still_takes_the_newer_request():
    ran: list[str] = []
    gate = threading.Event()
    started = threading.Event()

    def runner(j: Job):
        ran.append(j.call_id)
        if j.call_id == "a" and not started.is_set():
            started.set()
            gate.wait(5)
        return result(j)

    lane = Lane(runner, threads=1, capacity=1)
    first = job("a")
    first.supersede = "a"
    lane.lane.submit(first)
    assert started.wait(5)
    queued, newer = job("a"), job("a")
    queued.supersede = newer.supersede = "a"
    assert lane.lane.submit(queued)
    assert lane.lane.submit(newer)  # the queue is full, but the newer request replaces the queued one
    gate.set()
    done = {id(d.job): d.reply for d in lane.collect(3)}
    assert isinstance(done[id(first)], SmartTurnResult)  # running: untouched
    assert done[id(queued)].kind == "superseded" and isinstance(done[id(newer)], SmartTurnResult)
    assert ran == ["a", "a"] and lane.lane.counters["refused"] == 0
    lane.lane.stop()


def test_a_queued_job_whose_deadline_passes_is_answered_expired_not_run_even_when_ordered_first():
    ran: list[str] = []
    lane, gate = _blocked_lane(ran)
    doomed = job("doomed", deadline_ms=10)
    doomed.order_ns = 1  # it would run first
    lane.lane.submit(doomed)
    lane.lane.submit(job("fine"))
    time.sleep(0.03)
    gate.set()
    done = {d.job.call_id: d.reply for d in lane.collect(3)}
    assert done["doomed"].kind == "expired" and "doomed" not in ran
    assert isinstance(done["fine"], SmartTurnResult) and lane.lane.counters["expired"] == 1
    lane.lane.stop()


def test_withdrawn_queued_jobs_never_run_and_a_running_one_is_left_alone():
    ran: list[str] = []
    lane, gate = _blocked_lane(ran)
    keep, gone_a, gone_b = job("keep"), job("stale"), job("stale")
    for j in (keep, gone_a, gone_b):
        assert lane.lane.submit(j)
    assert lane.lane.withdraw(lambda j: j.call_id == "blocker") == 0  # running: not looked at
    assert lane.lane.withdraw(lambda j: j.call_id == "stale", "the caller resumed") == 2
    assert lane.lane.queued == 1 and lane.lane.counters["cancelled"] == 2
    assert lane.lane.withdraw(lambda j: j.call_id == "stale") == 0  # answered once
    gate.set()
    done = {id(d.job): d.reply for d in lane.collect(4)}
    assert len(done) == 4
    for j in (gone_a, gone_b):
        assert done[id(j)].kind == "cancelled" and "the caller resumed" in done[id(j)].detail
    assert isinstance(done[id(keep)], SmartTurnResult)
    assert ran == ["blocker", "keep"]  # the withdrawn jobs never ran
    assert lane.lane.counters["done"] == 2
    lane.lane.stop()

