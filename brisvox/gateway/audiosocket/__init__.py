"""Asterisk AudioSocket over TCP: the ``[audiosocket]`` listener and the call leg of each connection."""
