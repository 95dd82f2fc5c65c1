"""Every wire format brisvox speaks, written once: the codecs both ends of a call use.

The gateway (``brisvox/gateway``), the ``brisvox call`` client
(``brisvox/client``), the load generator (``bench/loadgen``), the simulator's
callers (``brisvox/sim``) and the tests all build and parse protocol bytes
with these modules, so a message has one shape wherever it is written:

* ``g711`` -- G.711 mu-law and A-law tables, the mu-law loudness test;
* ``rtp`` -- the RTP header codec and the sender's sequence/timestamp/marker
  rules (the receive jitter buffer is the gateway's own session state);
* ``dtmf`` -- RFC 4733 telephone-events (payload, receiver de-duplication,
  sender schedule) and in-band dual tones;
* ``sdp`` -- SDP offer/answer for one audio stream;
* ``srtp`` -- SDES ``a=crypto`` attributes (RFC 4568) and a call's SRTP
  contexts (RFC 3711, libsrtp through pylibsrtp);
* ``sip_message``, ``sip_transaction``, ``sip_dialog`` -- the SIP parser and
  serializer, the RFC 3261 transaction state machines, dialogs and responses;
* ``sip_session_timer`` -- RFC 4028 session timers: the headers, the
  negotiation of each role, one dialog's timer machine;
* ``ws_framing`` -- RFC 6455 frame classification and headers for the
  WebSocket fast paths (the gateway's server, the load generator's client);
* ``twilio`` -- Twilio Media Streams messages, both directions;
* ``native`` -- the native brisvox ``/ws`` protocol's messages, both directions.

Everything here is sans-I/O: no sockets, no clock reads (a time is always an
argument), no configuration and no metrics (limits and counters' labels are
values passed in or returned). The package imports only the standard library,
numpy, pylibsrtp (libsrtp's SRTP transform, in ``srtp``) and itself: no other brisvox package, no ``ipc``, ``workers``, ``bench``
or ``tests`` (an import-linter contract in ``pyproject.toml``). JSON is
decoded by the callers (orjson on the hot paths): the parsers take the
decoded value and never see the bytes.
"""
