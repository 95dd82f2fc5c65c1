"""The stages of one call and their plumbing, one subpackage per job.

* ``stage/``: the machinery every stage shares: the ``Stage`` base (``stage.base``), the
  frames between stages (``stage.frames``), the call's context and IO links
  (``stage.call_context``, ``stage.call_io``);
* ``cascade/``: the cascaded chain's stages as a call meets them: ``stt_stage`` ->
  ``turn_driver`` (running ``turn_machine``, ``dtmf``) -> the LLM runner -> ``segmenter`` ->
  ``tts_stage`` (``tts_clips``) -> ``tts_ring_writer`` (bot audio into the call's tts ring);
* ``llm/``: the LLM runner (``llm.runner``) and what it holds: the model round, the tool
  phase, the flow hook, its policy and turn state, the observer seam and the summarizer;
* ``speculation/``: speculative LLM starts: the hit rule (``speculation.policy``), the
  runner's speculator and the turn driver's offers;
* ``s2s/``: the speech-to-speech chain (stage, machine, audio, tools, cascaded fallback).

On top, ``chain`` declares either chain as data, assembled from a ``call_config.ChainConfig``
(the settings of every stage). The import contract of ``pyproject.toml`` keeps the order:
chain > s2s > cascade > llm : speculation > stage.
"""
