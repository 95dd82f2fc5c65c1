"""Webhooks: call events signed and delivered to the operator's systems from a durable outbox."""
