"""Load generator for the side-by-side benchmark: N concurrent Twilio Media Streams calls.

Modules: ``mulaw`` (G.711 tables), ``speech`` (caller lines via espeak-ng + sox,
cached), ``twilio`` (client-side messages), ``pacing`` (the one 20 ms timer's
schedule), ``caller`` (per-call script state machine), ``stats`` (latency
bookkeeping and summaries), ``runner`` (asyncio: sockets and the timer),
``sampler`` (CPU and PSS of a server's process tree), ``harness`` (a server
under test x a list of N -> rows). ``python -m bench.loadgen --help``.
"""
