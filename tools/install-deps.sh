#!/bin/sh
# Installs the Debian 12 packages memsim needs to build and test, only those missing.
# --with-browser: also Debian's chromium, for the headless test of the HTML report
# (ctest export.html_browser, which reports itself skipped without it).
# --with-ci-tools: also clang with its sanitizer and libFuzzer runtimes and clang-tidy, which
# .ci/run's CI-only passes use (tools/sanitize, tools/fuzz, tools/check-function-size): one
# apt transaction instead of one per tool (docs/ci.md, "Build time").
set -e
pkgs="cmake g++ make libcli11-dev nlohmann-json3-dev libfmt-dev catch2 zlib1g-dev libtinyxml2-dev libyaml-cpp-dev libtomlplusplus-dev"
for arg in "$@"; do
  case "$arg" in
    --with-browser) pkgs="$pkgs chromium" ;;
    --with-ci-tools) pkgs="$pkgs clang libclang-rt-14-dev clang-tidy" ;;
    *) echo "install-deps: unknown option $arg (expected --with-browser or --with-ci-tools)" >&2; exit 2 ;;
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
