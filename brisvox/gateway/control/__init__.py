"""Carrier control planes: the Twilio REST client, the TwiML webhook and outbound dial through Twilio."""
