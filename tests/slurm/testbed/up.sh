#!/usr/bin/env bash
# up.sh - start a small but real SLURM cluster on this one machine (Debian bookworm, root).
#
# One slurmctld plus STB_NODES slurmd daemons, each started in its own UTS namespace
# (so `hostname` in a job says node1, node2, ...), node I listening on 127.0.1.I and its
# own port, fake gres GPUs (character devices cloned from /dev/null) so SLURM exports
# CUDA_VISIBLE_DEVICES & co. per task exactly as on a real GPU cluster. No accounting.
#
# Settings (environment, all optional):
#   STB_STATE      state dir, wiped on start   (default: /tmp/exatrain-slurm-testbed)
#   STB_NODES=2  STB_CPUS=2  STB_MEM_MB=4000  STB_GPUS=4 (per node, 0 = no gres)
#   STB_CTLD_PORT=16817  STB_NODE_PORT0=17101 (node I uses STB_NODE_PORT0+I-1)
#   STB_REPLACE=1  also stop a testbed still running from ANOTHER state dir
#   STB_SITES=1    also start the site-shaped nodes and partitions of sites.conf (LUMI-G, JUWELS Booster,
#                  JURECA-DC, a generic GPU cluster): hardware counts declared, for sbatch --test-only
#                  (the pytest fixture sets it: it holds a lock, so any other one is stale)
# Exit status: 0 ready, 2 this machine cannot host the testbed (not root, no UTS
# namespaces, packages cannot be installed, no mknod), 1 anything else.
# Afterwards: export SLURM_CONF=$STB_STATE/etc/slurm.conf; sinfo/srun/sbatch. Stop: down.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${STB_STATE:-/tmp/exatrain-slurm-testbed}
NODES=${STB_NODES:-2}
CPUS=${STB_CPUS:-2}
MEM=${STB_MEM_MB:-4000}
GPUS=${STB_GPUS:-4}
CTLD_PORT=${STB_CTLD_PORT:-16817}
NODE_PORT0=${STB_NODE_PORT0:-17101}
SITES=${STB_SITES:-0}
REGISTRY=/run/exatrain-slurm-testbed.state   # state dir of the testbed started last

T0=$(date +%s%N)
say() { local ms=$((($(date +%s%N) - T0) / 1000000)); printf '[up.sh %3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
die() { echo "up.sh: ERROR: $*" >&2; exit 1; }
cannot() { echo "up.sh: CANNOT RUN HERE: $*" >&2; exit 2; }
listening() { # listening <port>: some socket listens on TCP <port> (no need for ss/iproute2)
  local p; p=$(printf ':%04X' "$1")
  awk -v p="$p" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
wait_for() { # wait_for <seconds> <what> <command...>
  local t=$1 what=$2; shift 2
  for ((k = 0; k < t * 5; k++)); do "$@" && return 0; sleep 0.2; done
  echo "up.sh: timed out waiting for $what; last log lines:" >&2
  tail -n 15 "$STATE"/log/*.log >&2 2>/dev/null || true
  die "timed out waiting for $what (logs: $STATE/log)"
}

# ---- 0. can this machine do it at all? -------------------------------------------------
[ "$(id -u)" = 0 ] || cannot "must run as root (starts daemons, edits /etc/hosts)"
[[ "$STATE" == /*/* ]] || die "STB_STATE must be an absolute path at least two levels deep (it gets wiped)"
[[ "$NODES" =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 200)) || die "STB_NODES must be 1..200"
[[ "$GPUS" =~ ^[0-9]+$ ]] || die "STB_GPUS must be a number"

# Site-shaped nodes (sites.conf): node J of them is 127.0.1.(200+J) on port NODE_PORT0+NODES+J-1.
SITE_NODES=()      # names: lumi1 lumi2 jwb1 ...
SITE_LINES=""      # NodeName lines, then the partitions, for slurm.conf
SITE_GRES=""       # gres.conf lines
SITE_GPUS=0        # most GPUs of any site node (device files to create)
if [ "$SITES" = 1 ]; then
  while read -r kind prefix count gpus attrs; do
    [ "$kind" = NODE ] || continue
    range="$prefix[1-$count]"; ((count == 1)) && range="${prefix}1"
    for ((k = 1; k <= count; k++)); do
      j=$((${#SITE_NODES[@]} + 1))
      SITE_NODES+=("$prefix$k")
      SITE_LINES+="NodeName=$prefix$k NodeAddr=127.0.1.$((200 + j)) Port=$((NODE_PORT0 + NODES + j - 1)) $attrs"
      ((gpus > 0)) && SITE_LINES+=" Gres=gpu:$gpus"
      SITE_LINES+=$' State=UNKNOWN\n'
    done
    if ((gpus > 0)); then
      files="@STATE@/dev/site-gpu0"; ((gpus > 1)) && files="@STATE@/dev/site-gpu[0-$((gpus - 1))]"
      SITE_GRES+="NodeName=$range Name=gpu File=$files"$'\n'
      ((gpus > SITE_GPUS)) && SITE_GPUS=$gpus
    fi
  done < "$HERE/sites.conf"
  SITE_LINES+=$(grep -v -e '^NODE ' -e '^#' -e '^[[:space:]]*$' "$HERE/sites.conf")
  ((${#SITE_NODES[@]} <= 50)) || die "sites.conf declares more than 50 nodes"
fi
ALL_NODES=$((NODES + ${#SITE_NODES[@]}))
command -v unshare >/dev/null || cannot "unshare (util-linux) is missing"
unshare --uts true 2>/dev/null || cannot "unshare --uts fails (no CAP_SYS_ADMIN?): nodes could not have their own hostnames"

# ---- 1. leftovers of an earlier run (crashed session, forgotten down.sh) ---------------
has_pids() { compgen -G "$1/run/*.pid" >/dev/null; }
alive_in() { # alive_in <state dir>: prints "comm(pid)" of daemons still running from it
  local f pid comm
  for f in "$1"/run/*.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f"); comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null && continue   # zombie
    case "$comm" in slurmctld | slurmd | munged) printf '%s(%s) ' "$comm" "$pid" ;; esac
  done
}
others=""; [ -s "$REGISTRY" ] && others=$(cat "$REGISTRY")
for dir in "$STATE" $others; do
  [ -d "$dir/run" ] && has_pids "$dir" || continue
  live=$(alive_in "$dir")
  if [ -n "$live" ] && [ "$dir" != "$STATE" ] && [ "${STB_REPLACE:-0}" != 1 ]; then
    die "another testbed is still running from $dir ($live). Stop it: STB_STATE=$dir $HERE/down.sh (or set STB_REPLACE=1)"
  fi
  say "cleaning up a testbed left over in $dir ${live:+(still running: $live)}"
  STB_STATE=$dir "$HERE/down.sh" | sed 's/^/    /'
done
for dir in "$STATE" $others; do
  live=$(alive_in "$dir" 2>/dev/null || true)
  [ -z "$live" ] || die "could not stop $live from $dir"
done

# ---- 2. packages (fast no-op when present) ---------------------------------------------
PKGS="munge slurmctld slurmd slurm-client"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  command -v apt-get >/dev/null || cannot "packages missing:$missing, and no apt-get"
  say "installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || cannot "apt-get update failed (no network?); missing:$missing"
  apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
    cannot "apt-get install$missing failed"
fi
say "packages ready (slurm $(dpkg-query -W -f='${Version}' slurmctld))"

for p in "$CTLD_PORT" $(seq "$NODE_PORT0" $((NODE_PORT0 + ALL_NODES - 1))); do
  if listening "$p"; then
    who=$(command -v ss >/dev/null && ss -Hltnp "sport = :$p" | head -n 1)
    die "TCP port $p is already in use${who:+: $who}. Pick others with STB_CTLD_PORT / STB_NODE_PORT0"
  fi
done

# ---- 3. state dir, fake GPUs, configs, /etc/hosts --------------------------------------
rm -rf "$STATE"
mkdir -p "$STATE"/{etc,log,run,dev,spool/ctld}
for i in $(seq 1 "$NODES"); do mkdir -p "$STATE/spool/node$i"; done
for n in "${SITE_NODES[@]}"; do mkdir -p "$STATE/spool/$n"; done
chmod 755 "$STATE"
chown slurm:slurm "$STATE"/{log,run,spool/ctld}
runuser -u slurm -- test -w "$STATE/run" ||
  die "user slurm cannot reach $STATE (a parent directory is not world-executable?); use another STB_STATE"
echo "$STATE" > "$REGISTRY"

for ((g = 0; g < GPUS; g++)); do   # SLURM insists on a character device per GPU
  mknod -m 666 "$STATE/dev/nvidia$g" c 1 3 2>/dev/null ||
    cannot "mknod failed: no fake GPUs possible (set STB_GPUS=0 to run without them)"
done
for ((g = 0; g < SITE_GPUS; g++)); do
  mknod -m 666 "$STATE/dev/site-gpu$g" c 1 3 2>/dev/null || cannot "mknod failed: no fake GPUs for the site nodes"
done

NODE_LIST="node[1-$NODES]"; [ "$NODES" = 1 ] && NODE_LIST=node1
NODE_LINES=""
for i in $(seq 1 "$NODES"); do
  NODE_LINES+="NodeName=node$i NodeAddr=127.0.1.$i Port=$((NODE_PORT0 + i - 1)) CPUs=$CPUS RealMemory=$MEM"
  ((GPUS > 0)) && NODE_LINES+=" Gres=gpu:$GPUS"
  NODE_LINES+=$' State=UNKNOWN\n'
done
GRES_TYPES=""; ((GPUS > 0 || SITE_GPUS > 0)) && GRES_TYPES="GresTypes=gpu"
conf=$(<"$HERE/slurm.conf.template")
conf=${conf//@STATE@/$STATE}; conf=${conf//@CTLD_PORT@/$CTLD_PORT}; conf=${conf//@NODE_LIST@/$NODE_LIST}
conf=${conf//@NODE_LINES@/$NODE_LINES}; conf=${conf//@GRES_TYPES@/$GRES_TYPES}
conf=${conf//@SITE_LINES@/${SITE_LINES//@STATE@/$STATE}}
printf '%s\n' "$conf" > "$STATE/etc/slurm.conf"
if ((GPUS > 0 || SITE_GPUS > 0)); then   # gres.conf is looked up next to slurm.conf
  echo AutoDetect=off > "$STATE/etc/gres.conf"
  if ((GPUS > 0)); then
    files="$STATE/dev/nvidia0"; ((GPUS > 1)) && files="$STATE/dev/nvidia[0-$((GPUS - 1))]"
    printf 'NodeName=%s Name=gpu File=%s\n' "$NODE_LIST" "$files" >> "$STATE/etc/gres.conf"
  fi
  printf '%s' "${SITE_GRES//@STATE@/$STATE}" >> "$STATE/etc/gres.conf"
fi
export SLURM_CONF=$STATE/etc/slurm.conf
echo "$NODES" > "$STATE/run/nodes"
echo "$GPUS" > "$STATE/run/gpus"
echo "$CPUS" > "$STATE/run/cpus"
echo "${SITE_NODES[*]}" > "$STATE/run/site_nodes"

# nodeI -> 127.0.1.I. Rewritten in place (not renamed): a bind-mounted /etc/hosts works too.
{
  sed '/^# BEGIN exatrain-slurm-testbed/,/^# END exatrain-slurm-testbed/d' /etc/hosts
  echo "# BEGIN exatrain-slurm-testbed ($STATE)"
  for i in $(seq 1 "$NODES"); do echo "127.0.1.$i node$i"; done
  for j in "${!SITE_NODES[@]}"; do echo "127.0.1.$((201 + j)) ${SITE_NODES[$j]}"; done
  echo "127.0.1.254 slurmctl"
  echo "# END exatrain-slurm-testbed"
} > "$STATE/run/hosts.new"
cat "$STATE/run/hosts.new" > /etc/hosts
say "configs in $STATE/etc"

# ---- 4. munge (no systemd here: start it by hand unless one already works) -------------
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munged already running; using it"
else
  [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1
  wait_for 10 munged sh -c 'munge -n | unmunge >/dev/null 2>&1'
  cp /run/munge/munged.pid "$STATE/run/munged.pid"   # ours: down.sh stops it
  say "munged started (pid $(cat /run/munge/munged.pid))"
fi

# ---- 5. slurmctld and the slurmds, each in its own UTS namespace -----------------------
# The daemons fork into the background themselves; stdio goes to /dev/null so nothing
# (pytest's capture pipes included) waits on them.
in_uts() { # in_uts <hostname> <command...>
  unshare --uts sh -c 'hostname "$0" && exec "$@"' "$@" </dev/null >/dev/null 2>&1
}
: > "$STATE/run/uts"
remember_ns() { echo "$(readlink "/proc/$(cat "$1")/ns/uts") $2" >> "$STATE/run/uts"; }

in_uts slurmctl slurmctld
wait_for 30 "slurmctld on port $CTLD_PORT" listening "$CTLD_PORT"
wait_for 10 "slurmctld pid file" test -s "$STATE/run/slurmctld.pid"
remember_ns "$STATE/run/slurmctld.pid" slurmctl
NAMES=($(seq -f 'node%g' 1 "$NODES") "${SITE_NODES[@]}")
for n in "${NAMES[@]}"; do in_uts "$n" slurmd -N "$n"; done
for n in "${NAMES[@]}"; do
  wait_for 30 "slurmd $n" test -s "$STATE/run/slurmd-$n.pid"
  remember_ns "$STATE/run/slurmd-$n.pid" "$n"
done
say "daemons started"

all_idle() { [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -ge "$ALL_NODES" ]; }
wait_for 60 "$ALL_NODES idle nodes" all_idle
say "ready: $NODES nodes x $CPUS CPUs x $GPUS fake GPUs${SITE_NODES[*]:+, site-shaped nodes ${SITE_NODES[*]}}"
sinfo
echo "export SLURM_CONF=$SLURM_CONF    # stop with: STB_STATE=$STATE $HERE/down.sh"
