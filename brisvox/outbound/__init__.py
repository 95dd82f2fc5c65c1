"""The outbound role: services that reach out of the daemon (webhook delivery, campaigns: :mod:`brisvox.outbound.campaign`)."""
