"""What an attempt's dial came to: the gateway's answer classified into a campaign outcome (pure).

Outcomes of an attempt: ``answered``, ``no_answer``, ``busy``, ``failed``,
``refused`` (the gateway placed nothing: a target outside ``[sip] allow``, a
full or draining gateway, a bad target), ``unknown`` (the attempt was
interrupted, or the gateway did not answer in time: the INVITE may have
gone out). A row ends with the outcome of its last attempt, or
``cancelled`` (the campaign was cancelled before it was dialled). An
answered row reads ``answered`` until an answering-machine verdict is
recorded for its call (``human``/``machine``: :func:`shown`).

Invariants: :func:`classify` maps every (ok, error) pair to exactly one
outcome (a dialer that cannot tell whether it dialled raises instead:
:class:`~.runner.CampaignRunner` records ``unknown``); only ``no_answer``, ``busy``, ``failed`` and ``refused`` may be
retried (:data:`RETRYABLE`), never ``answered``, ``unknown`` or ``cancelled``.
"""

from __future__ import annotations

ANSWERED = "answered"
NO_ANSWER = "no_answer"
BUSY = "busy"
FAILED = "failed"
REFUSED = "refused"
UNKNOWN = "unknown"
CANCELLED = "cancelled"
ATTEMPT_OUTCOMES = (ANSWERED, NO_ANSWER, BUSY, FAILED, REFUSED, UNKNOWN)
ROW_OUTCOMES = (*ATTEMPT_OUTCOMES, CANCELLED)
RETRYABLE = frozenset({NO_ANSWER, BUSY, FAILED, REFUSED})
DEFAULT_RETRY_ON = frozenset({NO_ANSWER, BUSY, FAILED})
AMD_VERDICTS = ("human", "machine")
SHOWN = ("answered_human", "answered_machine", ANSWERED, NO_ANSWER, BUSY, FAILED, REFUSED, UNKNOWN, CANCELLED)

# the gateway's refusals before anything is sent (brisvox/gateway/sip/outbound.py, gateway_core.dial;
# via twilio, the answers of an awaited dial are a SIP dial's: "busy", "no answer", "failed", "canceled")
_REFUSALS = ("refused:", "via must be", "expected ", "no [[sip.trunks]] entry", "a number needs",
             "a trunk dials", "invalid target", "the target's host", "the SIP user agent is not started", "srtp = ",
             "sip is disabled", "params", "a trunk is a [[sip.trunks]] entry",
             # via twilio (brisvox/gateway/control/twilio_dial.py, transports): nothing was sent to Twilio
             "a Twilio dial needs", "no twilio route admits", "the WebSocket listener is not enabled")


def classify(ok: bool, error: str) -> str:
    """The outcome of a dial the gateway answered ``(ok, error)`` (:func:`brisvox.cli.dial_request.dial`)."""
    if ok:
        return ANSWERED
    e = error.strip()
    if e == "busy":
        return BUSY
    if e == "no answer":
        return NO_ANSWER
    if e.startswith(_REFUSALS) or e.endswith("is not in [sip] allow") or "needs a [[sip.listeners]]" in e:
        return REFUSED
    return FAILED  # 5xx/6xx, declined, not found, Timer B, incompatible media, agent unavailable, ...


def shown(outcome: str | None, amd: str | None) -> str | None:
    """A row's outcome as status and exports show it: ``answered_<verdict>`` once AMD said."""
    if outcome == ANSWERED and amd in AMD_VERDICTS:
        return f"answered_{amd}"
    return outcome
