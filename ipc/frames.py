"""Every control frame of brisvox, in one place: read this to see the whole protocol.

Frames are frozen slotted dataclasses registered with a type tag
(:func:`ipc.codec.frame`) and travel as orjson objects over ZeroMQ
(``ipc/bus.py``). Audio never travels in a frame: it lives in rings
(``ipc/ring.py``) and frames carry ring *positions* (absolute sample counts).

Conventions:

* Times that cross processes are ``time.monotonic_ns()`` values (``*_ns``):
  CLOCK_MONOTONIC is one clock for every process on the host.
* ``call_id`` is the gateway's id for a call (``[A-Za-z0-9_-]``, used in ring
  names). Rings are named by ``ipc.ring.ring_name(instance, call_id, kind, ring_key)``;
  the gateway's random ``ring_key`` reaches the agent in CallStart and the worker in
  AttachCall, and nothing else can compute the names.
* Requests that expect a reply carry a correlation id in the envelope
  (``encode(frame, cid=...)``), not in the frame.

Sections, in the order data flows: supervisor <-> child, command plane,
gateway <-> agent, worker lanes. Add a frame to its section, naming its receiver
(``to``).
"""

from __future__ import annotations

from typing import Any

from ipc.codec import DecodeGuard, Frame, FrameError, decode, decode_env, encode, frame, frame_types

__all__ = ["DecodeGuard", "Frame", "FrameError", "decode", "decode_env", "encode", "frame", "frame_types"]

ROLES = ("gateway", "worker", "agent")

# Who receives a frame (``@frame(tag, to=...)``): the dispatch table that handles it
# (``ipc.codec.received_by(receiver)``; a test checks each table against it). supervisor: its
# child channel; control: its command plane; child: every child's control thread; gateway;
# agent: the agent process's inbox; worker: a worker's inbox; subscriber: the worker client
# (ipc/worker_client.py); reply: only ever an answer, matched to its request by correlation id.
RECEIVERS = ("supervisor", "control", "child", "gateway", "agent", "worker", "subscriber", "reply")


# --- supervisor <-> child (the child's DEALER, the supervisor's ROUTER) ------------


@frame("hello", to="supervisor")
class Hello(Frame):
    """Child -> supervisor, first frame: the init handshake. ``ok`` False = boot failed."""

    role: str
    index: int
    pid: int
    ok: bool = True
    error: str = ""
    endpoints: dict[str, str] | None = None  # what the child serves (role-specific)
    measured: dict[str, float] | None = None  # figures the child measured at boot (role-specific), in its Topology row


@frame("ping", to="child")
class Ping(Frame):
    """Supervisor -> child health probe."""

    seq: int
    sent_ns: int


@frame("pong", to="supervisor")
class Pong(Frame):
    """Child -> supervisor answer to :class:`Ping`, with a small load report.

    ``beat_ms`` is the age of the main loop's last ``rt.heartbeat()`` (-1 before
    the first one): the control thread answers pings, so a wedged main loop
    still pongs but with a growing ``beat_ms``.
    """

    seq: int
    sent_ns: int
    calls: int = 0
    stats: dict[str, Any] | None = None
    beat_ms: int = -1


@frame("topology", to="child")
class Topology(Frame):
    """Supervisor -> every child, pushed whenever a child changes state.

    ``children`` rows: ``{"role", "index", "pid", "state"}`` with state one of
    starting, ready, stopping, exited, failed, plus ``"measured"`` when the child's
    Hello carried figures it measured at boot (role-specific numbers). Children use it to stop sending
    to a dead peer at once (a worker's calls are re-attached by their
    subscriber, see AttachCall) instead of waiting for a timeout.
    """

    children: list[dict[str, Any]]
    seq: int


@frame("reload", to="child")
class Reload(Frame):
    """Supervisor -> every ready child, after ``brisvoxd reload`` applied a configuration:
    re-read ``path`` and apply what the role applies live (the gateway: its
    ``[[sip.trunks]]``, each registered again). A role without a reload callback ignores it;
    the rest of a role section applies at the child's next start. ``seq`` grows per reload."""

    path: str
    seq: int


@frame("shutdown", to="child")
class Shutdown(Frame):
    """Supervisor -> child: stop within ``grace_s`` (after which SIGTERM, then SIGKILL)."""

    reason: str
    grace_s: float
    drain: bool = False  # finish live calls first (up to grace_s)


@frame("shutdown_ack", to="supervisor")
class ShutdownAck(Frame):
    """Child -> supervisor: shutdown request received; exit follows."""

    pid: int


@frame("child_event", to="supervisor")
class ChildEvent(Frame):
    """Child -> supervisor, unsolicited: something operators should see (counted, logged)."""

    kind: str
    detail: str = ""
    data: dict[str, Any] | None = None


# --- command plane (brisvoxd CLI <-> supervisor, REQ-style over DEALER/ROUTER) -------


@frame("command", to=("control", "gateway"))
class Command(Frame):
    """CLI -> supervisor. ``name`` is one of status, stop, drain, reload (the gateway's inbox
    answers its own: stats, calls, and dial, an outbound call: over SIP answered once it is
    answered or failed, with ``via = "twilio"`` once Twilio queued it; an agent process sends
    it too, for an agent service's dial)."""

    name: str
    args: dict[str, Any] | None = None


@frame("command_reply", to="reply")
class CommandReply(Frame):
    """Supervisor -> CLI."""

    ok: bool
    data: dict[str, Any] | None = None
    error: str = ""


# --- gateway <-> agent process ------------------------------------------------------

# Every child binds one ROUTER "inbox" at ``endpoint(runtime_dir, f"{role}-{index}")``
# (the supervisor: "supervisor"; its command plane: "control"). Peers connect a
# DEALER whose identity is ``f"{role}-{index}".encode()``; replies and pushes go
# back through the receiver's ROUTER to that identity.
#
# Call lifecycle: the gateway admits a call, creates its four rings
# (in, in16, tts, out; see ipc.ring.ring_name), picks an agent process and a
# preferred worker, and sends CallStart to the agent. The agent's call actor
# attaches the call to a worker (AttachCall, subscriber = the agent) and owns
# that attachment for the call's life, re-attaching on a worker death. At
# hangup the gateway sends CallEnd; the agent detaches and answers CallEnded;
# the gateway unlinks the rings after both sides detached (or a timeout).


@frame("call_start", to="agent")
class CallStart(Frame):
    """Gateway -> agent: a new call. Reply: CallAccepted or ErrorReply."""

    call_id: str
    agent: str  # agent definition name (configs/agents/<agent>.toml)
    transport: str  # "sip" | "twilio" | "native"
    call_rate: int  # rate of the in/out rings (8000 for G.711)
    tts_rate: int  # rate of the tts ring
    worker: int  # preferred inference worker index
    instance: str  # ring instance tag
    started_ns: int
    transport_ids: dict[str, str] | None = None  # callSid/streamSid, SIP Call-ID
    params: dict[str, Any] | None = None  # custom parameters from the transport
    caller: str = ""  # the caller's number: SIP From user, a From/caller parameter ("" unknown)
    called: str = ""  # the number called: SIP To user, a To/called parameter ("" unknown)
    events: bool = False  # the caller's side wants the call's events (CallEvent): a native ``events`` start
    ring_key: str = ""  # the call's random ring key (ipc.ring.ring_name): its ring names are unguessable
    media: str = "answered"  # the call's media state as the agent side starts (CallMedia's states)
    consult_for: str = ""  # a warm transfer's consult leg: the call_id of the caller it consults for
    consult_summary: str = ""  # that leg's summary for the person (bounded, no CR/LF; set by the gateway's dial)


@frame("call_accepted", to="reply")
class CallAccepted(Frame):
    call_id: str
    worker: int = -1  # the worker the agent attached the call to (-1: not said)
    recording: dict[str, Any] | None = None  # record the call: {"dir": absolute path, "keep_days": n}


@frame("call_end", to="agent")
class CallEnd(Frame):
    """Gateway -> agent: the caller hung up / the transport closed."""

    call_id: str
    reason: str
    ended_ns: int


@frame("call_ended", to="gateway")
class CallEnded(Frame):
    """Agent -> gateway: the actor finished (after CallEnd, or on its own: end_call)."""

    call_id: str
    reason: str


MEDIA_EARLY, MEDIA_ANSWERED, MEDIA_HELD = "early", "answered", "held"
MEDIA_STATES = (MEDIA_EARLY, MEDIA_ANSWERED, MEDIA_HELD)


@frame("call_media", to="agent")
class CallMedia(Frame):
    """Gateway -> agent: the call's media state is now ``state`` (one of :data:`MEDIA_STATES`).

    * ``"early"``: a dialled call before its answer whose far end sends early media (a
      18x with SDP: ringback, an announcement). Its audio reaches the agent's VAD; the
      gateway sends nothing towards the far end.
    * ``"answered"``: the conversation. The callee answered (the 200), or the caller took
      the call off hold (a resume is this state again, not a state of its own).
    * ``"held"``: the caller put the call on hold (a re-INVITE with ``a=sendonly``,
      ``a=inactive`` or ``c=0.0.0.0``). The gateway sends no audio; what arrives (music on
      hold) is not speech to answer.

    In every state but ``"answered"`` the bot is silent: the caller's audio starts no turn
    (no reply, no greeting), and a reply in flight when the call leaves ``"answered"`` is
    CUT where the caller stopped hearing it, as at a barge-in (the context keeps exactly
    what was heard; a SideEffect tool call in flight completes and its result reaches the
    model as a note). It is cut rather than held because a hold lasts from seconds to
    ``[sip] hold_timeout_s``: the rest of a sentence played after the music stops is not
    what a person does, and a reply held that long would outgrow the out ring. Back to
    ``"answered"`` the agent says nothing new: a greeting that early media deferred is
    spoken then; otherwise the conversation resumes when the caller speaks.

    A call whose agent side starts in a state other than ``"answered"`` says so in
    ``CallStart.media``; every later change is one CallMedia, in order, after the
    CallAccepted (a change during the start follows it). ``dial``: a dialled call's
    signalling times in ms from its first INVITE (``ringing_at_ms``, the first 18x;
    ``progress_at_ms``, the first 18x with SDP; ``answered_at_ms``, the 200), a time not
    reached absent. Not answered.
    """

    call_id: str
    state: str
    at_ns: int
    dial: dict[str, int] | None = None


@frame("clear", to="gateway")
class Clear(Frame):
    """Agent -> gateway, fast path of a barge-in: stop playing ``call_id`` now.

    The gateway stops releasing at once (cutting the out ring at its
    release position; the audio after it may already be the newer epoch's,
    written by the worker before this frame was read), sends Twilio
    ``clear`` (or stops RTP audio), and refuses out-ring audio of epochs
    <= ``epoch`` (see OutUtterance): after Clear(E) nothing is released
    before the start of an utterance of an epoch > E, so ``epoch`` is the
    newest epoch that must fall silent. A Clear with an epoch not above the
    last one is idempotent (no cut; Cleared is sent again). Answered by
    Cleared with the final release position.

    ``lazy``: sent by TtsRingWriter before a new response's first audio (not a
    barge-in). The worker's OutUtterance of that response travels on another
    link, so its first frame may already be out when this Clear is read; a
    lazy Clear read after a talkspurt started from a dry ring after
    ``sent_ns`` stops nothing (that audio is the new response's).
    """

    call_id: str
    epoch: int
    sent_ns: int
    lazy: bool = False


@frame("cleared", to="agent")
class Cleared(Frame):
    """Gateway -> agent: the Clear was applied; ``position`` is the last out
    position released to the caller (the played-text truncation point).

    ``marks``: names of the marks the cut discarded (never played; for
    Twilio also the marks sent but not yet echoed, whose late echoes the
    gateway swallows). Each settles its utterance in the playout book, which
    never counts it as played.
    """

    call_id: str
    epoch: int
    position: int
    applied_ns: int
    marks: list[str] | None = None


@frame("pause", to="gateway")
class Pause(Frame):
    """Agent -> gateway: hold the bot's audio of ``epoch`` (a barge-in candidate opened).

    Unlike Clear, ``epoch`` names the LIVE epoch being held (the response
    playing or about to play), not the newest dead one. The gateway stops
    releasing at once and keeps its release position: the unreleased audio
    stays in the out ring (nothing is cut, skipped or counted as an
    underrun; Twilio gets no media, RTP ends the talkspurt). It ends with
    Resume (the candidate was vetoed: release goes on from the held
    position, nothing lost or repeated), a Clear (the barge-in was confirmed:
    answered by Cleared with the held position, exactly what was played), an
    utterance of a newer epoch, or the gateway's own bound
    (``[gateway] pause_max_ms``, counted): a pause never silences a call for
    ever. A Pause of a dead epoch (at or below the last Clear, or older than
    an utterance already announced) is ignored and counted. Not answered.
    """

    call_id: str
    epoch: int
    sent_ns: int


@frame("resume", to="gateway")
class Resume(Frame):
    """Agent -> gateway: release the held audio of ``epoch`` again (the candidate
    was vetoed). Ignored (counted) when the call is not paused for ``epoch``
    (already resumed by the bound, cleared, or a dead epoch). Not answered."""

    call_id: str
    epoch: int
    sent_ns: int


@frame("playback", to="agent")
class Playback(Frame):
    """Gateway -> agent every 100 ms: out-ring release position per call of that agent."""

    positions: dict[str, int]
    sent_ns: int


@frame("mark", to="gateway")
class Mark(Frame):
    """Agent -> gateway: report ``name`` once the caller has heard out position ``position``."""

    call_id: str
    name: str
    position: int


@frame("mark_played", to="agent")
class MarkPlayed(Frame):
    """Gateway -> agent: a mark was played (Twilio echo, or release position passed it)."""

    call_id: str
    name: str
    position: int
    played_ns: int


@frame("dtmf", to="agent")
class Dtmf(Frame):
    """Gateway -> agent: the caller pressed ``digit``."""

    call_id: str
    digit: str
    duration_ms: int
    at_ns: int


@frame("send_dtmf", to="gateway")
class SendDtmf(Frame):
    """Agent -> gateway: play DTMF digits to the caller (RFC 4733 / Twilio)."""

    call_id: str
    digits: str


@frame("transfer", to="gateway")
class Transfer(Frame):
    """Agent -> gateway: blind transfer (SIP REFER / Twilio REST). Reply: TransferResult.

    ``summary`` (optional) travels as the REFER's ``X-Transfer-Summary`` header; the gateway
    bounds and sanitises it again (printable, no CR/LF) whatever the agent sent."""

    call_id: str
    target: str
    summary: str = ""


@frame("transfer_result", to="agent")
class TransferResult(Frame):
    call_id: str
    ok: bool
    detail: str = ""


@frame("call_event", to="gateway")
class CallEvent(Frame):
    """Agent -> gateway, only for a call whose CallStart said ``events``: one event of the
    call for the caller's side to show (the native protocol's ``call_event`` message).

    ``name`` is a short label (``user_turn``, ``bot_turn``, ``turn_metrics``, ``tool_call``),
    ``data`` its flat JSON object of strings, numbers and booleans, at most a few KiB (the
    sender bounds it). The gateway forwards it to the call's leg as it is, or drops and counts
    it when the leg cannot take it now; it never waits, and it is never answered.
    """

    call_id: str
    name: str
    data: dict[str, Any]


@frame("hangup", to="gateway")
class Hangup(Frame):
    """Agent -> gateway: end the call from our side (SIP BYE / WebSocket close).

    ``call_id`` may also name a consult leg whose ``consult_for`` is a call of the sender's
    (a warm transfer given up); the gateway refuses any other foreign call."""

    call_id: str
    reason: str


# Warm transfer. The caller's actor places a consult leg with the ``dial`` command
# (args ``consult_for`` = its own call_id and ``summary``); the gateway starts that leg on an
# agent with CallStart.consult_for set, and the consult actor speaks the summary and waits
# for the person's answer. Its ConsultVerdict reaches the caller's actor as ConsultResult;
# the caller's actor then sends Bridge (or Hangup of the consult leg). A consult leg that ends
# before its verdict is reported as ConsultResult(outcome="hung_up").


@frame("consult_verdict", to="gateway")
class ConsultVerdict(Frame):
    """Consult actor -> gateway: the person on consult leg ``call_id`` accepted the caller
    (said yes / pressed 1, or heard the summary when acceptance is ``after_summary``) or
    declined. The gateway forwards it to the consulted call's agent as ConsultResult."""

    call_id: str  # the consult leg
    accepted: bool
    detail: str = ""


@frame("consult_result", to="agent")
class ConsultResult(Frame):
    """Gateway -> the caller's agent: what became of consult leg ``consult_id``.

    ``outcome``: ``accepted`` | ``declined`` (the person's verdict) | ``hung_up`` (the leg
    ended before a verdict) | ``answered`` (a Twilio consult leg, queued by its CallSid, whose
    stream arrived: ``detail`` is ``twilio:<CallSid>``, ``consult_id`` the leg's call id; its
    verdict follows)."""

    call_id: str  # the caller's call
    consult_id: str
    outcome: str
    detail: str = ""


@frame("bridge", to="gateway")
class Bridge(Frame):
    """Agent -> gateway: join the caller ``call_id`` and its consult leg ``other`` (its
    ``consult_for`` must be ``call_id``, both answered and alive, at one call rate). The
    gateway then carries media between the two legs itself (each leg's inbound audio becomes
    the other's outbound; recording goes on) and ends the consult leg's actor with
    CallEnd(reason="bridged"). The caller's actor: without ``keep``, ended the same way, and
    the person's hang-up then ends the caller too (``bridge_ended``); with ``keep``, it stays
    attached but unheard during the bridge (the gateway takes none of its audio or playout
    frames), and when the person's leg ends the caller comes back to it: BridgeEnded. The
    caller's hang-up always ends the person's leg. Reply: BridgeResult."""

    call_id: str
    other: str
    keep: bool = False  # the caller's actor stays attached (and hears BridgeEnded)


@frame("bridge_result", to="agent")
class BridgeResult(Frame):
    call_id: str
    ok: bool
    detail: str = ""


@frame("bridge_ended", to="agent")
class BridgeEnded(Frame):
    """Gateway -> the caller's agent (a Bridge with ``keep``): the bridge of ``call_id`` and
    ``other`` (the consult leg) is over because that leg ended (``reason``: its end reason,
    the person's BYE, a drop, its ``max_call_s``) while the caller's leg is still up. The
    caller is back with the agent: its pacer plays the agent's audio again (nothing of the
    person's, nor anything the agent wrote during the bridge, is left queued), and its
    playout frames, DTMF and hang-up are taken again. Sent once per bridge, never after the
    caller's own end."""

    call_id: str  # the caller's call
    other: str  # the consult leg that ended
    reason: str = ""
    ended_ns: int = 0  # time.monotonic_ns() when the gateway saw the leg end


# --- worker lanes (gateway/actor <-> inference worker) ------------------------------

# A worker's realtime lane: every tick (20 ms) it reads each attached call's
# ``in`` ring, resamples to 16 kHz into ``in16``, runs one batched VAD over
# every call with a full window, converts ``tts`` (TTS rate) into ``out``
# (call rate), and sends ONE WorkerTick per subscriber. The job lane (Smart
# Turn, local STT/TTS/LLM) runs on its own thread(s) and never delays a tick.


@frame("attach_call", to="worker")
class AttachCall(Frame):
    """Subscriber -> worker: serve a call's rings. Reply: Attached or ErrorReply.

    ``subscriber`` is the DEALER identity that gets WorkerTicks for the call.
    On a re-attach after a worker death, ``speaking_since`` is the in16
    position of a VAD start that never got its stop (-1 if none): the new
    worker's first tick carries a synthesized stop (``reason`` "worker_lost")
    dated where the old worker's in16 ended (never before ``speaking_since``),
    and it resumes reading ``in`` where ``in16`` left off. ``gateway``, if
    set, is a DEALER identity connected to this worker that also gets
    OutUtterance (the gateway needs utterance starts for its epoch filter).
    Errors: bad_ring (missing ring, bad magic/version), bad_rate, bad_params,
    full. An attach naming a new ``incarnation`` first does what SubscriberHello does.
    ``denoise`` puts noise suppression (workers/denoise.py) between the resampler
    and ``in16``: the VAD and every reader of in16 get the denoised audio, the
    ``in`` ring (the recording) stays raw. A re-attach keeps the call's setting.
    """

    call_id: str
    subscriber: str
    instance: str
    call_rate: int
    tts_rate: int
    speaking_since: int = -1
    vad: dict[str, Any] | None = None  # VadParams overrides (thresholds, min speech/silence)
    gateway: str = ""
    incarnation: str = ""  # the subscriber process's (SubscriberHello); "" = not said
    ring_key: str = ""  # the call's ring key (CallStart.ring_key): part of every ring name of the call
    denoise: str = "off"  # the agent's `[audio] denoise`: "off", "rnnoise" or "deepfilter" (else bad_params)


@frame("subscriber_hello", to="worker")
class SubscriberHello(Frame):
    """Subscriber -> worker, first on each link and again when the worker is reported ready:
    the sender's identity (which a restarted process keeps) is now ``incarnation`` (random per
    process). The worker detaches and unmaps every call of that identity attached by another
    incarnation, at once (the gateway still owns and unlinks their rings); the same incarnation
    again (a reconnect) keeps them. Not answered."""

    incarnation: str


@frame("attached", to="reply")
class Attached(Frame):
    call_id: str
    worker: int
    in16_pos: int


@frame("detach_call", to="worker")
class DetachCall(Frame):
    """Subscriber -> worker: stop serving the call (its rings stay). Reply: Detached."""

    call_id: str


@frame("detached", to="reply")
class Detached(Frame):
    call_id: str


@frame("worker_tick", to="subscriber")
class WorkerTick(Frame):
    """Worker -> subscriber, once per tick for all of that subscriber's calls, when the
    tick has news for it (else at least every 100 ms, empty, as a keepalive).

    ``positions``: call_id -> in16 write position, for the calls whose in16
    advanced in this tick.
    ``events``: the tick's events (VAD start/stop/falling, input gaps, VAD
    failure/recovery), each the wire object of a typed event of
    ``ipc/tick_events.py`` (what each kind carries), read with its ``from_wire``.
    """

    worker: int
    seq: int
    positions: dict[str, int]
    events: list[dict[str, Any]]  # tick_events.to_wire(event) objects
    sent_ns: int


@frame("tts_utterance", to="worker")
class TtsUtterance(Frame):
    """Actor -> worker: utterance ``utterance`` of ``epoch`` starts at ``tts_pos`` in the tts ring."""

    call_id: str
    utterance: int
    epoch: int
    tts_pos: int


@frame("out_utterance", to=("subscriber", "gateway"))
class OutUtterance(Frame):
    """Worker -> actor and gateway: that utterance starts at ``out_pos`` in the out ring
    (resampler ramp-in dropped, so word offsets stay exact). Sent as soon as the
    utterance's first audio is in the out ring (converted at once, outside the
    worker's tick), so the gateway releases its first frame on receipt."""

    call_id: str
    utterance: int
    epoch: int
    out_pos: int


@frame("tts_cut", to="worker")
class TtsCut(Frame):
    """Actor -> worker: epoch ``epoch`` was interrupted; drop tts audio before ``tts_pos``
    and reset the output resampler (unless audio after ``tts_pos``, which is a newer
    epoch's, was already converted: then the running stream is kept)."""

    call_id: str
    epoch: int
    tts_pos: int


@frame("amd_start", to="worker")
class AmdStart(Frame):
    """Actor -> worker: a dialled call was answered; classify its opening from ``in16_pos`` on
    (answering-machine detection, ``workers/amd.py``). The verdict (``amd_verdict``) comes in a
    WorkerTick by ``max_wait_ms`` of audio; with ``leave_message`` a machine's greeting is then
    waited out (``amd_beep`` or ``amd_greeting_end``). A second AmdStart for the call replaces
    the first. ``transcripts``: the actor will send ``amd_hear`` (what the opening says), so a
    greeting told by its cadence is held until ``max_wait_ms`` for a menu cue (``ivr``).
    Not answered; a call the worker does not serve is ignored (the actor's own
    deadline then gives ``uncertain``)."""

    call_id: str
    in16_pos: int
    max_wait_ms: int
    leave_message: bool = False
    transcripts: bool = False


@frame("amd_hear", to="worker")
class AmdHear(Frame):
    """Actor -> worker: the transcript of the screened opening from the answer up to in16
    ``end_pos`` (the local STT's text of that span, the whole of it each time). The call's
    detector checks it for greeting and menu cues; its verdict goes out as ever (``amd_verdict``
    in a WorkerTick: the detector alone decides). Not answered; ignored when the call has no
    detector (not started, or decided). ``text`` longer than 2000 characters is cut."""

    call_id: str
    text: str
    end_pos: int


@frame("smart_turn", to="worker")
class SmartTurnRequest(Frame):
    """Actor -> worker job lane: score the 8 s of in16 ending at ``end_pos``.
    Queued by ``deadline_ns`` (earliest first). Reply: SmartTurnResult, or
    ErrorReply: expired (past ``deadline_ns`` before it started), superseded
    (a newer request for the same call came while this one was still
    queued), cancelled (a SmartTurnCancel came while it was queued), busy (job queue full), timeout (ran too
    long), unknown_call, bad_range (``end_pos`` not in the in16 ring),
    job_failed."""

    call_id: str
    end_pos: int
    deadline_ns: int


@frame("smart_turn_cancel", to="worker")
class SmartTurnCancel(Frame):
    """Actor -> worker, fire-and-forget: the analysis of ``call_id`` ending at ``end_pos`` can
    no longer change the turn (the caller resumed, the turn ended without it, the call hung
    up). Still queued: it never runs and its request is answered ``cancelled``; running: it
    runs to its end and is answered as usual. Nothing else is answered."""

    call_id: str
    end_pos: int


@frame("smart_turn_result", to="reply")
class SmartTurnResult(Frame):
    call_id: str
    end_pos: int
    probability: float
    queued_us: int
    took_us: int


# Local model jobs (the no-key stack; workers/local_jobs.py, brisvox/providers/local_*.py).
# They run on per-kind job lanes of the call's worker, never on the tick thread.
# Requests carry a correlation id and are answered at once (JobAccepted) or with
# the result (SttJobResult) or an ErrorReply: expired, busy, unknown_call,
# bad_range, unsupported (model missing), job_failed, timeout. Streamed output
# travels WITHOUT a correlation id, keyed by (call_id, job): LLM tokens as
# LlmJobDelta, synthesized audio as TtsJobAudio naming positions in the call's
# job-output ring (written by the worker only; audio never travels in a frame).


@frame("stt_job", to="worker")
class SttJob(Frame):
    """Actor -> worker: transcribe in16 ``[start_pos, end_pos)`` (the VAD-gated utterance)
    with the local Whisper model, at most ``max_tokens`` tokens. Reply: SttJobResult."""

    call_id: str
    start_pos: int
    end_pos: int
    deadline_ns: int
    language: str = "en"
    max_tokens: int = 96


@frame("stt_job_result", to="reply")
class SttJobResult(Frame):
    call_id: str
    text: str
    start_pos: int
    end_pos: int
    queued_us: int
    took_us: int


@frame("tts_job", to="worker")
class TtsJob(Frame):
    """Actor -> worker: synthesize ``text`` with the local voice. Reply: JobAccepted (then
    TtsJobAudio frames) or ErrorReply."""

    call_id: str
    job: int
    text: str
    deadline_ns: int
    voice: str = ""
    speed: float = 1.0


@frame("tts_job_audio", to="subscriber")
class TtsJobAudio(Frame):
    """Worker -> actor: samples ``[start_pos, end_pos)`` of ring ``ring`` (at ``rate``) belong
    to ``job``; ``done`` on the last frame of the job (``error`` set if it failed)."""

    call_id: str
    job: int
    ring: str
    rate: int
    start_pos: int
    end_pos: int
    done: bool = False
    error: str = ""


@frame("llm_job", to="worker")
class LlmJob(Frame):
    """Actor -> worker: a chat completion with the local model. ``messages`` are
    ``{"role", "content"}`` rows. Reply: JobAccepted (then LlmJobDelta frames) or ErrorReply."""

    call_id: str
    job: int
    messages: list[dict[str, Any]]
    deadline_ns: int
    max_tokens: int = 128
    temperature: float = 0.2
    model: str = ""  # a local LLM of the worker's catalogue; "" = the worker's default
    repeat_penalty: float = 1.0  # 1.0 = off
    seed: int = 0  # sampling seed (temperature > 0): the same prompt gives the same answer


@frame("llm_job_delta", to="subscriber")
class LlmJobDelta(Frame):
    """Worker -> actor: generated text of ``job`` in order (``seq`` from 0); the last frame has
    ``done`` with ``stop_reason`` ("stop", "length", "cancelled") or ``error``, and the usage."""

    call_id: str
    job: int
    seq: int
    text: str = ""
    done: bool = False
    stop_reason: str = ""
    error: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


@frame("job_accepted", to="reply")
class JobAccepted(Frame):
    call_id: str
    job: int


@frame("job_cancel", to="worker")
class JobCancel(Frame):
    """Actor -> worker, fire-and-forget: stop ``job`` (queued: dropped; running: stopped at
    its next token or sentence). Its stream still ends with a done frame."""

    call_id: str
    job: int


# --- replies ------------------------------------------------------------------------


@frame("error", to="reply")
class ErrorReply(Frame):
    """Typed error answer to any request. ``kind`` is a stable label (counted)."""

    kind: str
    detail: str = ""
    call_id: str = ""
