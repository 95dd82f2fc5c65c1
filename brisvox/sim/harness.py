"""Run one simulated call on virtual time: the production actor in a SimPlatform.

Owns the seam the scenario suite uses: :class:`SimCall` (what to simulate,
including the chain the actor assembles, :data:`brisvox.agent.pipeline.chain.CHAIN`
unless a test replaces a stage),
:func:`simulate` (run it on the current virtual loop, until the caller hangs up,
goes quiet or the actor ends the call itself) and :class:`SimResult`
(what came out: the context, the wire, every counter, the call record and a
deterministic fingerprint). Also :func:`oracle_mismatches`, the played-text
oracle: for every assistant message whose round has an utterance, the text
in the context must equal the sent text cut after the words whose first
sample reached the wire, within one 20 ms frame either way.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.conversation.playout_book import PlayoutConfig
from brisvox.agent.flows.definition import FlowDef
from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.host.actor import ActorConfig, CallActor
from brisvox.agent.host.amd_screen import AmdConfig
from brisvox.agent.host.s2s_actor import S2sCallActor
from brisvox.agent.pipeline.chain import CHAIN, S2S_CHAIN, StageSpec
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK as _LOOP_CLOCK
from brisvox.providers.s2s.base import S2sProvider
from brisvox.providers.seeded_fakes import FakeLlm, FakeTts, Responder, TtsFault
from brisvox.providers.word_codec import Vocab
from brisvox.sim.fakes import FakeStt, SttFault
from brisvox.sim.world import Caller, SimPlatform, Step, WorldConfig

FRAME = 160  # one 20 ms frame at the sim's 8 kHz call rate


@dataclass(slots=True)
class SimCall:
    steps: list[Step]
    llm: list[Responder]
    seed: int = 7
    stt_faults: list[SttFault] = field(default_factory=list)
    tts_faults: list[TtsFault] = field(default_factory=list)
    registry: Callable[[], ToolRegistry] | None = None
    actor: ActorConfig | None = None
    world: WorldConfig = field(default_factory=WorldConfig)
    max_time: float = 120.0
    quiet: float = 2.5  # end this long after the caller is done and nothing moves
    call_id: str = "sim1"
    llm_default: Responder | None = None
    probe: Callable[[float, CallActor], None] | None = None  # called every probe_every s of sim time
    probe_every: float = 60.0
    greeting: str = ""  # the agent's greeting: the bot speaks first
    chain: Sequence[StageSpec] = CHAIN  # the pipeline assembled (brisvox/agent/pipeline/chain.py)
    s2s: Callable[[Vocab], S2sProvider] | None = None  # a speech-to-speech call (S2S_CHAIN) with this provider
    flow: FlowDef | None = None  # the LLM runner drives this flow (its functions join the registry)
    llm_provider: Any = None  # another LLM than the scripted FakeLlm (e.g. the rule-based ScriptedLlm)
    call_info: CallInfo | None = None  # the call's metadata its tools see (caller, called, parameters)
    media: str = "answered"  # the call's media state at its start (CallStart.media: "early" for early media)
    on_actor: Callable[[CallActor], None] | None = None  # sees the actor before it starts (the host's installs)
    amd: AmdConfig | None = None  # [amd] of the agent: a dialled call (call_info direction outbound) is screened
    setup: Callable[[CallActor], None] | None = None  # called with the built actor before it starts (a warm transfer's attach)


@dataclass(slots=True)
class SimResult:
    actor: CallActor
    platform: SimPlatform
    llm: FakeLlm
    stt: FakeStt
    tts: FakeTts
    record: dict[str, Any]
    ended_at: float
    live_tasks_after: int
    stray_tasks: list[str]

    @property
    def context(self) -> list[dict[str, Any]]:
        return self.actor.context.to_json()

    @property
    def interrupts(self) -> int:
        return self.actor.driver.st.interrupts

    def assistant_texts(self) -> list[str]:
        return [m.text for m in self.actor.context if isinstance(m, AssistantMessage)]

    def fingerprint(self) -> str:
        w = self.platform.wire
        rows: list[Any] = [self.context]
        for u in w.order:
            h = w.utts[u]
            rows.append([u, h.epoch, h.released, [(x, o, round(t, 4)) for x, o, t in h.words]])
        rows.append([(round(t, 4), e) for t, e in w.clears])
        rows.append([(round(t, 4), n) for t, n in w.marks])
        st = self.actor.stats()
        st.pop("tools", None)
        rows.append(st)
        rows.append([round(t, 4) for t in self.llm.probe.request_times])
        blob = orjson.dumps(rows, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        return hashlib.sha256(blob).hexdigest()[:16]


def default_actor_config() -> ActorConfig:
    """Sim defaults: lead margin 0 (the oracle is wire arrival)."""
    return ActorConfig(playout=PlayoutConfig(lead_margin=0.0))


async def simulate(call: SimCall) -> SimResult:
    loop = asyncio.get_running_loop()
    vocab = Vocab()
    caller = Caller(vocab, list(call.steps))
    platform = SimPlatform(vocab, caller, call.world)
    platform.gw.sending = call.media == "answered"
    stt = FakeStt(vocab, seed=call.seed * 3 + 1, faults=call.stt_faults)
    llm = FakeLlm(list(call.llm), seed=call.seed * 3 + 2, default=call.llm_default)
    tts = FakeTts(vocab, seed=call.seed * 3 + 3, faults=call.tts_faults, rate=call.world.tts_rate)
    cfg = call.actor or default_actor_config()
    cls = CallActor
    extra: dict[str, Any] = {}
    registry = call.registry() if call.registry else None
    if call.flow is not None:
        registry = registry if registry is not None else ToolRegistry()
        manager = FlowManager(call.flow)
        for spec, body in manager.function_tools():
            registry.register(spec, body)
        manager.bind(registry.specs())
        extra["flow"] = manager
    if call.s2s is not None:
        cls = S2sCallActor
        extra = {"s2s": call.s2s(vocab), "chain": S2S_CHAIN if call.chain is CHAIN else call.chain}
    actor = cls(
        call.call_id,
        cfg,
        stt=stt,
        llm=call.llm_provider if call.llm_provider is not None else llm,
        tts=tts,
        source=platform.in16,
        sink=platform.tts,
        link=platform,
        call_rate=call.world.call_rate,
        tts_rate=call.world.tts_rate,
        clock=_LOOP_CLOCK,
        registry=registry,
        transport="sim",
        transport_ids={"sim": call.call_id},
        call_info=call.call_info,
        greeting=call.greeting,
        media=call.media,
        amd=call.amd,
        **({"chain": call.chain} | extra),
    )
    if call.setup is not None:
        call.setup(actor)
    before = {t for t in asyncio.all_tasks(loop)}
    if call.on_actor is not None:
        call.on_actor(actor)
    actor.start()
    platform.start(actor)
    t0 = loop.time()
    last_move = t0
    last_sig: tuple[int, ...] = ()
    next_probe = t0 + call.probe_every
    while True:
        await asyncio.sleep(0.1)
        now = loop.time()
        if call.probe is not None and now >= next_probe:
            next_probe += call.probe_every
            call.probe(now - t0, actor)
        if now - t0 > call.max_time:
            break
        if caller.hangup_at is not None or actor.ended:  # the caller left, or the actor ended the call
            break
        sig = (
            platform.wire.frames,
            llm.probe.count,
            len(caller.spoken),
            actor.s2s.st.responses if isinstance(actor, S2sCallActor) else actor.runner.st.turns,
            len(platform.wire.marks),
        )
        if sig != last_sig or caller.speaking:
            last_sig = sig
            last_move = now
        if caller.done and not caller.speaking and now - last_move >= call.quiet:
            break
    record = await actor.hangup("caller_hangup" if caller.hangup_at is not None else "sim_end")
    ended = loop.time()
    await platform.stop()
    live = actor.live_tasks()
    stray = [t.get_name() for t in asyncio.all_tasks(loop) if t not in before and not t.done()]
    return SimResult(actor, platform, llm, stt, tts, record, ended, live, stray)




def oracle_mismatches(res: SimResult, tolerance: int = FRAME) -> list[str]:
    """Compare every assistant message that has an utterance with the wire."""
    book = res.actor.book
    wire = res.platform.wire
    ctx = res.actor.context
    bad: list[str] = []
    for r in book.rounds.values():
        if (r.msg_index is None and not r.removed) or r.utterance is None:
            continue
        u = book.utts.get(r.utterance)
        if u is None:
            continue
        heard = wire.utts.get(u.id)
        sent = u.sent_text
        # the words of the sent text and where each started on the wire
        if heard is None:
            expected_options = {""}
        else:
            rel = heard.released
            offs = [off for _, off, _ in heard.words]
            opts = set()
            for pos in (rel - tolerance, rel, rel + tolerance):
                n = sum(1 for o in offs if o < pos)
                opts.add(" ".join(sent.split()[:n]))
            if heard.released >= book.total_out(u) and not u.lost:
                opts.add(" ".join(sent.split()))
            expected_options = opts
        # find the message of this round in the final context: it may have moved
        # (removed rounds shift indices) so match by the round's recorded index
        idx = r.msg_index
        got = ""
        msg = ctx[idx] if idx is not None and idx < len(ctx) else None
        if isinstance(msg, AssistantMessage):
            got = " ".join(msg.text.split())
        if got not in expected_options and not (got == "" and "" in expected_options):
            bad.append(f"round {r.epoch}.{r.round} utt {u.id}: context {got!r} not in {sorted(expected_options)!r}")
    return bad


__all__ = ["SimCall", "SimResult", "simulate", "oracle_mismatches", "default_actor_config", "replace"]
