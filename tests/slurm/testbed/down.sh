#!/usr/bin/env bash
# down.sh - stop the testbed that up.sh started from STB_STATE, and undo its changes.
# Signals only processes up.sh started: those named in its pid files, and whatever still
# runs inside the UTS namespaces it created (job steps, escaped job processes). Removes the site
# twins' network namespaces and bridges it created.
# Safe to run twice, or on a testbed whose daemons already died.
#   STB_STATE (default /tmp/exatrain-slurm-testbed); --purge also deletes the state dir.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${STB_STATE:-/tmp/exatrain-slurm-testbed}
REGISTRY=/run/exatrain-slurm-testbed.state
export SLURM_CONF=$STATE/etc/slurm.conf

remove_hosts_block() { # only if it was written for this state dir
  grep -qF "# BEGIN exatrain-slurm-testbed ($STATE)" /etc/hosts 2>/dev/null || return 0
  local kept; kept=$(sed '/^# BEGIN exatrain-slurm-testbed/,/^# END exatrain-slurm-testbed/d' /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts   # in place: /etc/hosts may be a bind mount
  echo "removed the /etc/hosts block"
}

if [ ! -d "$STATE/run" ]; then
  remove_hosts_block
  echo "down.sh: nothing to stop ($STATE/run does not exist)"; exit 0
fi

alive() { # alive <pid> <comm>: running (zombies do not count) and called <comm>
  [ -n "$1" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] &&
    ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
stop() { # stop <pid file> <comm>: TERM, up to 10 s, then KILL
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  alive "$pid" "$2" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do alive "$pid" "$2" || { echo "stopped $2 ($pid)"; return 0; }; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null; echo "killed $2 ($pid)"
}

# 1. cancel jobs, give them KillWait (5 s) to go
if [ -s "$STATE/run/slurmctld.pid" ] && alive "$(cat "$STATE/run/slurmctld.pid")" slurmctld; then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# 2. the controller first (so it does not keep retrying dead slurmds), then the slurmds
stop "$STATE/run/slurmctld.pid" slurmctld
for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done

# 3. anything left in our UTS namespaces: slurmstepd, job processes that escaped their
#    process group, slurmctld's slurmscriptd
if [ -s "$STATE/run/uts" ]; then
  declare -A ours=()
  while read -r ns name; do [ -n "$ns" ] && ours[$ns]=$name; done < "$STATE/run/uts"
  for p in /proc/[0-9]*; do
    ns=$(readlink "$p/ns/uts" 2>/dev/null) || continue
    [ -n "${ours[$ns]:-}" ] || continue
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    # namespace ids can be reused once ours are gone: check the hostname as well
    [ "$(nsenter -t "$pid" -u hostname 2>/dev/null)" = "${ours[$ns]}" ] || continue
    echo "killing leftover $(cat "$p/comm" 2>/dev/null) ($pid) on ${ours[$ns]}"
    kill -KILL "$pid" 2>/dev/null
  done
fi

# 3b. the site twins' network namespaces (their veth pairs go with them) and bridges
if [ -s "$STATE/run/netns" ]; then
  while read -r ns; do
    [[ "$ns" == stb-* ]] && ip netns del "$ns" 2>/dev/null && echo "removed network namespace $ns"
  done < "$STATE/run/netns"
  for br in stbmgmt stbhsn stbib; do ip link del "$br" 2>/dev/null && echo "removed bridge $br"; done
  : > "$STATE/run/netns"
fi

# 3c. accounting (STB_ACCOUNTING=1): slurmdbd, then its database
stop "$STATE/run/slurmdbd.pid" slurmdbd
stop "$STATE/run/mariadbd.pid" mariadbd

# 4. munged, if up.sh started it (one that was already running is left alone)
stop "$STATE/run/munged.pid" munged

# 5. /etc/hosts block, pid files, registry
remove_hosts_block
rm -f "$STATE"/run/*.pid
[ "$(cat "$REGISTRY" 2>/dev/null)" = "$STATE" ] && rm -f "$REGISTRY"
if [ "${1:-}" = "--purge" ] && [[ "$STATE" == /*/* ]]; then
  rm -rf "$STATE" && echo "removed $STATE"
fi
echo "testbed down ($STATE)"
