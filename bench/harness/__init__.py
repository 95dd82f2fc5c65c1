"""Harness code the benchmarks and the tests share: drive a real daemon and fake peers from outside.

``daemon`` (start a real ``brisvoxd`` in its own session, talk to it, always
clean up), ``call_daemon`` (the scripted-provider daemon of the simultaneous
call test and of ``python -m bench actor``), ``sipp`` (SIPp scenarios),
``http_server`` and ``llm_wire`` (a scriptable loopback HTTP server and the
LLM vendors' wire formats on it), ``ws_vendors`` (loopback Deepgram, Cartesia
and ElevenLabs WebSocket servers with fault modes) and ``chaos`` (the 100-call
chaos run of ``python -m bench chaos`` and ``tests/system/test_chaos.py``).

It lives in ``bench`` because the dependency between the two trees runs one
way: ``tests`` may import ``bench`` (the load-generator and workload tests do),
``bench`` imports no ``tests`` module (``tests/unit/test_import_layers.py``).
Neither tree is installed with the package, so this code never ships.
"""
