"""The agent process and the building of its calls.

The process role (``process``: many calls on one loop, linked to the gateway
and the workers), its config sections (``config``), the call actor that
assembles, feeds and ends one call's pipeline (``actor``), the scripted
provider set (``scripted_call``), the call record written at hang-up
(``call_record``) and the stage supervision that ends a call whose stage
failed (``supervision``).
"""
