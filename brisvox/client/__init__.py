"""The brisvox call client: place one call to a voice agent and measure it (``brisvox call``).

Modules, in data-flow order:

* ``speech`` -- the caller's lines: a WAV file, or a text spoken by the local
  Piper voice (espeak-ng as the light fallback), at the call's rate;
* ``script`` -- the caller as a pure state machine: what to send each 20 ms
  (speech, silence, DTMF, hang-up), which bot audio answers which turn, the
  barge-in, and the per-turn latencies measured at the client;
* ``recorder`` -- the bot's audio as the caller heard it (a clear drops what
  was still buffered), on the call's timeline, written to a WAV;
* ``transport`` -- what every protocol offers the runner; ``twilio``
  (Twilio Media Streams), ``telnyx`` (Telnyx Media Streaming; the two share
  ``media_stream``), ``plivo`` (Plivo Audio Streams), ``native`` (the
  native ``/ws`` protocol) and ``sip``
  (a small SIP UA over UDP with RTP and RFC 4733 DTMF); every message and
  codec they put on the wire is :mod:`brisvox.wire`, shared with the gateway;
* ``runner`` -- the asyncio side: one 20 ms timer, the transport, the script;
* ``transcribe`` -- Whisper tiny.en (faster-whisper) turning the bot's audio
  back into text, locally;
* ``report`` -- the per-turn printout and the JSON result;
* ``call_cli`` -- the ``brisvox call`` subcommand.
"""
