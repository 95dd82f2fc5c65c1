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



# -- batching: queued jobs of a batched kind run as one call -----------------------------------------


class Batcher:
    """Records each batch (the call ids, in the order given) and answers each job with its own id."""

    def __init__(self, clock: list[int] | None = None, row_ms: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.clock, self.row_ms = clock, row_ms

    def __call__(self, jobs: list[Job]) -> list:
        self.batches.append([j.call_id for j in jobs])
        if self.clock is not None:
            self.clock[0] += self.row_ms * MS * len(jobs)
        return [SmartTurnResult(call_id=j.call_id, end_pos=len(jobs), probability=0.5, queued_us=0, took_us=0)
                for j in jobs]


def _blocked_batch_lane(ran: list[str], batcher: Batcher, max_batch: int, **kw):
    """A one-thread batching lane whose first job ("blocker", run alone: nothing else was
    queued when it started) holds the thread until the gate opens."""
    gate, started = threading.Event(), threading.Event()

    def runner(j: Job):
        ran.append(j.call_id)
        if j.call_id == "blocker":
            started.set()
            gate.wait(5)
        return result(j)

    lane = Lane(runner, threads=1, batchers={"smart_turn": batcher}, max_batch=max_batch, **kw)
    lane.lane.submit(job("blocker"))
    assert started.wait(5)
    return lane, gate


def test_queued_jobs_of_a_batched_kind_run_in_batches_in_order_each_answered_with_its_own_reply():
    ran: list[str] = []
    b = Batcher()
    lane, gate = _blocked_batch_lane(ran, b, max_batch=3)
    now = time.monotonic_ns()
    jobs = {}
    for name, deadline_ms in (("d5", 500), ("d1", 100), ("d4", 400), ("d2", 200), ("d3", 300)):
        j = jobs[name] = job(name)
        j.deadline_ns = j.order_ns = now + deadline_ms * MS
        assert lane.lane.submit(j)
    gate.set()
    done = lane.collect(6)
    assert len(done) == 6
    assert b.batches == [["d1", "d2", "d3"], ["d4", "d5"]]  # the deadline order, cut at max_batch
    assert ran == ["blocker"]
    by_job = {id(d.job): d.reply for d in done}
    for name, j in jobs.items():
        assert by_job[id(j)].call_id == name  # each job got its own reply, not a neighbour's
    c = lane.lane.counters
    assert c["done"] == 6 and c["batches"] == 2 and c["batched_jobs"] == 5 and c["batch_max"] == 3
    assert lane.lane.batch_sizes() == {"1": 1, "2": 1, "3": 1}
    assert len(lane.lane.recent()) == 4 and lane.lane.queued == 0 and lane.lane.running == 0
    lane.lane.stop()


def test_a_lone_job_runs_at_once_through_the_runner_and_max_batch_1_never_batches():
    """Nothing waits for a batch to fill: a job alone in the queue starts at once, by itself."""
    b = Batcher()
    lane = Lane(result, threads=1, batchers={"smart_turn": b}, max_batch=8)
    t0 = time.monotonic()
    assert lane.lane.submit(job("alone"))
    assert len(lane.collect(1)) == 1 and time.monotonic() - t0 < 1.0
    assert b.batches == [] and lane.lane.batch_sizes() == {"1": 1} and lane.lane.counters["batches"] == 0
    lane.lane.stop()

    ran: list[str] = []
    lane, gate = _blocked_batch_lane(ran, b, max_batch=1)
    for i in range(3):
        assert lane.lane.submit(job(f"j{i}"))
    gate.set()
    assert len(lane.collect(4)) == 4
    assert b.batches == [] and ran == ["blocker", "j0", "j1", "j2"]  # today's behaviour: one by one
    assert lane.lane.counters["batches"] == 0 and lane.lane.batch_sizes() == {}
    lane.lane.stop()


def test_a_batch_takes_only_the_head_of_the_order_and_stops_at_another_kind():
    ran: list[str] = []
    b = Batcher()
    lane, gate = _blocked_batch_lane(ran, b, max_batch=8)
    for name, kind in (("s1", "smart_turn"), ("s2", "smart_turn"), ("x", "other"), ("s3", "smart_turn")):
        j = job(name)
        j.kind = kind
        assert lane.lane.submit(j)
    gate.set()
    assert len(lane.collect(5)) == 5
    assert b.batches == [["s1", "s2"]]  # s3 is not pulled ahead of x
    assert ran == ["blocker", "x", "s3"]
    lane.lane.stop()


def test_expired_jobs_stay_out_of_a_batch_and_a_batch_never_outgrows_its_earliest_deadline():
    """On the lane's clock every job costs 50 ms: the head (120 ms left when the thread frees)
    can share its run with one more job (100 ms) but not two (150 ms); an expired job met
    while filling is answered ``expired`` and not run."""
    now = [0]
    ran: list[str] = []
    b = Batcher(clock=now, row_ms=50)
    lane, gate = _blocked_batch_lane(ran, b, max_batch=8, clock_ns=lambda: now[0])
    # a first batch teaches the lane the cost per job (50 ms)
    for name in ("warm1", "warm2"):
        assert lane.lane.submit(Job("smart_turn", name, None, 10**12, 0, order_ns=1))
    gate.set()
    assert len(lane.collect(3)) == 3 and b.batches == [["warm1", "warm2"]]
    gate.clear()
    blocked = threading.Event()
    orig = lane.lane.runner

    def hold(j: Job):
        if j.call_id == "hold":
            blocked.set()
            gate.wait(5)
            now[0] += 50 * MS  # it costs 50 ms too: the head's 170 ms leave it 120 ms when it starts
            return result(j)
        return orig(j)

    lane.lane.runner = hold
    assert lane.lane.submit(Job("smart_turn", "hold", None, 10**12, 0))
    assert blocked.wait(5)
    t = now[0]
    for name, deadline_ms, order in (("gone", -1, 1), ("head", 170, 2), ("next", 10_000, 3), ("third", 10_000, 4),
                                     ("fourth", 10_000, 5)):
        assert lane.lane.submit(Job("smart_turn", name, None, t + deadline_ms * MS, 0, received_ns=t, order_ns=order))
    gate.set()
    done = {d.job.call_id: d.reply for d in lane.collect(9)}
    assert done["gone"].kind == "expired" and lane.lane.counters["expired"] == 1
    assert b.batches[1:] == [["head", "next"], ["third", "fourth"]]
    assert all(isinstance(done[n], SmartTurnResult) for n in ("head", "next", "third", "fourth"))
    lane.lane.stop()


def test_a_failing_batch_answers_each_of_its_jobs_job_failed_and_the_lane_serves_on():
    ran: list[str] = []

    def broken(jobs: list[Job]) -> list:
        raise RuntimeError("batch exploded")

    lane, gate = _blocked_batch_lane(ran, broken, max_batch=4)  # type: ignore[arg-type]
    for name in ("a", "b"):
        assert lane.lane.submit(job(name))
    gate.set()
    done = {d.job.call_id: d.reply for d in lane.collect(3)}
    assert done["a"].kind == done["b"].kind == "job_failed" and "batch exploded" in done["a"].detail
    assert lane.lane.submit(job("after"))
    assert [d.job.call_id for d in lane.collect(1)] == ["after"]
    assert lane.lane.counters["failed"] == 2 and lane.lane.counters["done"] == 2
    lane.lane.stop()


def test_a_batch_over_its_timeout_answers_each_job_once_and_drops_the_late_results():
    """Every job of a running batch is answered ``timeout`` and can be flagged cancelled; a
    running batch is never withdrawn; the late replies never surface."""
    ran: list[str] = []
    release = threading.Event()

    def slow(jobs: list[Job]) -> list:
        release.wait(5)
        return Batcher()(jobs)

    lane, gate = _blocked_batch_lane(ran, slow, max_batch=4)  # type: ignore[arg-type]
    for name in ("a", "b"):
        assert lane.lane.submit(job(name, timeout_ms=30))
    gate.set()
    first = lane.collect(1)
    assert [d.job.call_id for d in first] == ["blocker"]
    deadline = time.monotonic() + 2
    while lane.lane.running < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert lane.lane.running == 2  # both jobs of the batch run
    assert lane.lane.withdraw(lambda j: True) == 0 and lane.lane.cancel(lambda j: True) == 2
    done = lane.collect(2)
    assert sorted((d.job.call_id, d.reply.kind) for d in done) == [("a", "timeout"), ("b", "timeout")]
    release.set()
    assert lane.lane.submit(job("next"))
    assert [d.job.call_id for d in lane.collect(1)] == ["next"]
    time.sleep(0.02)
    assert lane.lane.counters["late_results"] == 2 and lane.lane.counters["timeouts"] == 2
    lane.lane.stop()
