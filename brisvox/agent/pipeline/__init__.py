"""The stages of one call and their plumbing, in data-flow order.

The frames and the stage machinery (``frames``, ``stage``), the chain declared
as data (``chain``, assembled from a ``call_config.ChainConfig``), what every
stage shares (``call_context``, ``call_io``), then the stages as a call meets them:
``stt_stage`` -> ``turn_driver`` (running ``turn_machine``) -> ``llm_runner``
(holding ``llm_round``, ``llm_tool_phase``, ``llm_flow``; ``llm_turn``, ``llm_policy``)
-> ``segmenter`` -> ``tts_stage`` -> ``tts_ring_writer`` (bot audio into the call's
tts ring).
"""
