# Shared by the bash scripts (sourced): messages, sudo, the per-machine cache and stage timing.
#
# The cache (COHORT_CACHE, default ~/.cache/cohort) holds tool builds keyed by version:
# llama-server and its model, the Python venv with Envoy, cargo-installed tools. A fresh
# clone on a machine that built them once links to them instead of building again; with an
# empty cache every script still installs everything it needs.

cohort_cache=${COHORT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cohort}

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Stage timing: `stage NAME COMMAND...` runs COMMAND, prints its time, and records it for
# `stage_summary`. Call it at the top level of a script with `set -e`, not under `||` or
# `if` (bash ignores -e inside a command run there): a failing stage then stops the script,
# and the EXIT trap says which stage failed and after how long.
stage_names=()
stage_secs=()
stage_running=
stage_started=0
stage_on_exit() {
  local rc=$?
  if [ -n "$stage_running" ] && [ "$rc" -ne 0 ]; then
    printf '%s: %s failed (exit %d) after %ds\n' "${stage_prefix:-stage}" "$stage_running" "$rc" \
      $(( $(date +%s) - stage_started )) >&2
  fi
}
trap stage_on_exit EXIT
stage() {
  local name=$1
  shift
  stage_running=$name
  stage_started=$(date +%s)
  printf '\033[1m%s: %s\033[0m\n' "${stage_prefix:-stage}" "$name"
  "$@"
  local took=$(( $(date +%s) - stage_started ))
  stage_running=
  stage_names+=("$name")
  stage_secs+=("$took")
  printf '%s: %s took %dm%02ds\n' "${stage_prefix:-stage}" "$name" $((took / 60)) $((took % 60))
}

stage_summary() {
  local i total=0
  printf '\n%s: stage times\n' "${stage_prefix:-stage}"
  for i in "${!stage_names[@]}"; do
    printf '  %-60s %3dm%02ds\n' "${stage_names[$i]}" $((stage_secs[i] / 60)) $((stage_secs[i] % 60))
    total=$((total + stage_secs[i]))
  done
  printf '  %-60s %3dm%02ds\n' "total" $((total / 60)) $((total % 60))
}
