"""SIP over UDP: the user agent and the parts it holds (transactions, dialogs, outbound dialer, RTP sessions, guard, counters, jitter buffer)."""
