"""The tcp transport: the stream engine over the socket mesh (transport.py), its native
collectives (native.py) and its C small-message lane (tcp_lane.c, exchange.c, _sockets.c)."""
