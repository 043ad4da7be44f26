# Argument checks shared by the scripts under scripts/ (sourced, not run). Every script rejects
# an unknown flag or an unexpected argument before it does anything else, with one line on
# stderr naming itself and the argument, and exit 2; `-h`/`--help` prints its header comment
# (its usage) and exits 0. harness/python/tests/probe/test_script_args.py checks every script.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
#   args_parse "--stack= --twice" 0 1 "[--stack NAME] [--twice] [DIR]" "$@"
#
# die_usage MESSAGE refuses what the script finds wrong with its arguments afterwards.

# The sourcing script, as its path from the checkout's root (scripts/NAME.sh), for messages.
ARGS_SELF="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)/$(basename "${BASH_SOURCE[1]}")"
ARGS_NAME="${ARGS_SELF#"$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"/}"
ARGS=()
declare -A FLAG=()

# die_usage MESSAGE [HINT]: one line on stderr, exit 2. HINT defaults to pointing at --help.
die_usage() {
  printf '%s: %s (%s)\n' "$ARGS_NAME" "$1" "${2:-see $ARGS_NAME --help}" >&2
  exit 2
}

# args_help: the script's header comment (after the #! line, up to the first line that is not a
# comment) on stdout, exit 0.
args_help() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$ARGS_SELF"
  exit 0
}

# args_bad ARG: refuses ARG, an unknown flag or an unexpected argument.
args_bad() {
  case "$1" in
    -?*) die_usage "unknown flag '$1'" ;;
    *) die_usage "unexpected argument '$1'" ;;
  esac
}

# args_value FLAG VALUE: VALUE, the flag's argument, must be there and not be another flag.
args_value() {
  case "${2-}" in
    "" | -*) die_usage "$1 needs a value" ;;
  esac
}

# args_parse FLAGS MIN MAX SYNOPSIS ARG...: parses a script's arguments. FLAGS is the list of
# the flags it takes ("--stack= --twice": a trailing = for one that takes a value, given as
# `--stack NAME` or `--stack=NAME`); each one given is left in FLAG (FLAG[stack]=NAME,
# FLAG[twice]=1), the positional arguments in ARGS, MIN to MAX of them. -h/--help prints the
# usage; an unknown flag, a missing value or an argument too many or too few is refused, with
# SYNOPSIS (the arguments, without the script's name) in the message.
args_parse() {
  local spec=" $1 " min=$2 max=$3 synopsis=$4 a name
  shift 4
  while [ $# -gt 0 ]; do
    a=$1
    shift
    case "$a" in
      -h | --help) args_help ;;
      -?*) ;;
      *) ARGS+=("$a"); continue ;;
    esac
    name=${a%%=*}
    case "$spec" in
      *" $a= "*) args_value "$a" "${1-}"; FLAG[${a#--}]=$1; shift ;;
      *" $a "*) FLAG[${a#--}]=1 ;;
      *" $name= "*) args_value "$name" "${a#*=}"; FLAG[${name#--}]=${a#*=} ;;
      *) args_bad "$a" ;;
    esac
  done
  if [ "${#ARGS[@]}" -gt "$max" ]; then
    die_usage "unexpected argument '${ARGS[$max]}'" "usage: $ARGS_NAME${synopsis:+ $synopsis}"
  elif [ "${#ARGS[@]}" -lt "$min" ]; then
    die_usage "missing arguments" "usage: $ARGS_NAME $synopsis"
  fi
}
