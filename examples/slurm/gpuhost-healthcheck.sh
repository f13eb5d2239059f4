#!/bin/sh
# gpuhost-healthcheck: a Slurm HealthCheckProgram (or Prolog) that runs pytest-gpuhost's fast
# checks on this node and drains the node when one fails, as LBNL NHC does.
#
#   slurm.conf:  HealthCheckProgram=/usr/local/sbin/gpuhost-healthcheck
#                HealthCheckInterval=300
#                HealthCheckNodeState=IDLE      (or ANY; IDLE keeps it off busy GPUs)
#
# 1. Runs, under `timeout`, on this node (verify only, never --fix):
#      pytest -q -m "not gpuhost_slow" --gpuhost-spec=$GPUHOST_SPEC --gpuhost-report=$GPUHOST_REPORT
#    The p2p bandwidth checks (marker gpuhost_slow) are left out: Slurm kills a
#    HealthCheckProgram after 60 s, and a Prolog must end within MessageTimeout.
# 2. Makes the reason line from the report: python -m pytest_gpuhost.reports.slurm. It describes
#    this node only: checks of other targets in GPUHOST_ARGS never drain it, and a report with
#    no target on this node "could not run".
# 3. Reads this node's state and reason from slurmctld: sinfo -h -n NODE -o '%t %E'.
# 4. Acts:
#    - a check failed (anything but passed, fixed, skipped):
#        scontrol update NodeName=NODE State=DRAIN Reason="gpuhost: <first failing check> (+N more)"
#    - the checks could not run (timed out, pytest crashed, bad spec, no report): drains too,
#      Reason="gpuhost: checks could not run: ..." (NHC also offlines a node whose checks hung:
#      an unverified node is not a healthy one; a bad spec rolled out drains every node, loudly);
#    - every check passed: State=RESUME, only when the node is drained with a reason that starts
#      with "gpuhost:"; an admin's or another tool's drain is never lifted, and never reworded;
#    - no scontrol at all while slurmd is not registered with slurmctld: sinfo fails or prints
#      nothing, or the state is unk (unknown), futr (future), boot, or ends in `*` (not
#      responding); nor on a down node, or one powering up or down or rebooting (~ # % ! @ ^).
#    A node drained with gpuhost's reason is drained again when the reason changes.
#
# Exit status: 0 when healthy, 1 when the node is not (drained or not); Slurm ignores a
# HealthCheckProgram's status, and a Prolog's non-zero status requeues the job (and Slurm drains
# the node itself, "Prolog error", if it is not drained yet).
#
# Settings (environment; defaults below). slurmd runs a HealthCheckProgram with no environment
# but SLURMD_NODENAME (slurm-wlm 22.05, tests/e2e/test_slurm_cluster.py), so sinfo and scontrol
# read /etc/slurm/slurm.conf and every setting is its default. To change one, make the
# HealthCheckProgram a wrapper that sets it (and PATH, where Slurm is not in /usr/bin):
#     #!/bin/sh
#     export GPUHOST_SPEC=/etc/gpuhost/a100.yaml
#     exec /bin/sh /usr/local/sbin/gpuhost-healthcheck
#
#   GPUHOST_SPEC     the spec                               /etc/gpuhost/spec.yaml
#   GPUHOST_PYTEST   the pytest with pytest-gpuhost         /opt/gpuhost/bin/pytest
#   GPUHOST_PYTHON   its python (for the reason helper)     python3 beside GPUHOST_PYTEST
#   GPUHOST_TIMEOUT  seconds for the checks (then killed 5 s later)   40
#   GPUHOST_REPORT   the JSON report                        /run/gpuhost/healthcheck.json
#   GPUHOST_ARGS     more pytest arguments, split on spaces (e.g. --gpuhost-prom=FILE)
#   GPUHOST_NODE     this node's NodeName                   $SLURMD_NODENAME, else hostname -s

set -u

GPUHOST_SPEC=${GPUHOST_SPEC:-/etc/gpuhost/spec.yaml}
GPUHOST_PYTEST=${GPUHOST_PYTEST:-/opt/gpuhost/bin/pytest}
GPUHOST_PYTHON=${GPUHOST_PYTHON:-$(dirname "$GPUHOST_PYTEST")/python3}
GPUHOST_TIMEOUT=${GPUHOST_TIMEOUT:-40}
GPUHOST_REPORT=${GPUHOST_REPORT:-/run/gpuhost/healthcheck.json}
GPUHOST_ARGS=${GPUHOST_ARGS:-}
NODE=${GPUHOST_NODE:-${SLURMD_NODENAME:-$(hostname -s)}}

log() { printf 'gpuhost-healthcheck: %s\n' "$*" >&2; }

mkdir -p "$(dirname "$GPUHOST_REPORT")"
rm -f "$GPUHOST_REPORT"  # a stale report must never vouch for this run
# shellcheck disable=SC2086  # GPUHOST_ARGS is a list of words
timeout -k 5 "$GPUHOST_TIMEOUT" "$GPUHOST_PYTEST" -q -p no:cacheprovider -m "not gpuhost_slow" \
    --gpuhost-spec="$GPUHOST_SPEC" --gpuhost-report="$GPUHOST_REPORT" $GPUHOST_ARGS >&2
ran=$?

reason=$("$GPUHOST_PYTHON" -m pytest_gpuhost.reports.slurm "$GPUHOST_REPORT" \
    --pytest-exit="$ran" --timeout="$GPUHOST_TIMEOUT")
verdict=$?
if [ "$verdict" -gt 2 ] || [ -z "$reason" ]; then
    verdict=2
    reason="gpuhost: checks could not run: the reason helper failed"
fi
healthy=no
[ "$verdict" -eq 0 ] && healthy=yes
log "$reason"

line=$(sinfo -h -n "$NODE" -o '%t %E' 2>/dev/null | head -n 1)
state=${line%% *}
current=${line#"$state"}
current=${current# }

case "$state" in
    ""|unk*|futr*|boot*|*'*')
        log "slurmd on $NODE is not registered with slurmctld (state '${state:-none}'):" \
            "no scontrol"
        [ "$healthy" = yes ]; exit $?
        ;;
    down*|*[~#%!@^]*)
        log "$NODE is $state: left as it is"
        [ "$healthy" = yes ]; exit $?
        ;;
esac

drained=no
case "$state" in drain*|drng*|fail*) drained=yes ;; esac
ours=no
case "$current" in gpuhost:*) ours=yes ;; esac

if [ "$healthy" = yes ]; then
    if [ "$drained" = yes ] && [ "$ours" = yes ]; then
        log "resuming $NODE (it was drained: $current)"
        scontrol update NodeName="$NODE" State=RESUME
    elif [ "$drained" = yes ]; then
        log "$NODE stays drained: not by gpuhost ($current)"
    fi
    exit 0
fi
if [ "$drained" = no ] || { [ "$ours" = yes ] && [ "$current" != "$reason" ]; }; then
    log "draining $NODE"
    scontrol update NodeName="$NODE" State=DRAIN Reason="$reason"
elif [ "$ours" = no ]; then
    log "$NODE is drained already, not by gpuhost ($current): its reason is kept"
fi
exit 1
