"""The watchdog's side channel (hvd_elastic/watchdog.py): TCP between rank 0's hub and every other rank, closed to
everything but the job's own ranks.

Who may talk. Rank 0 draws a 32-byte secret at start-up and hands it to the other ranks through Horovod's own
collective (Watchdog.start), so only the job's ranks hold it. Every connection begins with a handshake: the hub
sends a fresh nonce (challenge); the rank answers hello (its rank and a nonce of its own) with an HMAC-SHA256 of the
hub's nonce and the hello under the secret; the hub answers welcome under the connection's key, HMAC(secret, both
nonces), which proves to the rank that the hub holds the secret too. Every later line is `<hex HMAC> <JSON>` under
that key and a direction label, with a sequence number that must grow: a line recorded on one connection (or in one
direction) is worth nothing on another, nor replayed on its own.

Noise. Whatever else arrives is dropped and counted (`Channel.dropped`, shown in the end-of-run report), never acted
on. A connection whose first line is not a valid hello (garbage, invalid JSON, a bad HMAC, a line over HELLO_MAX), or
that has not authenticated within HANDSHAKE_S, is closed. At most `size + PENDING_EXTRA` connections may be
unauthenticated at a time (a new one closes the oldest) and one pass of the watchdog thread accepts at most
ACCEPT_BATCH, so a flood costs rank 0 a bounded number of sockets and the thread a bounded amount of work per pass:
heartbeats keep their pace. On an authenticated connection a line that fails its check, or whose type that side may
not send, is dropped and the connection kept (closing it would read as that rank lost).

Where rank 0 listens (bind_addresses): on 127.0.0.1 when every rank runs on its host; else on its address on the
kernel's route to each other host's ranks, and those addresses are what it advertises.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import selectors
import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

HANDSHAKE_S = 5.0     # a connection must authenticate within this
PENDING_EXTRA = 32    # unauthenticated connections allowed at a time, beyond one per rank (all may start at once)
ACCEPT_BATCH = 64     # connections accepted per pass of the watchdog thread
HELLO_MAX = 1024      # longest line before authentication
LINE_MAX = 65536      # longest line after it, plus LINE_PER_RANK per rank (the hub's table has a row per rank)
LINE_PER_RANK = 1024
ACCEPTS = {True: ("hb", "abort"), False: ("table", "abort")}   # what the hub (True) / a rank may receive


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).hexdigest().encode()


def _key(secret: bytes, hub_nonce: str, rank_nonce: str) -> bytes:
    return hmac.new(secret, f"key|{hub_nonce}|{rank_nonce}".encode(), hashlib.sha256).digest()


def _is_nonce(n) -> bool:
    return isinstance(n, str) and len(n) == 32 and all(c in "0123456789abcdef" for c in n)


class Link:
    """One connection: newline-framed lines; once authenticated (`key` set), each sealed with the connection's key."""

    def __init__(self, sock: socket.socket, rank: Optional[int] = None):
        self.sock, self.rank = sock, rank
        self.since = self.last = time.monotonic()    # accepted / last valid line
        self.key: Optional[bytes] = None
        self.nonce = ""                              # the hub's challenge
        self.buf = b""
        self.sent = self.seen = 0                    # sequence numbers: last sent / last accepted

    def read(self, limit: int) -> Optional[List[bytes]]:
        """The complete lines that arrived (one recv: call when readable); None when the connection closed or a line
        is longer than `limit`."""
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            return None
        *lines, self.buf = (self.buf + data).split(b"\n")
        if len(self.buf) > limit or any(len(line) > limit for line in lines):
            return None
        return lines

    def next_line(self, limit: int) -> bytes:
        """The next line, blocking up to the socket's timeout (a rank's handshake)."""
        while b"\n" not in self.buf:
            data = self.sock.recv(4096)
            if not data or len(self.buf) > limit:
                raise ConnectionError("the connection closed during the handshake")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def seal(self, msg: dict, label: bytes) -> bytes:
        self.sent += 1
        body = json.dumps({**msg, "q": self.sent}).encode()
        return _mac(self.key, label, body) + b" " + body + b"\n"

    def open(self, line: bytes, label: bytes) -> Optional[dict]:
        """The message of a sealed line, or None: a bad HMAC, not a JSON object, an old sequence number."""
        mac, _, body = line.partition(b" ")
        if self.key is None or not hmac.compare_digest(mac, _mac(self.key, label, body)):
            return None
        msg = json.loads(body)
        q = msg.get("q") if isinstance(msg, dict) else None
        if type(q) is not int or q <= self.seen or not isinstance(msg.get("t"), str):
            return None
        self.seen = q
        return msg


class Channel:
    """One rank's end: the hub (rank 0) listens, the others connect. The watchdog thread polls; the training thread
    may send too (a state change before an exit)."""

    def __init__(self, rank: int, size: int, secret: bytes):
        self.rank, self.size, self.secret, self.hub = rank, size, secret, rank == 0
        self.out_label, self.in_label = (b"down", b"up") if self.hub else (b"up", b"down")
        self.links: Tuple[Link, ...] = ()        # authenticated; replaced, never changed (other threads read it)
        self.pending: Dict[Link, None] = {}      # hub: accepted, not authenticated yet, oldest first
        self.dropped = 0                         # noise: connections closed before authenticating, lines dropped
        self.max_gap = 0.0                       # longest time between two valid lines of a connection
        self.endpoints: List[list] = []          # hub: [address, port] where the ranks may reach it
        self._listeners: List[socket.socket] = []
        self._sel = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers (select's 1024)
        self._lock = threading.Lock()
        self._line_max = LINE_MAX + LINE_PER_RANK * size

    # ---- start-up ----------------------------------------------------------------------------------------------
    def listen(self, hosts: List[dict]) -> List[list]:
        """The hub: listen where the ranks described by `hosts` (host_info() of every rank) need it; returns the
        endpoints to advertise."""
        for address in bind_addresses(hosts):
            with contextlib.suppress(OSError):
                self._listen_on(address, hosts[0])
        if not self.endpoints:     # none could be bound: anywhere (still closed to strangers by the secret)
            self._listen_on("0.0.0.0", hosts[0])
        return self.endpoints

    def _listen_on(self, address: str, me: dict):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, 0))
            s.listen(min(self.size + PENDING_EXTRA, 4096))
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        self._listeners.append(s)
        self._sel.register(s, selectors.EVENT_READ, None)
        port = s.getsockname()[1]
        shown = me["addresses"] + [me["host"]] if address == "0.0.0.0" else [address]
        self.endpoints += [[a, port] for a in shown]

    def connect(self, endpoints: List[list], deadline: float) -> Tuple[Optional[Link], Optional[Exception]]:
        """A rank: reach the hub and authenticate, retrying every endpoint until `deadline`."""
        err: Optional[Exception] = None
        while time.monotonic() < deadline:
            for host, port in endpoints:
                try:
                    link = self._handshake(socket.create_connection((host, port), timeout=2.0))
                except (OSError, ValueError) as e:   # unreachable, refused, or no proof of the secret
                    err = e
                    continue
                self.links = (link,)
                self._sel.register(link.sock, selectors.EVENT_READ, link)
                return link, None
            time.sleep(0.5)
        return None, err

    def _handshake(self, sock: socket.socket) -> Link:
        """A rank's side: challenge in, hello out, welcome in."""
        link = Link(sock, rank=0)
        try:
            sock.settimeout(HANDSHAKE_S)
            challenge = json.loads(link.next_line(HELLO_MAX))
            if not (isinstance(challenge, dict) and challenge.get("t") == "challenge"
                    and _is_nonce(challenge.get("n"))):
                raise ValueError("no challenge from the hub")
            nonce = secrets.token_hex(16)
            body = json.dumps({"t": "hello", "r": self.rank, "n": nonce}).encode()
            sock.sendall(_mac(self.secret, b"hello", challenge["n"].encode(), body) + b" " + body + b"\n")
            link.key = _key(self.secret, challenge["n"], nonce)
            welcome = link.open(link.next_line(self._line_max), self.in_label)
            if not welcome or welcome["t"] != "welcome":
                raise ValueError("the hub did not prove that it holds the job's secret")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.last = time.monotonic()
        return link

    # ---- traffic -----------------------------------------------------------------------------------------------
    def send(self, link: Link, msg: dict) -> bool:
        try:
            with self._lock:
                link.sock.sendall(link.seal(msg, self.out_label))
            return True
        except OSError:
            return False

    def poll(self, timeout: float) -> List[Tuple[Link, Optional[dict]]]:
        """Wait up to `timeout` for traffic. Returns the authenticated connections' messages, and (link, None) for
        each of them that closed; handshakes and noise are dealt with here."""
        try:
            ready = self._sel.select(timeout)
        except (OSError, ValueError):      # closed (a forked child)
            time.sleep(timeout)
            return []
        out: List[Tuple[Link, Optional[dict]]] = []
        for key, _ in ready:
            link = key.data
            if link is None:
                self._accept(key.fileobj)
            elif link.key is not None:
                out += self._receive(link)
            elif link in self.pending:      # (not closed for a newer one earlier in this pass)
                out += self._receive_pending(link)
        self._expire()
        return out

    def _accept(self, listener: socket.socket):
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError:                # out of descriptors: free one
                if self.pending:
                    self._drop(next(iter(self.pending)))
                return
            if len(self.pending) >= self.size + PENDING_EXTRA:
                self._drop(next(iter(self.pending)))
            link = Link(sock)
            link.nonce = secrets.token_hex(16)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.send(json.dumps({"t": "challenge", "n": link.nonce}).encode() + b"\n")
            except OSError:
                sock.close()
                self.dropped += 1
                continue
            self.pending[link] = None
            self._sel.register(sock, selectors.EVENT_READ, link)

    def _receive_pending(self, link: Link) -> List[Tuple[Link, Optional[dict]]]:
        """A connection not yet authenticated: its first line must be a valid hello, else it is noise."""
        lines = link.read(HELLO_MAX)
        try:
            ok = lines is not None and (not lines or self._authenticate(link, lines[0]))
        except Exception:                  # anything a stranger can make the parsing raise
            ok = False
        if not ok:
            self._drop(link)
            return []
        return self._messages(link, lines[1:]) if link.key is not None else []

    def _authenticate(self, link: Link, line: bytes) -> bool:
        mac, _, body = line.partition(b" ")
        if not hmac.compare_digest(mac, _mac(self.secret, b"hello", link.nonce.encode(), body)):
            return False
        msg = json.loads(body)
        rank, nonce = msg.get("r"), msg.get("n")
        if msg.get("t") != "hello" or type(rank) is not int or not 0 < rank < self.size or not _is_nonce(nonce):
            return False
        link.rank, link.key, link.last = rank, _key(self.secret, link.nonce, nonce), time.monotonic()
        del self.pending[link]
        link.sock.setblocking(True)
        self.send(link, {"t": "welcome"})      # first: the rank expects it before any table
        self.links += (link,)
        return True

    def _receive(self, link: Link) -> List[Tuple[Link, Optional[dict]]]:
        lines = link.read(self._line_max)
        if lines is None:
            self._forget(link)
            return [(link, None)]
        return self._messages(link, lines)

    def _messages(self, link: Link, lines: List[bytes]) -> List[Tuple[Link, Optional[dict]]]:
        out: List[Tuple[Link, Optional[dict]]] = []
        for line in lines:
            try:
                msg = link.open(line, self.in_label)
            except ValueError:
                msg = None
            if msg is None or msg["t"] not in ACCEPTS[self.hub]:
                self.dropped += 1
                continue
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - link.last)
            link.last = now
            out.append((link, msg))
        return out

    def _expire(self):
        now = time.monotonic()
        while self.pending:
            oldest = next(iter(self.pending))
            if now - oldest.since < HANDSHAKE_S:
                return
            self._drop(oldest)

    def _drop(self, link: Link):
        """Close a connection that did not authenticate: noise."""
        self.dropped += 1
        self.pending.pop(link, None)
        self._forget(link)

    def _forget(self, link: Link):
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(link.sock)
        with contextlib.suppress(OSError):
            link.sock.close()
        if link in self.links:
            self.links = tuple(other for other in self.links if other is not link)

    def close_all(self):
        """Close every socket (a forked child: so that they close when the parent dies)."""
        for s in [*self._listeners, *(link.sock for link in (*self.links, *self.pending))]:
            with contextlib.suppress(OSError):
                s.close()
        self.links, self.pending, self._listeners = (), {}, []
        with contextlib.suppress(OSError):
            self._sel.close()


# ---- where rank 0 listens ------------------------------------------------------------------------------------------
def host_info() -> dict:
    """This rank's host, for rank 0's choice of where to listen (exchanged at start-up)."""
    return {"host": socket.gethostname(), "addresses": addresses()}


def addresses() -> List[str]:
    """This host's IPv4 addresses that other hosts may reach (no loopback), best guess first: the source of the
    default route, the interfaces' (psutil, which Horovod requires), the hostname's."""
    out: List[str] = []
    with contextlib.suppress(OSError):
        out += [a for a in [route_source("10.255.255.255")] if a]
    with contextlib.suppress(ImportError, OSError):
        import psutil
        out += [a.address for nic in psutil.net_if_addrs().values() for a in nic if a.family == socket.AF_INET]
    with contextlib.suppress(OSError):
        out += [ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    return [a for a in dict.fromkeys(out) if not a.startswith("127.")]


def route_source(address: str) -> Optional[str]:
    """This host's address on the kernel's route to `address` (a UDP connect: no packet is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        return probe.getsockname()[0]
    return None


def same_host(a: dict, b: dict) -> bool:
    """Same hostname and, where both know addresses, one in common (network namespaces and containers may share a
    hostname, not a loopback)."""
    return a["host"] == b["host"] and (bool(set(a["addresses"]) & set(b["addresses"]))
                                       or not a["addresses"] or not b["addresses"])


def bind_addresses(hosts: List[dict], route: Callable[[str], Optional[str]] = route_source) -> List[str]:
    """Where rank 0 (hosts[0]) listens: 127.0.0.1 when every rank is on its host; else, for every other host, its
    own address on the route to that host's addresses (an address both hosts have, like docker0's, says nothing),
    or all of its addresses when there is no such route."""
    me = hosts[0]
    remote = [h for h in hosts[1:] if not same_host(me, h)]
    if not remote:
        return ["127.0.0.1"]
    out: List[str] = []
    for h in remote:
        theirs = [a for a in h["addresses"] if a not in me["addresses"]]
        source = next((s for s in map(route, theirs) if s and not s.startswith("127.")), None)
        out += [source] if source else me["addresses"]
    return list(dict.fromkeys(out)) or ["0.0.0.0"]
