#!/usr/bin/env bash
# A small multi-host cluster on this one machine, for multi-host Horovod runs (Gloo and MPI) without real hosts.
#
#   ci/cluster.sh up N [--rate RATE] [--venv DIR]   make hosts hvde-h1 .. hvde-hN (rebuilds a different cluster)
#   ci/cluster.sh down [--purge]                    remove everything `up` made (also after a failed `up`)
#   ci/cluster.sh status                            hosts, addresses, rates, sshd health, launcher options
#   ci/cluster.sh check [MB]                        run a Horovod job on all hosts with horovodrun --gloo and with
#                                                   mpirun; prints rank/host, veth byte counters, allreduce timing
#
# Needs root and iproute2 with `ip netns`; installs Debian's openssh-server if /usr/sbin/sshd is missing.
#
# What a host is
#   Host hvde-hK is a network namespace of the same name holding one end of a veth pair, renamed `hvde0`, with the
#   address $NET.(10+K)/24 (NET defaults to 10.213.0; override with HVDE_CLUSTER_NET=a.b.c) and `lo` up.  The other
#   end, `hvde-hK-br`, is a port of the bridge `hvde0` in the root namespace, which has $NET.1, so the launcher
#   (horovodrun / mpirun run in the root namespace) reaches every host, and hosts reach each other through the
#   bridge.  No default route, no forwarding, no NAT: nothing outside $NET.0/24 is touched.
#   The bridge and the hosts' interfaces share the name `hvde0` on purpose: horovodrun picks "the interface common to
#   all hosts" and then looks that name up in the launcher's own namespace for the driver's address.
#   --rate RATE (tc syntax: 1gbit, 500mbit, 10gbit; default: unshaped) puts a tbf qdisc on both directions of every
#   host link: on `hvde0` inside the namespace (host -> bridge) and on `hvde-hK-br` (bridge -> host).  So a host
#   sends at most RATE and receives at most RATE, like a NIC of that speed on a non-blocking switch.
#   Each host runs its own sshd in its own UTS namespace whose hostname is hvde-hK, so `ssh hvde-hK hostname` says
#   hvde-hK and OpenMPI / Horovod see distinct hosts (OpenMPI would otherwise treat all ranks as one node and use
#   shared memory).  sshd listens on the host's address only, root login by key only (no passwords, no PAM), with
#   a host key and a client key pair made under $CACHE (/root/.cache/hvd-elastic/cluster by default).
#   /etc/hosts gets a delimited block with the host names, and ~/.ssh/config a delimited block at its top
#   (Host hvde-h* and $NET.*: IdentityFile, StrictHostKeyChecking no, UserKnownHostsFile /dev/null, BatchMode yes),
#   so `ssh hvde-h2 ...` works without prompts from the root namespace and from inside any host.
#
# Environment over ssh (the important pitfall)
#   sshd resets PATH for a session to Debian's default (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin),
#   and it overrides any PATH a client sends (AcceptEnv PATH cannot work).  Then the login shell runs the user's
#   ~/.bashrc (bash reads it for `ssh host cmd` too), which may prepend more (here: pyenv shims, ~/.cargo/bin).
#   - `up --venv DIR` (default: $HVDE_VENV, which ci/env.sh exports) sets `SetEnv PATH=DIR/bin:<default>` in each
#     sshd.  That is only the start: a ~/.bashrc that prepends pyenv shims still wins, so a bare
#     `ssh hvde-h2 python` may get another python.  Use `ssh hvde-h2 DIR/bin/python`, or a launcher:
#   - horovodrun needs nothing more: it runs each remote command as `env PATH=<launcher's PATH> <all exportable
#     vars> cmd`, after ~/.bashrc, so the ranks see the launcher's PATH (checked: sys.executable is the venv's).
#   - mpirun exports only what you name: pass `-x PATH` (it is applied to the ranks after ~/.bashrc; checked), plus
#     `-x PYTHONPATH`, `-x LD_LIBRARY_PATH`, `-x HOROVOD_...` only if they are set (mpirun warns about unset
#     names), or give the absolute path of python.  orted itself is /usr/bin/orted, found on any PATH.
#   - sshd also accepts LANG, LC_*, OMPI_*, HOROVOD_*, HVD_ELASTIC_* if a client sends them (ssh -o SendEnv=...).
#
# Launcher options that work on this cluster (printed by `status` too)
#   horovodrun -np 4 -H hvde-h1:1,hvde-h2:1,hvde-h3:1,hvde-h4:1 --gloo --network-interface hvde0 python x.py
#       (--network-interface hvde0 is optional: interface discovery finds hvde0 by itself, but skipping discovery
#        saves ~1 s; add --disable-cache after re-creating the cluster: horovodrun caches ssh/interface checks
#        in ~/.horovod for an hour)
#   mpirun --allow-run-as-root -np 4 -H hvde-h1,hvde-h2,hvde-h3,hvde-h4 \
#       --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include 10.213.0.0/24 \
#       --mca oob_tcp_if_include 10.213.0.0/24 --mca mpi_yield_when_idle 1 -x PATH python x.py
#       (OpenMPI 4.1.4 also ran here with none of the --mca options, because a host has only lo and hvde0 and the
#        launcher's other addresses are unreachable from it; they make it deterministic: the *_if_include pin data
#        and control traffic to the bridge subnet, pml ob1 + btl self,tcp keep UCX and shared memory out.)
#       --mca mpi_yield_when_idle 1: the hosts share this machine's cores, and with one slot per host OpenMPI does
#       not see oversubscription, so a rank waiting in MPI would spin and take a core from the others' compute.
#   horovodrun without --gloo builds such an mpirun itself (btl_tcp_if_include hvde0, a name valid everywhere).
#   One scheduler for all hosts: `up` turns the kernel's autogroup off (kernel.sched_autogroup_enabled=0; `down`
#   puts back the value it found).  Each host's jobs arrive through its own sshd, and sshd starts every session in a
#   new session group, which autogroup schedules as one unit: with it on, the hosts' ranks share the 2 cores as four
#   groups, and a few times a second a rank whose group has had its share waits 100-400 ms for a core (and every
#   collective of the job with it), which ranks of one host (one group) do not.  Real hosts have cores of their own;
#   without autogroup the ranks of all hosts compete thread by thread, as the ranks of a one-host job do, so the
#   cluster adds the network and nothing else.
#   A link that dies mid-job (ip link set hvde-hK-br down): Gloo ranks give up after HOROVOD_GLOO_TIMEOUT_SECONDS
#   (default 30 s) and horovodrun ends the job with an error; under mpirun the job hangs (btl tcp has no timeout),
#   so wrap mpirun in `timeout`.
#
# Cleanup
#   `up` on a healthy cluster of the same size/rate/venv does nothing; otherwise it tears down and rebuilds.
#   If `up` fails or is interrupted half way, it runs `down` before exiting.  `down` finds what to remove by name
#   (namespaces hvde-h*, links hvde0 / hvde-h*-br, the two delimited blocks, sshd processes from its pid files) and
#   then kills whatever still runs inside the namespaces (jobs started over ssh), so it works after any failure and
#   twice in a row.  It leaves installed packages (openssh-server) and the key pair under $CACHE (reused by the next
#   `up`; `down --purge` removes $CACHE too).
set -euo pipefail

PROG="ci/cluster.sh"
CACHE="${HVDE_CLUSTER_CACHE:-${HVD_ELASTIC_CACHE:-$HOME/.cache/hvd-elastic}/cluster}"
RUN="$CACHE/run"                      # per-cluster state: sshd configs, pid files, logs, state file
NET="${HVDE_CLUSTER_NET:-10.213.0}"   # first three octets of the /24 the cluster uses
SUBNET="$NET.0/24"
BRIDGE="hvde0"                        # bridge in the root namespace; also the name of each host's interface
IFACE="hvde0"
PREFIX="hvde-h"                       # host K is namespace $PREFIX$K, bridge-side veth $PREFIX$K-br
MAX_HOSTS=200
SSHD=/usr/sbin/sshd
HOSTS_BEGIN="# >>> hvd-elastic cluster (ci/cluster.sh; removed by 'ci/cluster.sh down') >>>"
HOSTS_END="# <<< hvd-elastic cluster <<<"
SSH_HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"   # ssh reads ~/.ssh from the passwd entry, not $HOME
SSH_HOME="${SSH_HOME:-$HOME}"
SSH_CONFIG="$SSH_HOME/.ssh/config"
DEFAULT_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MPI_MCA="--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include $SUBNET --mca oob_tcp_if_include $SUBNET --mca mpi_yield_when_idle 1"

log() { echo "[cluster] $*" >&2; }
die() { echo "$PROG: $*" >&2; exit 1; }   # one line on stderr, non-zero exit

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

host_name() { echo "$PREFIX$1"; }
host_addr() { echo "$NET.$((10 + $1))"; }
host_veth() { echo "$PREFIX$1-br"; }

# --- Preconditions -------------------------------------------------------------------------------------------------
require_root_netns() {
  [ "$(id -u)" = 0 ] || die "must run as root (it creates network namespaces, a bridge and edits /etc/hosts)"
  command -v ip >/dev/null 2>&1 && ip netns list >/dev/null 2>&1 \
    || die "needs iproute2 with 'ip netns' (network namespaces), which is not available here"
  command -v tc >/dev/null 2>&1 || die "needs tc (iproute2) for link shaping"
  command -v unshare >/dev/null 2>&1 || die "needs unshare (util-linux) for per-host UTS namespaces"
}

# Serialize concurrent invocations of this script (up and down both edit shared files).
take_lock() {
  mkdir -p "$CACHE"
  chmod 700 "$CACHE"
  exec 9>"$CACHE/.lock"
  flock 9
}

# --- Delimited blocks in /etc/hosts and ~/.ssh/config --------------------------------------------------------------
# Prints FILE without the block between BEGIN and END (inclusive).
strip_block() {
  awk -v b="$2" -v e="$3" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' "$1"
}

# Rewrites FILE in place (same inode: /etc/hosts may be a bind mount) with CONTENT.
rewrite_in_place() {
  local file="$1" tmp
  tmp="$(mktemp)"
  cat >"$tmp"
  cat "$tmp" >"$file"
  rm -f "$tmp"
}

remove_blocks() {
  if [ -f /etc/hosts ] && grep -qxF "$HOSTS_BEGIN" /etc/hosts; then
    strip_block /etc/hosts "$HOSTS_BEGIN" "$HOSTS_END" | rewrite_in_place /etc/hosts
  fi
  if [ -f "$SSH_CONFIG" ] && grep -qxF "$HOSTS_BEGIN" "$SSH_CONFIG"; then
    strip_block "$SSH_CONFIG" "$HOSTS_BEGIN" "$HOSTS_END" | rewrite_in_place "$SSH_CONFIG"
  fi
  # Undo what `up` created from nothing: an ssh config (now empty) and a ~/.ssh folder (now empty).
  if [ -e "$CACHE/created-ssh-config" ]; then
    [ -f "$SSH_CONFIG" ] && ! grep -q '[^[:space:]]' "$SSH_CONFIG" && rm -f "$SSH_CONFIG"
    rm -f "$CACHE/created-ssh-config"
  fi
  if [ -e "$CACHE/created-ssh-dir" ]; then
    rmdir "$SSH_HOME/.ssh" 2>/dev/null || true
    rm -f "$CACHE/created-ssh-dir"
  fi
}

add_hosts_block() {
  local n="$1" k
  {
    strip_block /etc/hosts "$HOSTS_BEGIN" "$HOSTS_END"
    echo "$HOSTS_BEGIN"
    for k in $(seq 1 "$n"); do echo "$(host_addr "$k") $(host_name "$k")"; done
    echo "$HOSTS_END"
  } | rewrite_in_place /etc/hosts
}

add_ssh_block() {
  if [ ! -d "$SSH_HOME/.ssh" ]; then
    mkdir -m 700 "$SSH_HOME/.ssh"
    touch "$CACHE/created-ssh-dir"
  fi
  if [ ! -e "$SSH_CONFIG" ]; then
    touch "$SSH_CONFIG"
    chmod 600 "$SSH_CONFIG"
    touch "$CACHE/created-ssh-config"
  fi
  # At the top: ssh takes the first value it sees for each option, so a later `Host *` cannot override ours.
  {
    echo "$HOSTS_BEGIN"
    echo "Host $PREFIX* $NET.*"
    echo "    User root"
    echo "    IdentityFile $CACHE/id_ed25519"
    echo "    IdentitiesOnly yes"
    echo "    StrictHostKeyChecking no"
    echo "    UserKnownHostsFile /dev/null"
    echo "    BatchMode yes"
    echo "    LogLevel ERROR"
    echo "    ConnectTimeout 10"
    echo "$HOSTS_END"
    strip_block "$SSH_CONFIG" "$HOSTS_BEGIN" "$HOSTS_END"
  } | rewrite_in_place "$SSH_CONFIG"
}

# --- Rates ---------------------------------------------------------------------------------------------------------
# Prints RATE in bit/s (tc units: bit, kbit, mbit, gbit, tbit, also bps-style kbps/mbps/gbps = bytes), or fails.
rate_bits() {
  local r="${1,,}" num unit
  [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)([a-z]*)$ ]] || return 1
  num="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[3]}"
  case "$unit" in
    ""|bit) awk -v n="$num" 'BEGIN {printf "%.0f\n", n}' ;;
    kbit) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 1e3}' ;;
    mbit) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 1e6}' ;;
    gbit) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 1e9}' ;;
    tbit) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 1e12}' ;;
    bps) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 8}' ;;
    kbps) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 8e3}' ;;
    mbps) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 8e6}' ;;
    gbps) awk -v n="$num" 'BEGIN {printf "%.0f\n", n * 8e9}' ;;
    *) return 1 ;;
  esac
}

# tbf on DEV's egress (run inside a namespace by prefixing NSEXEC).  Bucket: 1 ms worth of tokens, at least 64 KiB
# (a few full-size packets; veth hands tbf 64 KiB GSO packets, which tbf splits when they exceed the bucket).
# Queue: 20 ms at RATE.
shape() {
  local bits="$1" dev="$2"; shift 2
  local burst
  burst=$(( bits / 8 / 1000 ))
  [ "$burst" -ge 65536 ] || burst=65536
  "$@" tc qdisc replace dev "$dev" root tbf rate "$bits"bit burst "$burst" latency 20ms
}

# --- down ----------------------------------------------------------------------------------------------------------
# Kills PIDS with TERM, then KILL after a grace period; only pids that still exist.
kill_pids() {
  local pids=() p
  for p in "$@"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && pids+=("$p"); done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 30); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 1 ] || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

cluster_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" || true
}

do_down() {
  local ns pidf pid link
  # 1. sshd processes, by the pid files this script's sshd configs name.
  for pidf in "$RUN"/*.sshd.pid; do
    [ -e "$pidf" ] || continue
    pid="$(cat "$pidf" 2>/dev/null || true)"
    # Only if that pid is still our sshd (a stale pid file may name a reused pid).
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-f $RUN/"; then
      kill_pids "$pid"
    fi
    rm -f "$pidf"
  done
  # 2. Whatever else still runs inside the host namespaces (jobs started over ssh, orphans of a failed up).
  #    Deleting a namespace does not stop them, and they would keep the namespace alive.
  for ns in $(cluster_namespaces); do
    # shellcheck disable=SC2046
    kill_pids $(ip netns pids "$ns" 2>/dev/null || true)
  done
  # 3. Links: the bridge-side veths (deleting one end deletes the pair), then the bridge, qdiscs go with them.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}[0-9]+-br$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1 && [ "$(cat "/sys/class/net/$BRIDGE/bridge/bridge_id" 2>/dev/null)" != "" ]; then
    ip link del "$BRIDGE"
  fi
  # 4. Namespaces.
  for ns in $(cluster_namespaces); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # 5. /etc/hosts and ~/.ssh/config blocks.
  remove_blocks
  # 6. The sshd privilege-separation folder, if `up` made it (and it is still empty).
  if [ -e "$CACHE/created-run-sshd" ]; then
    rmdir /run/sshd 2>/dev/null || true
    rm -f "$CACHE/created-run-sshd"
  fi
  rm -rf "$RUN"
  # 7. The kernel's autogroup setting, if `up` changed it (scheduler_autogroup).
  if [ -e "$CACHE/autogroup-was" ]; then
    sysctl -qw "kernel.sched_autogroup_enabled=$(cat "$CACHE/autogroup-was")" 2>/dev/null || true
    rm -f "$CACHE/autogroup-was"
  fi
  # 8. /run/netns, if `up` made it: the first `ip netns add` creates it as a bind mount of itself.  Only when no
  #    namespace (ours or anyone's) is left in it.
  if [ -e "$CACHE/created-run-netns" ]; then
    if [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
      while mountpoint -q /run/netns; do umount /run/netns || break; done
      rmdir /run/netns 2>/dev/null || true
    fi
    rm -f "$CACHE/created-run-netns"
  fi
}

# --- up ------------------------------------------------------------------------------------------------------------
ensure_sshd() {
  [ -x "$SSHD" ] && return 0
  log "installing openssh-server (apt-get, non-interactive)"
  command -v apt-get >/dev/null 2>&1 || die "no $SSHD and no apt-get to install openssh-server"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server \
    >"$CACHE/apt.log" 2>&1 || die "apt-get install openssh-server failed; see $CACHE/apt.log"
  [ -x "$SSHD" ] || die "openssh-server installed but $SSHD is missing"
}

ensure_keys() {
  [ -f "$CACHE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C "hvd-elastic cluster" -f "$CACHE/id_ed25519"
  [ -f "$CACHE/ssh_host_ed25519_key" ] \
    || ssh-keygen -q -t ed25519 -N "" -C "hvd-elastic cluster host" -f "$CACHE/ssh_host_ed25519_key"
  cp "$CACHE/id_ed25519.pub" "$CACHE/authorized_keys"
  chmod 600 "$CACHE/id_ed25519" "$CACHE/ssh_host_ed25519_key" "$CACHE/authorized_keys"
}

write_sshd_config() {
  local k="$1" venv="$2" path="$DEFAULT_PATH"
  [ -z "$venv" ] || path="$venv/bin:$DEFAULT_PATH"
  cat >"$RUN/$(host_name "$k").sshd_config" <<EOF
# sshd of cluster host $(host_name "$k") (made by $PROG up; removed by $PROG down)
ListenAddress $(host_addr "$k"):22
AddressFamily inet
HostKey $CACHE/ssh_host_ed25519_key
PidFile $RUN/$(host_name "$k").sshd.pid
AuthorizedKeysFile $CACHE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
# horovodrun and mpirun open many sessions at once
MaxStartups 200:30:400
MaxSessions 200
# sshd resets PATH for every session (and overrides a PATH the client sends): put the venv first here.
SetEnv PATH=$path
AcceptEnv LANG LC_* OMPI_* HOROVOD_* HVD_ELASTIC_*
Subsystem sftp internal-sftp
EOF
}

# Starts sshd for host K in its network namespace and a new UTS namespace with hostname hvde-hK.  sshd daemonizes
# (no -D), so this returns once it listens, with its pid in the pid file.
start_sshd() {
  local k="$1" name
  name="$(host_name "$k")"
  "$SSHD" -t -f "$RUN/$name.sshd_config"
  ip netns exec "$name" unshare --uts sh -c \
    "hostname '$name' && exec '$SSHD' -f '$RUN/$name.sshd_config' -E '$RUN/$name.sshd.log'" </dev/null
}

wait_ssh() {
  local k="$1" name
  name="$(host_name "$k")"
  for _ in $(seq 1 50); do
    [ "$(ssh -o ConnectTimeout=2 "$name" hostname 2>/dev/null)" = "$name" ] && return 0
    sleep 0.2
  done
  die "sshd of $name does not answer with hostname $name; see $RUN/$name.sshd.log"
}

cluster_healthy() {
  local n="$1" k
  for k in $(seq 1 "$n"); do
    [ "$(ssh -o ConnectTimeout=2 "$(host_name "$k")" hostname 2>/dev/null)" = "$(host_name "$k")" ] || return 1
  done
  [ "$(cluster_namespaces | wc -l)" = "$n" ]
}

# Fails if SUBNET is already in use by something other than this cluster (a route on another device).
check_subnet_free() {
  local other
  other="$(ip -4 route show to match "$NET.1" 2>/dev/null | grep -v "^default" | grep -v " dev $BRIDGE " || true)"
  [ -z "$other" ] || die "subnet $SUBNET is already routed here ($other); set HVDE_CLUSTER_NET=a.b.c to another /24"
}

# Autogroup off while the cluster is up (header, "One scheduler for all hosts"); the value found is kept for `down`.
scheduler_autogroup() {
  local knob=/proc/sys/kernel/sched_autogroup_enabled
  [ -w "$knob" ] || return 0
  if [ "$(cat "$knob")" != 0 ]; then
    [ -e "$CACHE/autogroup-was" ] || cat "$knob" >"$CACHE/autogroup-was"
    echo 0 >"$knob"
  fi
}

do_up() {
  local n="$1" rate="$2" venv="$3" bits="" k name addr veth want
  want="n=$n rate=${rate:-none} venv=$venv net=$NET"
  if [ -f "$RUN/state" ] && [ "$(cat "$RUN/state")" = "$want" ] && cluster_healthy "$n"; then
    scheduler_autogroup
    log "cluster already up ($want)"
    return 0
  fi
  if [ -n "$(cluster_namespaces)" ] || ip link show "$BRIDGE" >/dev/null 2>&1 || [ -d "$RUN" ]; then
    log "removing the existing cluster first"
    do_down
  fi
  check_subnet_free
  if [ -n "$rate" ]; then bits="$(rate_bits "$rate")"; fi

  # From here on, any failure (or Ctrl-C) tears everything down again.
  trap 'rc=$?; trap - EXIT INT TERM; if [ "$rc" != 0 ]; then log "up failed (exit $rc); cleaning up"; do_down; fi; exit "$rc"' EXIT
  trap 'exit 130' INT TERM

  ensure_sshd
  mkdir -p "$RUN"
  chmod 700 "$RUN"
  ensure_keys
  if [ ! -d /run/sshd ]; then
    mkdir -m 755 /run/sshd
    touch "$CACHE/created-run-sshd"
  fi

  [ -e /run/netns ] || touch "$CACHE/created-run-netns"
  scheduler_autogroup

  # The bridge in the root namespace, with the launcher's address.
  ip link add "$BRIDGE" type bridge
  sysctl -qw "net.ipv6.conf.$BRIDGE.disable_ipv6=1" 2>/dev/null || true
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up

  for k in $(seq 1 "$n"); do
    name="$(host_name "$k")"; addr="$(host_addr "$k")"; veth="$(host_veth "$k")"
    ip netns add "$name"
    ip link add "$veth" type veth peer name "$IFACE" netns "$name"
    sysctl -qw "net.ipv6.conf.$veth.disable_ipv6=1" 2>/dev/null || true
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    ip netns exec "$name" sysctl -qw "net.ipv6.conf.$IFACE.disable_ipv6=1" 2>/dev/null || true
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev "$IFACE"
    ip -n "$name" link set "$IFACE" up
    if [ -n "$bits" ]; then
      shape "$bits" "$veth"                                  # bridge -> host
      shape "$bits" "$IFACE" ip netns exec "$name"           # host -> bridge
    fi
  done

  add_hosts_block "$n"
  add_ssh_block
  for k in $(seq 1 "$n"); do
    write_sshd_config "$k" "$venv"
    start_sshd "$k"
  done
  for k in $(seq 1 "$n"); do wait_ssh "$k"; done
  echo "$want" >"$RUN/state"

  trap - EXIT INT TERM
  log "up: $n hosts $(host_name 1)..$(host_name "$n") on $SUBNET, rate ${rate:-unshaped}${venv:+, PATH starts with $venv/bin}"
}

# --- status --------------------------------------------------------------------------------------------------------
do_status() {
  local ns k name addr veth rate ssh_ok
  if [ -z "$(cluster_namespaces)" ]; then
    echo "cluster: down"
    return 0
  fi
  echo "cluster: ${PREFIX}* on $SUBNET, launcher address $NET.1 on bridge $BRIDGE ($(cat "$RUN/state" 2>/dev/null || echo 'no state file'))"
  printf '%-10s %-14s %-16s %-10s %s\n' HOST ADDRESS VETH RATE SSHD
  for ns in $(cluster_namespaces | sort -V); do
    k="${ns#"$PREFIX"}"; name="$ns"; addr="$(host_addr "$k")"; veth="$(host_veth "$k")"
    rate="$(tc qdisc show dev "$veth" 2>/dev/null | awk '/tbf/ {for (i = 1; i <= NF; i++) if ($i == "rate") print $(i + 1)}')"
    ssh_ok="$(ssh -o ConnectTimeout=2 "$name" hostname 2>/dev/null || true)"
    [ "$ssh_ok" = "$name" ] && ssh_ok="answers (hostname $ssh_ok)" || ssh_ok="NOT answering"
    printf '%-10s %-14s %-16s %-10s %s\n' "$name" "$addr" "$veth" "${rate:-unshaped}" "$ssh_ok"
  done
  local hosts hslots venv_note
  venv_note="$(sed -n 's/^SetEnv PATH=//p' "$RUN/${PREFIX}1.sshd_config" 2>/dev/null || true)"
  hosts="$(cluster_namespaces | sort -V | paste -sd, -)"
  hslots="$(cluster_namespaces | sort -V | sed 's/$/:1/' | paste -sd, -)"
  echo "scheduler: kernel.sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo n/a)" \
    "(up sets 0; down restores $(cat "$CACHE/autogroup-was" 2>/dev/null || echo 'nothing: unchanged'))"
  echo
  echo "launch (venv bin first on PATH, OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1):"
  echo "  horovodrun -np $(cluster_namespaces | wc -l) -H $hslots --gloo --network-interface $IFACE python x.py"
  echo "  mpirun --allow-run-as-root -np $(cluster_namespaces | wc -l) -H $hosts $MPI_MCA -x PATH python x.py"
  echo "  (ssh sessions start with PATH=${venv_note}; ~/.bashrc may prepend more: launchers pass PATH explicitly)"
}

# --- check ---------------------------------------------------------------------------------------------------------
# Sum of rx+tx bytes over the bridge-side veths.
veth_bytes() {
  local total=0 f
  for f in /sys/class/net/"$PREFIX"*-br/statistics/{rx,tx}_bytes; do
    [ -e "$f" ] && total=$(( total + $(cat "$f") ))
  done
  echo "$total"
}

do_check() {
  local mb="${1:-100}" n hosts hslots py before after rc=0
  [ -n "$(cluster_namespaces)" ] || die "cluster is down; run '$PROG up N' first"
  py="$(command -v python || true)"
  [ -n "$py" ] && "$py" -c 'import horovod.torch' 2>/dev/null \
    || die "python on PATH cannot import horovod.torch; put the venv's bin first on PATH"
  n="$(cluster_namespaces | wc -l)"
  hosts="$(cluster_namespaces | sort -V | paste -sd, -)"
  hslots="$(cluster_namespaces | sort -V | sed 's/$/:1/' | paste -sd, -)"
  mkdir -p "$RUN"
  cat >"$RUN/check.py" <<'EOF'
# Written by ci/cluster.sh check: rank/host, a 10 MB allreduce (checked), then a timed allreduce of MB megabytes.
import socket, sys, time
import torch
import horovod.torch as hvd
hvd.init()
mb = float(sys.argv[1])
x = torch.full((10 * 2**20 // 4,), float(hvd.rank() + 1))
y = hvd.allreduce(x, op=hvd.Sum, name="check10")
expect = hvd.size() * (hvd.size() + 1) / 2
ok = bool(torch.all(y == expect))
names = hvd.allgather_object(socket.gethostname())
print(f"rank {hvd.rank()}/{hvd.size()} on {socket.gethostname()}: 10 MB allreduce {'ok' if ok else 'WRONG'}",
      flush=True)
big = torch.ones(int(mb * 2**20 // 4))
hvd.allreduce(big, name="warm")
times = []
for i in range(3):
    t = time.perf_counter()
    hvd.allreduce(big, name=f"big{i}")
    times.append(time.perf_counter() - t)
if hvd.rank() == 0:
    n = hvd.size()
    best = min(times)
    sent = 2 * (n - 1) / n * mb * 2**20  # bytes each rank sends in a ring allreduce
    print(f"hosts {sorted(set(names))} distinct={len(set(names)) == n}")
    print(f"{mb:g} MB allreduce x3: {', '.join(f'{t:.3f}' for t in times)} s; best {best:.3f} s "
          f"= {sent * 8 / best / 1e9:.2f} Gbit/s per rank (ring bytes)", flush=True)
sys.exit(0 if ok and len(set(names)) == hvd.size() else 1)
EOF
  echo "== horovodrun --gloo on $hosts"
  before="$(veth_bytes)"
  horovodrun -np "$n" -H "$hslots" --gloo --network-interface "$IFACE" --disable-cache \
    "$py" "$RUN/check.py" "$mb" || rc=1
  after="$(veth_bytes)"
  echo "veth bytes: $(( (after - before) / 1048576 )) MiB rx+tx over all host links, ~$(( (after - before) / 2 / n / 1048576 )) MiB each way per host"
  echo "== mpirun on $hosts"
  before="$(veth_bytes)"
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root -np "$n" -H "$hosts" $MPI_MCA -x PATH ${PYTHONPATH:+-x PYTHONPATH} \
    "$py" "$RUN/check.py" "$mb" || rc=1
  after="$(veth_bytes)"
  echo "veth bytes: $(( (after - before) / 1048576 )) MiB rx+tx over all host links, ~$(( (after - before) / 2 / n / 1048576 )) MiB each way per host"
  return "$rc"
}

# --- main ----------------------------------------------------------------------------------------------------------
main() {
  [ $# -ge 1 ] || usage
  local cmd="$1"; shift
  case "$cmd" in
    up)
      local n="" rate="" venv="${HVDE_VENV:-}"
      while [ $# -gt 0 ]; do
        case "$1" in
          --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 1gbit)"; rate="$2"; shift 2 ;;
          --rate=*) rate="${1#--rate=}"; shift ;;
          --venv) [ $# -ge 2 ] || die "--venv needs a folder"; venv="$2"; shift 2 ;;
          --venv=*) venv="${1#--venv=}"; shift ;;
          -h|--help) usage ;;
          *) [ -z "$n" ] || die "unexpected argument: $1"; n="$1"; shift ;;
        esac
      done
      [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "$MAX_HOSTS" ] \
        || die "up needs a host count between 1 and $MAX_HOSTS (got '${n}')"
      case "${rate,,}" in none|unshaped|0) rate="" ;; esac
      [ -z "$rate" ] || rate_bits "$rate" >/dev/null || die "bad --rate '$rate' (tc syntax, e.g. 1gbit, 500mbit)"
      [ -z "$venv" ] || [ -d "$venv/bin" ] || die "--venv $venv has no bin folder"
      [ -z "$venv" ] || venv="$(cd "$venv" && pwd)"
      [[ "$NET" =~ ^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){2}$ ]] \
        || die "HVDE_CLUSTER_NET must be the first three octets of a /24, like 10.213.0 (got '$NET')"
      require_root_netns
      take_lock
      do_up "$n" "$rate" "$venv"
      ;;
    down)
      local purge=0
      case "${1:-}" in --purge) purge=1 ;; "") ;; *) die "unexpected argument: $1" ;; esac
      require_root_netns
      take_lock
      do_down
      if [ "$purge" = 1 ]; then rm -rf "$CACHE"; fi
      log "down"
      ;;
    status) require_root_netns; do_status ;;
    check) require_root_netns; do_check "$@" ;;
    -h|--help|help) usage ;;
    *) die "unknown command '$cmd' (up N [--rate RATE] [--venv DIR] | down [--purge] | status | check [MB])" ;;
  esac
}

main "$@"
