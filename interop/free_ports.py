"""Free ports for the brokers the interop suites start (imported by the python, management and
cluster suites: each adds this folder to its import path)."""

import random
import socket

_HANDED_OUT = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port():
    """A port free now, below the kernel's ephemeral range when it can, each handed out once: a
    port from bind(0) is an ephemeral one, which any outgoing connection on the machine (a node
    dialling another, a client, another suite running beside this one) may take before the broker
    given it binds it; CI saw a node fail with "Address already in use" that way. The RabbitMQ
    reference node takes its ports from 5000-9999 (scripts/rabbitmq-reference.sh), these from 10000 up."""
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
