"""The WebSocket listener: the server, handshake auth, trusted proxies, the connection log and the playground."""
