#!/usr/bin/env bash
# dev/plot_log.py on a log written by a short CPU run (`make plot-log-test`, part of `make test`):
# the parsed records equal main.log's fields, the PNG exists and is a PNG, and a malformed log
# stops with a HINT. Needs /usr/bin/python3 with matplotlib (apt-get install python3-matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
if ! $PY -c 'import matplotlib' 2>/dev/null; then
    echo "skipped: plot-log-test (needs /usr/bin/python3 with matplotlib: apt-get install python3-matplotlib)"
    exit 0
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
pass() { echo "ok   $*"; }
bad() { echo "FAIL $*"; failures=$((failures + 1)); }

./train_fox_cpu -e fox-pro-tiny --n_layer 1 --n_embd 32 --n_head 2 -b 2 -t 32 -x 6 -v 3 -m 1 -s 0 -o "$WORK/run" > /dev/null
# every record, its fields in log order, as the script parsed them vs as the log has them
$PY dev/plot_log.py --dump "run:$WORK/run" | sed 's/^run //' > "$WORK/parsed"
# the log's lines with numbers normalised the way Python prints them (int or float repr)
$PY - "$WORK/run/main.log" > "$WORK/expected" <<'PYEOF'
import sys
for line in open(sys.argv[1]):
    out = []
    for part in line.split():
        k, v = part.split(":", 1)
        out.append(f"{k}:{int(v) if k in ('s', 'skip', 'tokens') else float(v)}")
    print(" ".join(out))
PYEOF
records=$(wc -l < "$WORK/parsed")
if [ "$records" -eq 9 ] && diff "$WORK/expected" "$WORK/parsed" > /dev/null &&
   grep -q '^s:6 trl:[0-9.]* lr:[0-9.e-]* norm:[0-9.]* tokps:[0-9.]* tokens:384$' "$WORK/parsed"; then
    pass "plot_log: the 9 records of a 6-step run (6 train, 3 validation) parsed with every field equal to main.log's"
else
    bad "plot_log: parsed records differ from main.log"; diff "$WORK/expected" "$WORK/parsed" || true
fi
$PY dev/plot_log.py -o "$WORK/curves.png" "cpu:$WORK/run" "again:$WORK/run/main.log" > /dev/null
if [ -s "$WORK/curves.png" ] && [ "$(head -c 8 "$WORK/curves.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
    pass "plot_log: two runs side by side drawn to a PNG of $(stat -c %s "$WORK/curves.png") bytes"
else
    bad "plot_log: no PNG written"
fi
printf 's:1 trl:3.5 lr:1e-3\ns:2 trl:oops\n' > "$WORK/bad.log"
if $PY dev/plot_log.py -o "$WORK/bad.png" "$WORK/bad.log" > /dev/null 2> "$WORK/bad.err"; then
    bad "plot_log: a malformed log was accepted"
elif grep -q 'bad.log:2' "$WORK/bad.err" && grep -q HINT "$WORK/bad.err" && [ ! -e "$WORK/bad.png" ]; then
    pass "plot_log: a malformed log stops with \"$(head -1 "$WORK/bad.err" | sed 's|.*/||')\" and a HINT"
else
    bad "plot_log: wrong message for a malformed log"; cat "$WORK/bad.err"
fi
if $PY dev/plot_log.py "$WORK/missing" > /dev/null 2> "$WORK/missing.err" || ! grep -q HINT "$WORK/missing.err"; then
    bad "plot_log: a missing log was not refused with a HINT"
else
    pass "plot_log: a missing log stops with a HINT"
fi
echo "plot-log-test: $failures failure(s)"
[ $failures -eq 0 ]
