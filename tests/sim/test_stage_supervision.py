"""Stage supervision on virtual time: a stage that dies of an unexpected exception ends the call.

Each stage of CHAIN in turn gets a ``RuntimeError`` in its own frame handler
(a subclass put into the chain with ``with_stage``), armed at a time of a
known call (a greeting, the caller's question, a long answer) and fired by
the first frame of a kind that stage handles. Checks, per stage:

* one ERROR line naming the call and the stage, with the traceback, and no
  other ERROR line;
* when the output path works (not the TTS stage, not the tts ring writer):
  the answer playing is cut (a Clear, no stale audio after it) and the
  apology is heard whole on the wire, decoded by the sim wire's word decoder,
  as the last thing the caller hears; otherwise nothing follows the failure;
* Hangup with ``stage_failed:<stage>`` goes to the gateway within the bound
  (the apology's timeout plus the join, or at once without the apology);
* the call record names the stage and the end reason; no task is left.

Mutation check: the same runs with supervision disabled (through the actor
config) must fail these checks. Two calls on one loop: the one whose stage
fails ends, the other is answered exactly as when it runs alone. A caller
who hangs up during the apology ends the call (the record keeps the stage).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

import pytest

from brisvox.agent.host.supervision import SupervisionConfig
from brisvox.agent.pipeline.chain import CHAIN, with_stage
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    AudioOut,
    BotStarted,
    LlmText,
    PipelineFrame,
    TextChunk,
    UserTurnEnded,
)
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, SimResult, default_actor_config, simulate
from brisvox.sim.scenarios import LONG
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import HangUp, Utter
from ipc.frames import Hangup

GREETING = "Hello, you are through to the test line. How can I help you today?"
APOLOGY = "Sorry, something went wrong on our side. Please call again."
# the greeting plays 0.2-4.2 s, the caller asks 4.7-6.7 s, the answer plays 7.8-21.3 s
MID_ANSWER = 9.0
AFTER_QUESTION = 6.0


@dataclass(frozen=True, slots=True)
class Fault:
    arm_at: float  # virtual seconds since the loop started
    kind: type[PipelineFrame]


FAULTS: dict[str, Fault] = {
    "stt": Fault(MID_ANSWER, AudioFrame),
    "turn": Fault(AFTER_QUESTION, BotStarted),  # the answer's first audio was handed over
    "llm": Fault(0.0, UserTurnEnded),
    "segmenter": Fault(AFTER_QUESTION, LlmText),
    "tts": Fault(AFTER_QUESTION, TextChunk),
    "out": Fault(MID_ANSWER, AudioOut),
}
OUTPUT = {"tts", "out"}
BOUND = SupervisionConfig().apology_timeout + 2.0  # the apology, the joins and the stop


class InjectedBug(RuntimeError):
    pass


def failing(name: str):
    """The class of stage ``name`` whose frame handler raises once armed."""
    spec = next(s for s in CHAIN if s.name == name)
    fault = FAULTS[name]

    class Failing(spec.cls):  # type: ignore[misc,valid-type]
        async def process(self, frame: PipelineFrame) -> None:
            if isinstance(frame, fault.kind) and self.clock.now() >= fault.arm_at:
                raise InjectedBug(f"injected into {name}")
            await super().process(frame)

    Failing.__name__ = f"Failing{spec.cls.__name__}"
    return Failing


def scenario(name: str | None, *, supervise: bool = True, call_id: str = "sim1") -> SimCall:
    cfg = default_actor_config()
    if not supervise:
        cfg = replace(cfg, supervision=SupervisionConfig(enabled=False))
    chain = with_stage(CHAIN, name, failing(name)) if name is not None else CHAIN
    return SimCall(steps=[Utter("tell me about the weather please", after_bot_done=0.5)],
                   llm=[LlmScript((Say(LONG),))], greeting=GREETING, actor=cfg, chain=chain,
                   call_id=call_id, max_time=40.0)


def run(call: SimCall) -> SimResult:
    return run_virtual(lambda: simulate(call))


def check(res: SimResult, name: str, errors: list[logging.LogRecord]) -> None:
    """Everything a supervised stage failure must leave behind (asserts)."""
    reason = f"stage_failed:{name}"
    # one ERROR line, naming the call and the stage, with the traceback
    assert len(errors) == 1, [r.getMessage() for r in errors]
    msg = errors[0].getMessage()
    assert res.actor.call_id in msg and f"stage {name} failed" in msg and "InjectedBug" in msg, msg
    assert errors[0].exc_info is not None
    failure = res.actor.failure
    assert failure is not None and failure.stage == name
    # the hang-up, with the reason, within the bound
    hangups = [f for f in res.platform.sent if isinstance(f, Hangup)]
    assert [h.reason for h in hangups] == [reason]
    assert res.actor.ended_at is not None
    took = res.actor.ended_at - failure.at
    assert 0 <= took <= (BOUND if name not in OUTPUT else 1.0), took
    # the record names the stage
    assert res.record["failed_stage"] == name and res.record["end_reason"] == reason
    assert res.record["failure"]["error"] == "InjectedBug"
    # what the caller heard
    wire = res.platform.wire
    heard = [wire.heard_words(u) for u in wire.order]
    assert wire.frames_after_clear == [] and res.platform.stale_tts_after_clear == 0
    if name in OUTPUT:
        assert failure.apology == "skipped"
        assert APOLOGY.split() not in heard
        assert not wire.utts or max(t for h in wire.utts.values() for _, _, t in h.words) <= failure.at + 0.1
    else:
        assert failure.apology == "played"
        assert heard[-1] == APOLOGY.split(), heard  # whole, and the last thing heard
        assert heard.count(APOLOGY.split()) == 1
        answer = [h for h in heard[:-1] if h and h[0] == LONG.split()[0]]
        assert all(len(h) < len(LONG.split()) for h in answer), "the answer was not cut"
        apology_start = wire.utts[wire.order[-1]].first_t
        assert apology_start is not None and apology_start >= failure.at
    # nothing left running
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    assert res.actor.ended


def errors_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("name", [s.name for s in CHAIN])
def test_a_failed_stage_ends_the_call_with_an_apology_when_the_output_path_works(name, caplog):
    caplog.set_level(logging.WARNING)
    res = run(scenario(name))
    check(res, name, errors_of(caplog))


@pytest.mark.parametrize("name", [s.name for s in CHAIN])
def test_mutation_check_without_supervision_the_checks_fail(name, caplog):
    caplog.set_level(logging.WARNING)
    res = run(scenario(name, supervise=False))
    with pytest.raises(AssertionError):
        check(res, name, errors_of(caplog))
    assert res.actor.failure is None  # nothing supervised: the silent call the checks catch


def test_the_failure_of_one_call_leaves_the_other_call_of_the_loop_talking(caplog):
    caplog.set_level(logging.WARNING)
    alone = run(scenario(None, call_id="simB"))

    async def both():
        a, b = await asyncio.gather(simulate(scenario("llm", call_id="simA")), simulate(scenario(None, call_id="simB")))
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        return a, b, left

    a, b, left = run_virtual(both)
    assert left == []
    assert a.record["failed_stage"] == "llm" and a.record["end_reason"] == "stage_failed:llm"
    assert a.live_tasks_after == 0 and b.live_tasks_after == 0
    # the other call: answered whole, ended by the sim, as when it runs alone
    assert b.actor.failure is None and b.record["failed_stage"] == "" and b.record["end_reason"] == "sim_end"
    assert not [f for f in b.platform.sent if isinstance(f, Hangup)]
    wb = b.platform.wire
    assert [wb.heard_words(u) for u in wb.order] == [GREETING.split(), LONG.split()]
    assert b.fingerprint() == alone.fingerprint()
    errors = errors_of(caplog)
    assert len(errors) == 1 and "simA" in errors[0].getMessage()


def test_the_caller_leaving_during_the_apology_is_the_end_of_the_call(caplog):
    caplog.set_level(logging.WARNING)
    call = scenario("llm")
    call.steps.append(HangUp(at=8.5))  # the llm fails at 7.1 s; the apology would end at 10.8 s
    res = run(call)
    assert res.record["end_reason"] == "caller_hangup" and res.record["failed_stage"] == "llm"
    assert res.record["failure"]["apology"] == "cut"
    assert not [f for f in res.platform.sent if isinstance(f, Hangup)]  # the caller's end, not ours
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    assert len(errors_of(caplog)) == 1
