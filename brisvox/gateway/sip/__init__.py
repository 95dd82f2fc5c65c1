"""SIP over UDP: the user agent, its transactions, dialogs, outbound dialer, RTP sessions, guard and jitter buffer."""
