"""The chaos run: many concurrent calls against a real ``brisvoxd`` while processes die and peers misbehave.

Used by ``python -m bench chaos`` (``bench/bench_chaos.py``) and
``tests/system/test_chaos.py``. The pieces:

* :mod:`.script` -- the scripted conversations (what each caller says, what
  the fake STT hears, what the fake LLM answers, per turn) and how two
  conversations are compared (booking numbers and tool ids normalised);
* :mod:`.vendors` -- loopback Deepgram (WS), OpenAI-compatible (SSE) and
  Cartesia (WS) servers answering those conversations, plus the booking API
  (counts every POST body by its Idempotency-Key) and a control endpoint that
  arms provider faults; run in their own process (``python -m
  bench.harness.chaos.vendors``) so they never share a core's GIL with the
  callers;
* :mod:`.booking_tool` -- the agent's ``book_table`` SideEffect tool (loaded by
  the agent processes from ``tool_modules``), a POST to the booking API;
* :mod:`.callers` -- the callers: Twilio Media Streams, native WebSocket and
  SIP, with client-side faults (slow reader, no mark echo, malformed messages,
  abrupt hang-up mid-answer and mid-tool);
* :mod:`.faults` -- the fault schedule (time offsets into the run) and the
  probes of the daemon's processes (mapped segments, fds, PSS/RSS);
* :mod:`.judge` -- every judgment, per call and after the run;
* :mod:`.run` -- the whole scenario, always cleaned up.

Invariants: everything binds 127.0.0.1; every process the run starts is
stopped by its pid (the daemon's process group, the vendor process); every
wait is bounded; a run that fails still removes the instance's /dev/shm
segments.
"""
