"""Prints N free TCP port bases on 127.0.0.1 (each base and base+1 free)."""
import random
import socket
import sys


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def candidate() -> int:
    """A port below the ephemeral range (testkit's free_port: a port inside
    it can be taken by an outgoing connection while its server is stopped),
    or the kernel's choice when the range leaves no room below it."""
    top = ephemeral_low() - 64
    if top > 11000:
        return random.randrange(10000, top)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    found = []
    while len(found) < wanted:
        port = candidate()
        if (
            port < 65000
            and port not in found
            and port - 1 not in found
            and port + 1 not in found
            and free(port)
            and free(port + 1)
        ):
            found.append(port)
    print(" ".join(map(str, found)))


main()
