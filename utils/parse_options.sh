#!/usr/bin/env bash
# Kaldi-style option parsing, sourced by a script after its variables have defaults:
#   stage=0; keyword="hey snips"; . utils/parse_options.sh
# then `--stage 3 --keyword "ok computer"` (or --stop-stage / --stop_stage) overrides them.
# Only variables that already exist can be set, so a typo is an error, not a new variable.
# `--config FILE` sources FILE (a file of var=value lines), as in Kaldi, unless FILE is a
# YAML training config (.yaml/.yml): then it simply sets the recipe's `config` variable.

while true; do
  [ -z "${1:-}" ] && break
  case "$1" in
    --help|-h)
      if [ -n "${help_message:-}" ]; then printf '%s\n' "$help_message" >&2; fi
      exit 0 ;;
    --*=*)
      echo "$0: options take a separate value: use '${1%%=*} ${1#*=}'" >&2
      exit 1 ;;
    --*)
      _po_name=$(echo "$1" | sed 's/^--//; s/-/_/g')
      if [ "$_po_name" = config ] && [[ "${2:-}" != *.yaml && "${2:-}" != *.yml ]]; then
        [ -f "${2:-}" ] || { echo "$0: config file '${2:-}' not found" >&2; exit 1; }
        . "$2"
        shift 2
        continue
      fi
      if ! declare -p "$_po_name" >/dev/null 2>&1; then
        echo "$0: unknown option $1" >&2
        exit 1
      fi
      if [ $# -lt 2 ]; then
        echo "$0: option $1 needs a value" >&2
        exit 1
      fi
      # Keep the value verbatim (spaces included) without evaluating it.
      printf -v "$_po_name" '%s' "$2"
      shift 2 ;;
    *)
      break ;;
  esac
done
unset _po_name
true
