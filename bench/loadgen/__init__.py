"""Load generator for the side-by-side benchmark: N concurrent Twilio Media Streams calls.

Modules: ``speech`` (caller lines via espeak-ng + sox, cached), ``pacing`` (the
one 20 ms timer's schedule), ``caller`` (per-call script state machine),
``stats`` (latency bookkeeping and summaries), ``runner`` (asyncio: sockets and
the timer), ``sampler`` (CPU and PSS of a server's process tree), ``harness``
(a server under test x a list of N -> rows), ``wire`` and ``wsclient`` (the
masked pre-encoded frames and the lean WebSocket client). The Twilio Media
Streams messages come from :mod:`brisvox.wire.twilio`, G.711 and the mu-law
loudness test from :mod:`brisvox.wire.g711`. ``python -m bench.loadgen --help``.
"""
