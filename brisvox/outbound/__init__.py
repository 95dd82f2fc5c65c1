"""Outbound calling: services the daemon's ``outbound`` role hosts (campaigns: :mod:`brisvox.outbound.campaign`)."""
