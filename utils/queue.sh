#!/usr/bin/env bash
# Parallel job runner in the manner of Kaldi's run.pl / slurm.pl. Usage:
#   utils/queue.sh [options] JOB=1:N LOGDIR/x.JOB.log COMMAND [ARGS...]
#   utils/queue.sh [options] LOGFILE COMMAND [ARGS...]          (one job)
# Runs jobs A..B of a range; in each, JOB (the name left of '=') is replaced by the job
# number in the log path and in every argument. Each log starts with the command and ends
# with its exit code. Exit 0 if every job succeeded; else the failed jobs and their logs
# are listed and the exit status is 1.
#
# As with run.pl, arguments without whitespace reach `bash -c` as they are, so an escaped
# \| or \> builds a pipe or a redirection inside each job; arguments with whitespace are
# quoted and stay one argument. A command given as one single argument is taken as a
# whole shell command line ('a JOB | b; c'). Jobs run with pipefail.
#
# Options:
#   --backend local|slurm  local: background processes on this machine (default);
#                          slurm: one `sbatch --wait --array=A-B` job array (see below)
#   --nj N                 shorthand for JOB=1:N (must agree with a range if both given)
#   --max-parallel M       at most M jobs at once (local default: nproc; slurm: no limit,
#                          else passed as --array=A-B%M)
#   --job-name NAME        Slurm job name (default: the log file name without JOB/.log)
#   --gpu G / --mem SIZE / --num-threads T
#                          resources per job; slurm: --gres=gpu:G --mem=SIZE
#                          --cpus-per-task=T; local: ignored, as run.pl does
# Slurm: the array script and Slurm's own output go to LOGDIR/q/; extra sbatch options
# (partition, account, time...) come from the environment: SLURM_OPTS="-p gpu --time 4:00:00".
# LOGDIR must be on a filesystem the compute nodes share.
set -euo pipefail

usage() {  # prints the header comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit "${1:-1}"
}
die() { echo "$0: $*" >&2; exit 1; }
is_int() { [[ $1 =~ ^[0-9]+$ ]]; }

backend=local nj="" max_parallel="" job_name="" gpu=0 mem="" num_threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --) shift; break ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    --backend|--nj|--max-parallel|--job-name|--gpu|--mem|--num-threads)
      [ $# -ge 2 ] || die "option $1 needs a value"
      case "$1" in
        --backend) backend=$2 ;;
        --nj) nj=$2 ;;
        --max-parallel) max_parallel=$2 ;;
        --job-name) job_name=$2 ;;
        --gpu) gpu=$2 ;;
        --mem) mem=$2 ;;
        --num-threads) num_threads=$2 ;;
      esac
      shift 2 ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
case "$backend" in local|slurm) ;; *) die "--backend must be local or slurm, not '$backend'" ;; esac
for pair in "nj=$nj" "max-parallel=$max_parallel" "gpu=$gpu" "num-threads=$num_threads"; do
  value=${pair#*=}
  [ -z "$value" ] || is_int "$value" || die "--${pair%%=*} needs a whole number, got '$value'"
done
[ "$max_parallel" != 0 ] || die "--max-parallel must be at least 1"

# The job range: JOB=A:B, or --nj N, or neither (one job, nothing substituted).
var="" first=1 last=1
if [ $# -gt 0 ] && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
  [[ $1 =~ ^([A-Za-z_][A-Za-z0-9_]*)=([0-9]+):([0-9]+)$ ]] \
    || die "bad job range '$1': expected e.g. JOB=1:4"
  var=${BASH_REMATCH[1]} first=$((10#${BASH_REMATCH[2]})) last=$((10#${BASH_REMATCH[3]}))
  [ "$first" -ge 1 ] && [ "$first" -le "$last" ] || die "bad job range '$1': need 1 <= A <= B"
  shift
  if [ -n "$nj" ] && { [ "$first" -ne 1 ] || [ "$last" -ne "$nj" ]; }; then
    die "--nj $nj disagrees with the range $var=$first:$last"
  fi
elif [ -n "$nj" ]; then
  [ "$nj" -ge 1 ] || die "--nj must be at least 1"
  var=JOB last=$nj
fi
[ $# -ge 2 ] || { echo "$0: need a log file and a command" >&2; usage; }
logfile=$1
shift
if [ "$last" -gt "$first" ] && [[ $logfile != *"$var"* ]]; then
  die "$((last - first + 1)) jobs would share one log file $logfile: put $var in its name"
fi

if [ $# -eq 1 ]; then
  cmd=$1  # one argument: a whole shell command line, used as it is
else
  cmd=""
  for arg in "$@"; do
    if [[ $arg =~ ^[^[:space:]]+$ ]]; then cmd+="$arg "; else cmd+="$(printf '%q' "$arg") "; fi
  done
  cmd=${cmd% }
fi

subst() {  # subst STRING ID: STRING with the job variable replaced by ID
  if [ -n "$var" ]; then printf '%s' "${1//"$var"/$2}"; else printf '%s' "$1"; fi
}
for ((id = first; id <= last; id++)); do
  log=$(subst "$logfile" "$id")
  mkdir -p "$(dirname "$log")" || die "cannot create the log dir of $log"
done
njobs=$((last - first + 1))

report() {  # report STATUSDIR HINT: lists failed jobs, returns 1 if any failed
  local dir=$1 hint=$2 id rc log failed=0 shown=""
  for ((id = first; id <= last; id++)); do
    rc=$(cat "$dir/$id.rc" 2>/dev/null || echo none)
    [ "$rc" = 0 ] && continue
    failed=$((failed + 1))
    log=$(subst "$logfile" "$id")
    if [ "$failed" -eq 1 ]; then echo "$0: failed job(s) of $njobs:" >&2; fi
    if [ "$rc" = none ]; then
      echo "  ${var:-job}${var:+=$id}: no exit status ($(subst "$hint" "$id")), log: $log" >&2
    else
      echo "  ${var:-job}${var:+=$id}: exit code $rc, log: $log" >&2
    fi
    [ -n "$shown" ] || shown=$log
  done
  [ "$failed" -eq 0 ] && return 0
  if [ -s "$shown" ]; then
    echo "$0: last lines of $shown:" >&2
    tail -n 5 "$shown" | sed 's/^/    /' >&2
  fi
  echo "$0: $failed of $njobs job(s) failed" >&2
  return 1
}

# ---------------------------------------------------------------------------- local
run_local() {
  [ -n "$max_parallel" ] || max_parallel=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
  statusdir=$(mktemp -d "${TMPDIR:-/tmp}/queue.XXXXXX")
  trap 'rm -rf "$statusdir"' EXIT
  # On Ctrl-C or kill, stop the jobs too rather than leaving them running unseen.
  trap 'trap - INT TERM; kill $(jobs -p) 2>/dev/null; wait; exit 130' INT TERM

  run_job() {  # run_job ID LOG CMD
    local id=$1 log=$2 job=$3 start=$SECONDS rc=0 child
    { echo "# $job"; echo "# Started at $(date) on $(hostname)"; } >"$log"
    bash -o pipefail -c "$job" </dev/null >>"$log" 2>&1 &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null' TERM
    wait "$child" || rc=$?
    if kill -0 "$child" 2>/dev/null; then wait "$child" || rc=$?; fi
    echo "# Accounting: time=$((SECONDS - start)) threads=$num_threads" >>"$log"
    echo "# Ended (code $rc) at $(date), elapsed time $((SECONDS - start)) seconds" >>"$log"
    echo "$rc" >"$statusdir/$id.rc"
  }

  local id running=0
  for ((id = first; id <= last; id++)); do
    if [ "$running" -ge "$max_parallel" ]; then
      wait -n || true   # one job finished (its status is in its .rc file)
      running=$((running - 1))
    fi
    run_job "$id" "$(subst "$logfile" "$id")" "$(subst "$cmd" "$id")" &
    running=$((running + 1))
  done
  wait
  report "$statusdir" "killed?"
}

# ---------------------------------------------------------------------------- slurm
run_slurm() {
  command -v sbatch >/dev/null 2>&1 || die "--backend slurm needs 'sbatch' on PATH and it is" \
    "not there: run on a Slurm login node, or use --backend local."
  local qdir name script out id extra=() resources=() array sbatch_rc=0 spid
  qdir="$(dirname "$(subst "$logfile" "$first")")/q"
  mkdir -p "$qdir"
  qdir=$(cd "$qdir" && pwd)  # the array tasks may start elsewhere than here
  name=${job_name:-$(basename "$logfile" .log)}
  [ -z "$var" ] || { name=${name//."$var"/}; name=${name//"$var"/}; }
  name=${name:-job}
  statusdir=$(mktemp -d "$qdir/$name.status.XXXXXX")
  trap 'rm -rf "$statusdir"' EXIT
  script=$qdir/$name.sh
  {
    echo '#!/usr/bin/env bash'
    echo "# Written by $0 at $(date): one Slurm array task per job."
    echo 'set -uo pipefail'
    echo 'id=${SLURM_ARRAY_TASK_ID:?run this as a Slurm array task}'
    echo 'case $id in'
    for ((id = first; id <= last; id++)); do
      printf '  %s) log=%q; cmd=%q ;;\n' "$id" "$(subst "$logfile" "$id")" "$(subst "$cmd" "$id")"
    done
    echo '  *) echo "no job $id in this array" >&2; exit 1 ;;'
    echo 'esac'
    echo 'mkdir -p "$(dirname "$log")"'
    echo '{ echo "# $cmd"; echo "# Started at $(date) on $(hostname)," \'
    echo '    "Slurm job ${SLURM_JOB_ID:-?}"; } >"$log"'
    echo 'start=$SECONDS'
    echo 'bash -o pipefail -c "$cmd" </dev/null >>"$log" 2>&1; rc=$?'
    echo 'echo "# Ended (code $rc) at $(date), elapsed time $((SECONDS - start)) seconds" >>"$log"'
    printf 'echo "$rc" >%q/"$id".rc\n' "$statusdir"
    echo 'exit $rc'
  } >"$script"
  array="$first-$last${max_parallel:+%$max_parallel}"
  [ "$gpu" -eq 0 ] || resources+=(--gres="gpu:$gpu")
  [ -z "$mem" ] || resources+=(--mem="$mem")
  [ "$num_threads" -le 1 ] || resources+=(--cpus-per-task="$num_threads")
  read -r -a extra <<<"${SLURM_OPTS:-}"
  out=$qdir/$name.sbatch.out
  echo "$0: sbatch --array=$array --job-name=$name ${resources[*]} ${extra[*]} $script" >&2
  # In the background so that Ctrl-C here can cancel the array instead of orphaning it.
  sbatch --wait --parsable --array="$array" --job-name="$name" --chdir="$PWD" \
    --output="$qdir/$name.%a.out" "${resources[@]}" "${extra[@]}" "$script" >"$out" 2>&1 &
  spid=$!
  trap 'trap - INT TERM; j=$(head -n 1 "$out" | cut -d";" -f1);
        [[ $j =~ ^[0-9]+$ ]] && scancel "$j"; kill "$spid" 2>/dev/null; exit 130' INT TERM
  wait "$spid" || sbatch_rc=$?
  if [ "$sbatch_rc" -ne 0 ] && [ -z "$(ls -A "$statusdir")" ]; then
    echo "$0: sbatch failed (exit $sbatch_rc); its output ($out):" >&2
    sed 's/^/    /' "$out" >&2
    exit 1
  fi
  report "$statusdir" "Slurm output: $qdir/$name.${var:-1}.out"
}

if [ "$backend" = local ]; then run_local; else run_slurm; fi
