#!/bin/sh
# ctest export.html_browser: `memsim run --html` of the default config loaded in headless
# Chromium with every host unresolvable (the network off): the page's script must finish
# (data-ready="1"), report no error on the page or the console, and render a screenshot.
# Exit 77 (ctest SKIP_RETURN_CODE) when no Chromium is installed
# (tools/install-deps.sh --with-browser installs Debian's chromium).
# Usage: html_browser_test.sh MEMSIM OUTDIR [SCREENSHOT_COPY]
#   SCREENSHOT_COPY: also copy the screenshot there (docs/images/report.png, on purpose only).
set -eu
memsim=$1
out=$2
copy=${3:-}
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$(command -v "$b"); break; fi
done
if [ -z "$browser" ]; then
  echo "skipped: no chromium on the PATH (tools/install-deps.sh --with-browser)"
  exit 77
fi
rm -rf "$out"
mkdir -p "$out"
"$memsim" run --no-chart --html "$out/report.html" >/dev/null
if grep -Eq 'https?://' "$out/report.html"; then
  echo "FAIL: the report holds a URL:"; grep -Eo 'https?://[^"<> ]*' "$out/report.html" | head
  exit 1
fi
timeout 180 "$browser" --headless --disable-gpu --no-sandbox --enable-logging=stderr --v=0 \
  --no-first-run "--host-resolver-rules=MAP * ~NOTFOUND" --virtual-time-budget=10000 \
  --user-data-dir="$out/profile" --dump-dom "file://$out/report.html" \
  >"$out/dom.html" 2>"$out/console.log" || true
status=0
if ! grep -q 'data-ready="1"' "$out/dom.html"; then
  echo "FAIL: the page's script did not finish (no data-ready=\"1\" in the DOM)"; status=1
fi
if ! grep -q '<pre id="errors"></pre>' "$out/dom.html"; then
  echo "FAIL: the page reported errors:"; grep -A3 '<pre id="errors">' "$out/dom.html"; status=1
fi
if grep -Ei 'CONSOLE.*(error|uncaught)|Uncaught|ERR_NAME_NOT_RESOLVED|net::ERR' "$out/console.log"; then
  echo "FAIL: console errors or network requests (above)"; status=1
fi
timeout 180 "$browser" --headless --disable-gpu --no-sandbox --no-first-run \
  "--host-resolver-rules=MAP * ~NOTFOUND" --virtual-time-budget=10000 --hide-scrollbars \
  --user-data-dir="$out/profile" --window-size=1280,1500 --screenshot="$out/report.png" \
  "file://$out/report.html" >/dev/null 2>&1 || true
if [ ! -s "$out/report.png" ]; then
  echo "FAIL: no screenshot"; status=1
elif [ -n "$copy" ] && [ "$status" -eq 0 ]; then
  cp "$out/report.png" "$copy"
fi
[ "$status" -eq 0 ] && echo "ok: $out/report.png"
exit "$status"
