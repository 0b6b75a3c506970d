"""Servers the tests start listen on 127.0.0.1 only, each on a port the system says is free."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
