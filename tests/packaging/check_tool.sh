#!/bin/sh
# Run a command; pass when it exits with the expected status and its output
# (stdout and stderr together) matches every pattern (grep -E), and no
# line matches a pattern written with a leading '!'.
#
#   check_tool.sh STATUS PATTERN... -- COMMAND [ARGS...]
set -u
want=$1
shift
patterns_file=$(mktemp)
trap 'rm -f "$patterns_file"' EXIT
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  printf '%s\n' "$1" >>"$patterns_file"
  shift
done
[ $# -gt 1 ] || { echo "usage: check_tool.sh STATUS PATTERN... -- COMMAND [ARGS...]" >&2; exit 2; }
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want" ]; then
  echo "FAIL: '$*' exited with $rc, expected $want" >&2
  exit 1
fi
while IFS= read -r p; do
  case $p in
    !*)
      if printf '%s\n' "$out" | grep -Eq -- "${p#!}"; then
        echo "FAIL: the output of '$*' matches '${p#!}'" >&2
        exit 1
      fi
      ;;
    *)
      if ! printf '%s\n' "$out" | grep -Eq -- "$p"; then
        echo "FAIL: the output of '$*' does not match '$p'" >&2
        exit 1
      fi
      ;;
  esac
done <"$patterns_file"
echo "PASS: $*"
