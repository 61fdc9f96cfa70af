#!/usr/bin/env bash
# Install what unimem needs to build, test and benchmark on Debian/Ubuntu:
# the packages of scripts/packages.txt (.ci/run installs through this too).
# Does nothing when everything is already there; needs root (or sudo) when
# something is missing.
# Usage: scripts/deps.sh [--list | --dry-run]
#   --list     print the packages of the list, one a line, and exit
#   --dry-run  print the missing ones and the command that would install them
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-install}
case "$mode" in
  install|--list|--dry-run) ;;
  *) echo "usage: scripts/deps.sh [--list | --dry-run]" >&2; exit 2 ;;
esac

# One package a line; '#' starts a comment; blank lines skipped.
packages=()
while read -r line; do
  line=${line%%#*}
  read -r p rest <<<"$line" || true
  [ -n "${p:-}" ] || continue
  [ -z "${rest:-}" ] || { echo "unimem: packages.txt: one package a line: '$line'" >&2; exit 2; }
  packages+=("$p")
done < packages.txt

if [ "$mode" = --list ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$mode" = --dry-run ]; then
  echo "unimem: would run: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  exit 0
fi
echo "unimem: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "unimem: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
