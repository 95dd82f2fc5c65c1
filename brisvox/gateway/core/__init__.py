"""The gateway core: GatewayCore, the call table, its lifecycle, playout commands, peers, pacer and recorder."""
