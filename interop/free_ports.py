"""Free ports for the brokers the interop suites start (imported by the python, management and
cluster suites: each adds this folder to its import path)."""

import os
import random
import socket

_HANDED_OUT = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _configured_range():
    """INTEROP_PORTS=FIRST-LAST: every port from that range (a machine shared with other runs)."""
    text = os.environ.get("INTEROP_PORTS", "")
    first, _, last = text.partition("-")
    if not (first.isdigit() and last.isdigit()):
        return None
    return int(first), int(last)


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A port free now, below the kernel's ephemeral range when it can, each handed out once: a
    port from bind(0) is an ephemeral one, which any outgoing connection on the machine (a node
    dialling another, a client, another suite running beside this one) may take before the broker
    given it binds it; CI saw a node fail with "Address already in use" that way. The RabbitMQ
    reference node takes its ports from 5000-9999 (scripts/rabbitmq-reference.sh), these from 10000 up."""
    configured = _configured_range()
    if configured:
        first, last = configured
        for port in random.sample(range(first, last + 1), last - first + 1):
            if port not in _HANDED_OUT and _bindable(port):
                _HANDED_OUT.add(port)
                return port
        raise RuntimeError("no free port in INTEROP_PORTS=%d-%d" % configured)
    low = _ephemeral_low()
    if low and low > 12000:
        for _ in range(200):
            port = random.randrange(10000, low)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
