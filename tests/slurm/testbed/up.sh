#!/usr/bin/env bash
# up.sh - start a small but real SLURM cluster on this one machine (Debian bookworm, root).
#
# One slurmctld plus STB_NODES slurmd daemons, each started in its own UTS namespace
# (so `hostname` in a job says node1, node2, ...), node I listening on 127.0.1.I and its
# own port, fake gres GPUs (character devices cloned from /dev/null) so SLURM exports
# CUDA_VISIBLE_DEVICES & co. per task exactly as on a real GPU cluster. Optional accounting (slurmdbd
# on a private MariaDB), so sacct works and slurmctld checks QOS names as a site does.
#
# Settings (environment, all optional):
#   STB_STATE      state dir, wiped on start   (default: /tmp/exatrain-slurm-testbed)
#   STB_NODES=2  STB_CPUS=2  STB_MEM_MB=4000  STB_GPUS=4 (per node, 0 = no gres)
#   STB_CTLD_PORT=16817  STB_NODE_PORT0=17101 (node I uses STB_NODE_PORT0+I-1)
#   STB_REPLACE=1  also stop a testbed still running from ANOTHER state dir
#   STB_SITES=1    also start the site-shaped nodes and partitions of sites.conf (LUMI-G, JUWELS Booster,
#                  JURECA-DC, a generic GPU cluster): hardware counts declared, for sbatch --test-only; the
#                  site twins among them (LUMI-G, JUWELS Booster, generic) each in a network namespace of
#                  its own with the site's interfaces and host names (step 4b)
#                  (the pytest fixture sets it: it holds a lock, so any other one is stale)
#   STB_TWINS=0    the site-shaped nodes without networks of their own (no site twins)
#   STB_SRUN_PORT0=17501  srun's ports where site twins run (SrunPortRange, 1000 ports)
#   STB_ACCOUNTING=1  also start a private MariaDB (STB_DB_PORT=16306, data in the state dir) and slurmdbd
#                  (STB_DBD_PORT=16819); without it slurmctld has no accounting (the default, 0)
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
SRUN_PORT0=${STB_SRUN_PORT0:-17501}
SITES=${STB_SITES:-0}
ACCT=${STB_ACCOUNTING:-0}
DBD_PORT=${STB_DBD_PORT:-16819}
DB_PORT=${STB_DB_PORT:-16306}
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

# Site-shaped nodes (sites.conf): node J of them listens on port NODE_PORT0+NODES+J-1, at 127.0.1.(200+J), or,
# for a site twin, at its management address $TWIN_NET.0.J (a network namespace of its own, step 4b).
SITE_NODES=()      # names: nid005001 nid005002 jwb0001 ...
SITE_NETS=()       # their networks: lumi, jsc, eth (site twins) or none
SITE_LINES=""      # NodeName lines, then the partitions, for slurm.conf
SITE_GRES=""       # gres.conf lines
SITE_GPUS=0        # most GPUs of any site node (device files to create)
TWIN_NET=10.77     # management network 10.77.0.0/24 (bridge stbmgmt, the controller at .254); hsnK of LUMI
                   # twin J is 10.78.K.J (bridge stbhsn), ib0 of JSC twin J 10.79.0.J (bridge stbib)
CTLD_ADDR=127.0.0.1
node_addr() { # node_addr <J> <network>: where slurmctld reaches site node J
  if [ "$2" = none ]; then echo "127.0.1.$((200 + $1))"; else echo "$TWIN_NET.0.$1"; fi
}
if [ "$SITES" = 1 ]; then
  while read -r kind prefix count gpus net attrs; do
    [ "$kind" = NODE ] || continue
    [[ "$net" =~ ^(lumi|jsc|eth|none)$ ]] || die "sites.conf: network of $prefix must be lumi, jsc, eth or none, not '$net'"
    [ "${STB_TWINS:-1}" = 1 ] || net=none
    range="$prefix[1-$count]"; ((count == 1)) && range="${prefix}1"
    for ((k = 1; k <= count; k++)); do
      j=$((${#SITE_NODES[@]} + 1))
      SITE_NODES+=("$prefix$k")
      SITE_NETS+=("$net")
      [ "$net" = none ] || CTLD_ADDR=$TWIN_NET.0.254
      SITE_LINES+="NodeName=$prefix$k NodeAddr=$(node_addr "$j" "$net") Port=$((NODE_PORT0 + NODES + j - 1)) $attrs"
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
TWINS=0; [ "$CTLD_ADDR" = 127.0.0.1 ] || TWINS=1
if ((TWINS)); then  # site twins: network namespaces, veth pairs, bridges (iproute2); nftables for the JSC twins
  # iproute2 and nftables are installed with the SLURM packages below where missing
  ! command -v ip >/dev/null || { ip netns add stb-probe$$ && ip netns del stb-probe$$; } 2>/dev/null ||
    cannot "ip netns add fails (no CAP_NET_ADMIN?): the site twins need network namespaces; or STB_SITES=0"
  # Their addresses exist only in namespaces and bridges of this machine: refuse where the host already uses them.
  clash=$(ip -4 route show | grep -E "^10\.(77|78|79)\." | grep -v -E 'dev stb(mgmt|hsn|ib) ' || true)
  [ -z "$clash" ] || cannot "this machine already routes the site twins' networks ($clash)"
fi

# ---- 1. leftovers of an earlier run (crashed session, forgotten down.sh) ---------------
has_pids() { compgen -G "$1/run/*.pid" >/dev/null; }
alive_in() { # alive_in <state dir>: prints "comm(pid)" of daemons still running from it
  local f pid comm
  for f in "$1"/run/*.pid; do
    [ -s "$f" ] || continue
    pid=$(cat "$f"); comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null && continue   # zombie
    case "$comm" in slurmctld | slurmd | munged | slurmdbd | mariadbd) printf '%s(%s) ' "$comm" "$pid" ;; esac
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
((TWINS)) && PKGS="$PKGS iproute2 nftables"   # the site twins' namespaces, veth pairs, bridges and filter
[ "$ACCT" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
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

for p in "$CTLD_PORT" $(seq "$NODE_PORT0" $((NODE_PORT0 + ALL_NODES - 1))) $([ "$ACCT" = 1 ] && echo "$DBD_PORT $DB_PORT"); do
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
conf=${conf//@NODE_LINES@/$NODE_LINES}; conf=${conf//@GRES_TYPES@/$GRES_TYPES}; conf=${conf//@CTLD_ADDR@/$CTLD_ADDR}
SRUN_PORTS=""; ((TWINS)) && SRUN_PORTS="SrunPortRange=$SRUN_PORT0-$((SRUN_PORT0 + 999))"
conf=${conf//@SRUN_PORTS@/$SRUN_PORTS}
ACCOUNTING="AccountingStorageType=accounting_storage/none"
if [ "$ACCT" = 1 ]; then
  ACCOUNTING="AccountingStorageType=accounting_storage/slurmdbd"$'\n'"AccountingStorageHost=localhost"
  ACCOUNTING+=$'\n'"AccountingStoragePort=$DBD_PORT"
fi
conf=${conf//@ACCOUNTING@/$ACCOUNTING}
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
  for j in "${!SITE_NODES[@]}"; do
    echo "$(node_addr $((j + 1)) "${SITE_NETS[$j]}") ${SITE_NODES[$j]}"
    # JSC: the host name with the suffix "i" is the InfiniBand address (ib0)
    if [ "${SITE_NETS[$j]}" = jsc ]; then echo "10.79.0.$((j + 1)) ${SITE_NODES[$j]}i"; fi
  done
  echo "$CTLD_ADDR slurmctl"
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

# ---- 4a. accounting: a private MariaDB (data in the state dir) and slurmdbd --------------
# slurmdbd refuses a config file that is not the SlurmUser's, mode 600. Without AccountingStorageEnforce,
# jobs of users the database does not know still run; slurmctld registers the cluster itself and checks
# a job's QOS name against the database's QOS list (only "normal" here), as sites' controllers do.
if [ "$ACCT" = 1 ]; then
  mkdir -p "$STATE/db" && chown mysql:mysql "$STATE/db"
  mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/db" \
    --auth-root-authentication-method=socket --skip-test-db > "$STATE/log/mariadb-install.log" 2>&1 ||
    die "mariadb-install-db failed (log: $STATE/log/mariadb-install.log)"
  setsid mariadbd --no-defaults --user=mysql --datadir="$STATE/db" --socket="$STATE/db/mysqld.sock" \
    --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$STATE/db/mariadbd.pid" \
    --log-error="$STATE/db/mariadb.log" --innodb-buffer-pool-size=32M < /dev/null > /dev/null 2>&1 &
  wait_for 60 mariadbd test -s "$STATE/db/mariadbd.pid"
  cp "$STATE/db/mariadbd.pid" "$STATE/run/mariadbd.pid"   # mysql cannot write to run/; down.sh reads it here
  wait_for 60 mariadbd test -S "$STATE/db/mysqld.sock"
  mariadb --no-defaults --socket="$STATE/db/mysqld.sock" -uroot -e \
    "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'testbed'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$STATE/etc/slurmdbd.conf" <<DBD
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=slurm
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=testbed
StorageLoc=slurm_acct_db
DBD
  chown slurm:slurm "$STATE/etc/slurmdbd.conf" && chmod 600 "$STATE/etc/slurmdbd.conf"
  slurmdbd < /dev/null > /dev/null 2>&1
  wait_for 60 "slurmdbd on port $DBD_PORT" listening "$DBD_PORT"
  say "accounting: mariadbd and slurmdbd started"
fi

# ---- 4b. site twins: one network namespace per twin node --------------------------------
# Each twin's slurmd (and so every job step it starts) runs in the namespace stb-<node>: the job sees only
# the site's interfaces (its own /sys/class/net, step 5), and gloo binds, connects and fails on
# them as it would there. Every fabric is a Linux bridge of this machine; only the management bridge
# stbmgmt has an address outside the namespaces ($CTLD_ADDR, for slurmctld, srun and sbatch here).
: > "$STATE/run/netns"
mkdir -p "$STATE/run/sys"   # where each twin's sysfs is mounted before it moves onto /sys (in its own mount ns)
twin_link() { # twin_link <ns> <root end> <name in ns> <bridge> <address/prefix>
  # a root end left by a killed run whose namespace a leftover process still held (deleting it removes both
  # ends; the names are the testbed's own)
  ip link del "$2" 2>/dev/null || true
  ip link add "$2" type veth peer name "$3" netns "$1"
  ip link set "$2" master "$4" up
  ip -n "$1" addr add "$5" dev "$3"
  ip -n "$1" link set "$3" up
}
jsc_filter() { # jsc_filter <ns>: eth0 carries SLURM's own traffic only (controller, slurmd and srun ports)
  ip netns exec "$1" nft -f - <<EOF
table inet stb_twin {
  chain out {
    type filter hook output priority 0; policy accept;
    oifname "eth0" ct state established,related accept
    oifname "eth0" ip daddr $CTLD_ADDR accept
    oifname "eth0" tcp dport { $CTLD_PORT, $NODE_PORT0-$((NODE_PORT0 + ALL_NODES - 1)), $SRUN_PORT0-$((SRUN_PORT0 + 999)) } accept
    oifname "eth0" meta l4proto tcp reject with tcp reset
    oifname "eth0" reject
  }
}
EOF
}
if ((TWINS)); then
  for br in stbmgmt stbhsn stbib; do
    ip link del "$br" 2>/dev/null || true   # left by a crashed run (the names are the testbed's own)
    ip link add "$br" type bridge && ip link set "$br" up
  done
  ip addr add "$CTLD_ADDR/24" dev stbmgmt
  for j in "${!SITE_NODES[@]}"; do
    n=${SITE_NODES[$j]} net=${SITE_NETS[$j]} J=$((j + 1))
    [ "$net" = none ] && continue
    ns=stb-$n
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns" && echo "$ns" >> "$STATE/run/netns"
    ip -n "$ns" link set lo up
    case $net in
      lumi) twin_link "$ns" "stb${J}m" nmn0 stbmgmt "$TWIN_NET.0.$J/24"
            for k in 0 1 2 3; do twin_link "$ns" "stb${J}h$k" "hsn$k" stbhsn "10.78.$k.$J/24"; done ;;
      jsc)  twin_link "$ns" "stb${J}m" eth0 stbmgmt "$TWIN_NET.0.$J/24"
            twin_link "$ns" "stb${J}i" ib0 stbib "10.79.0.$J/24"
            jsc_filter "$ns" ;;
      eth)  twin_link "$ns" "stb${J}m" eth0 stbmgmt "$TWIN_NET.0.$J/24" ;;
    esac
  done
  say "site twins' networks ready ($(wc -l < "$STATE/run/netns") namespaces)"
fi

# ---- 5. slurmctld and the slurmds, each in its own UTS namespace -----------------------
# The daemons fork into the background themselves; stdio goes to /dev/null so nothing
# (pytest's capture pipes included) waits on them.
# A site twin's daemon also enters its network namespace and a mount namespace of its own, where /sys is a
# sysfs of that network namespace (so /sys/class/net lists the twin's interfaces) with this machine's
# /sys/fs/cgroup bound into it (slurmd needs it; `ip netns exec` would leave it out).
TWIN_SYS='mount -t sysfs sysfs "$0" && { [ ! -d /sys/fs/cgroup ] || mount --rbind /sys/fs/cgroup "$0"/fs/cgroup; } &&
  mount --move "$0" /sys && exec "$@"'
in_uts() { # in_uts <hostname> <command...>
  local ns=()
  if grep -qx "stb-$1" "$STATE/run/netns"; then
    ns=(nsenter --net="/run/netns/stb-$1" unshare --mount --propagation private sh -c "$TWIN_SYS" "$STATE/run/sys")
  fi
  "${ns[@]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$@" </dev/null >/dev/null 2>&1
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
