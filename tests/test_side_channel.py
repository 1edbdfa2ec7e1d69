"""The watchdog's side channel is closed to strangers (hvd_elastic/sidechannel.py): only the job's ranks, which hold
the per-job secret, are heard; anything else that reaches rank 0's port is dropped, counted, never obeyed, and a
flood neither exhausts rank 0 nor delays the heartbeats.

The channel itself in-process (handshake, replay, caps, where rank 0 listens), then strangers knocking on a real
2-rank job under both launchers."""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from launch import LAUNCHERS, ROOT, command, job_env

from hvd_elastic import sidechannel
from hvd_elastic.sidechannel import Channel
from hvd_elastic.stall import SILENT_S

LOCAL = {"host": "h0", "addresses": ["10.0.0.1"]}
ABORT = b'{"t": "abort", "msg": "STRANGER says: stop the job"}\n'


# ---- where rank 0 listens ------------------------------------------------------------------------------------------
def test_rank0_listens_on_loopback_when_every_rank_shares_its_host():
    assert sidechannel.bind_addresses([LOCAL, dict(LOCAL), dict(LOCAL)]) == ["127.0.0.1"]


def test_rank0_listens_on_its_address_on_the_route_to_the_other_hosts():
    routes = {"10.0.0.2": "10.0.0.1", "192.168.1.5": "192.168.1.1"}
    me = {"host": "h0", "addresses": ["10.0.0.1", "192.168.1.1", "172.17.0.1"]}
    h1 = {"host": "h1", "addresses": ["172.17.0.1", "10.0.0.2"]}     # docker0's address, on every host: skipped
    h2 = {"host": "h0", "addresses": ["192.168.1.5"]}                # same hostname, other namespace: another host
    assert sidechannel.bind_addresses([me, dict(me), h1], routes.get) == ["10.0.0.1"]
    assert sidechannel.bind_addresses([me, h1, h2], routes.get) == ["10.0.0.1", "192.168.1.1"]
    # No route to a host: every address of rank 0's, never loopback.
    assert sidechannel.bind_addresses([me, {"host": "h3", "addresses": ["10.9.9.9"]}], lambda a: None) == \
        me["addresses"]


# ---- the channel in-process ----------------------------------------------------------------------------------------
class Hub:
    """Rank 0's end on 127.0.0.1, polled by a thread as the watchdog does; collects the messages it passes on."""

    def __init__(self, size=2, secret=b"s" * 32):
        self.channel = Channel(0, size, secret)
        self.host, self.port = self.channel.listen([LOCAL] * size)[0]
        self.messages, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.messages += self.channel.poll(0.05)

    def close(self):
        self._stop.set()
        self._thread.join()
        self.channel.close_all()


@pytest.fixture
def hub():
    h = Hub()
    yield h
    h.close()


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _knock(hub, data, hold=0.0):
    with socket.create_connection((hub.host, hub.port), timeout=2) as s:
        s.sendall(data)
        time.sleep(hold)


def test_a_rank_with_the_secret_is_heard_and_nothing_else(hub):
    rank = Channel(1, 2, b"s" * 32)
    link, err = rank.connect([[hub.host, hub.port]], time.monotonic() + 5)
    assert link is not None, err
    assert rank.send(link, {"t": "hb", "s": 1})
    _wait(lambda: len(hub.messages) == 1)
    (peer, msg), = hub.messages
    assert peer.rank == 1 and msg["t"] == "hb" and msg["s"] == 1
    # Replayed, reflected (sealed for the other direction), or of a type a rank may not send: dropped, counted.
    line = link.seal({"t": "hb", "s": 2}, b"up")
    link.sock.sendall(line + line)
    link.sock.sendall(link.seal({"t": "hb", "s": 3}, b"down"))
    link.sock.sendall(link.seal({"t": "table", "rows": []}, b"up"))
    link.sock.sendall(b"garbage\n")
    _wait(lambda: hub.channel.dropped == 4)
    assert [m["s"] for _, m in hub.messages] == [1, 2]
    assert hub.channel.links == (peer,)      # the rank's connection is kept: closing it would read as rank 1 lost
    rank.close_all()


def test_a_wrong_secret_gets_nowhere(hub):
    stranger = Channel(1, 2, b"x" * 32)
    link, err = stranger.connect([[hub.host, hub.port]], time.monotonic() + 1)
    assert link is None and err is not None
    _wait(lambda: hub.channel.dropped >= 1 and not hub.channel.pending)
    assert hub.channel.links == () and hub.messages == []


@pytest.mark.parametrize("data", [ABORT, b"\x00\xff\xfe garbage\n", b'{"t": "hello", "r": 1, "n": "01',
                                  b"0" * 64 + b' {"t": "hello", "r": 1, "n": "' + b"0" * 32 + b'"}\n',
                                  b"x" * 5000], ids=["abort", "garbage", "truncated", "bad-hmac", "too-long"])
def test_noise_is_dropped_and_counted(hub, data):
    _knock(hub, data)
    _wait(lambda: hub.channel.dropped == 1 and not hub.channel.pending)
    assert hub.messages == [] and hub.channel.links == ()


def test_a_connection_that_never_authenticates_is_closed(hub, monkeypatch):
    monkeypatch.setattr(sidechannel, "HANDSHAKE_S", 0.3)
    with socket.create_connection((hub.host, hub.port), timeout=2) as s:
        assert json.loads(s.recv(1024))["t"] == "challenge"
        s.settimeout(3)
        assert s.recv(1024) == b""           # closed by the hub
    _wait(lambda: hub.channel.dropped == 1 and not hub.channel.pending)


def test_a_flood_is_capped_and_a_rank_still_gets_in(hub):
    cap = hub.channel.size + sidechannel.PENDING_EXTRA
    flood = [socket.create_connection((hub.host, hub.port), timeout=2) for _ in range(cap + 40)]
    _wait(lambda: hub.channel.dropped >= 40)
    assert len(hub.channel.pending) <= cap
    link, err = Channel(1, 2, b"s" * 32).connect([[hub.host, hub.port]], time.monotonic() + 5)
    assert link is not None, err
    for s in flood:
        s.close()


# ---- strangers knocking on a running job ---------------------------------------------------------------------------
def _attack(host, port):
    """(a) the abort line, (b) garbage, (c) a truncated message, a forged hello, a line too long, (d) a flood of 200
    connections, half of them sending the abort line, held open for a second."""
    for data in (ABORT, os.urandom(3000), b"\x00garbage\n", b'{"t": "hello", "r": 1, "n": "01',
                 b"0" * 64 + b' {"t": "hello", "r": 1, "n": "' + b"0" * 32 + b'"}\n', b"x" * 100_000):
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(data)
        except OSError:
            pass        # closed on us mid-send: noise dropped
    flood = []
    for i in range(200):
        try:
            s = socket.create_connection((host, port), timeout=2)
            flood.append(s)
            if i % 2:
                s.sendall(ABORT)
        except OSError:
            pass
    time.sleep(1.0)
    for s in flood:
        s.close()


def _run_attacked(launcher, out_dir, target):
    env = job_env({"HVD_ELASTIC_POLICY": "asp", "HVD_ELASTIC_EMULATE_DELAY": "*:0.005", "TEST_WRITE_HUB": "1"})
    proc = subprocess.Popen(command(launcher, 2, "tests/workers/relaxed_train.py",
                                    [out_dir, "--mode", "train", "--target", target]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True,
                            start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    hub = os.path.join(out_dir, "hub.json")
    try:
        deadline = time.monotonic() + 90
        while not os.path.exists(hub):
            assert proc.poll() is None and time.monotonic() < deadline, \
                "rank 0 never wrote its side-channel endpoints:\n" + "".join(lines)[-3000:]
            time.sleep(0.1)
        endpoints = json.load(open(hub))
        assert endpoints[0][0] == "127.0.0.1", endpoints      # every rank on this host: loopback only
        _attack(*endpoints[0])
        running_after_attack = proc.poll() is None
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
    return proc.returncode, "".join(lines), running_after_attack


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_strangers_cannot_stop_or_disturb_a_job(launcher, tmp_path):
    t0 = time.perf_counter()
    rc, out, running_after_attack = _run_attacked(launcher, tmp_path, target=1600)
    print(f"{launcher}: job {time.perf_counter() - t0:.1f} s")
    assert rc == 0, out[-3000:]
    assert "STRANGER" not in out and "hvd_elastic: error" not in out, out[-3000:]
    assert running_after_attack, "the job ended before the attack was over (make it longer):\n" + out[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    counters = ranks[0]["report"]["ranks"][0]["counters"]
    print(f"{launcher}: rank 0 {counters.get('side_channel_dropped')} dropped, longest gap between heartbeats "
          f"{counters.get('side_channel_max_gap_s')} s")
    assert counters["side_channel_dropped"] > 0, counters
    assert counters["side_channel_max_gap_s"] < SILENT_S, counters     # the flood did not silence rank 1
