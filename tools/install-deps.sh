#!/bin/sh
# Installs the Debian 12 packages memsim needs to build and test, only those missing.
# --with-browser: also Debian's chromium, for the headless test of the HTML report
# (ctest export.html_browser, which reports itself skipped without it).
set -e
pkgs="cmake g++ make libcli11-dev nlohmann-json3-dev libfmt-dev catch2 zlib1g-dev libtinyxml2-dev"
for arg in "$@"; do
  case "$arg" in
    --with-browser) pkgs="$pkgs chromium" ;;
    *) echo "install-deps: unknown option $arg (expected --with-browser)" >&2; exit 2 ;;
  esac
done
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  echo "install-deps: all build dependencies are installed"
  exit 0
fi
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
