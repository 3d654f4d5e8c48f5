"""
Sorts compute-sanitizer racecheck reports of train_fox (dev/gpu_check.sh) into three kinds:

- library: inside cuBLASLt's own kernels (nvjet_*, cutlass, xmma), which synchronise through TMA
  and mbarriers that racecheck does not model;
- mbarrier: inside our warp-specialised attention kernels (WARP_SPECIALISED below: the backward's
  dK/dV and dQ kernels, the forward at hd 64), where every write of the report is the producer
  warp's fill of a stage and every read a shared-memory load (LDS) of a consumer. The fill is a
  cp.async (SASS LDGSTS) completing on the stage's full mbarrier (cp.async.mbarrier.arrive: the
  forward's c of the keys, the backward's lse, Delta, c), or, in the backward instantiations whose
  last template argument PRE is 1 (hd 64), an ordinary store (STS) of the per-column logit terms
  followed by a release arrival on that barrier (mbarrier.arrive.release); the consumers wait on
  it (acquire) before reading, and the producer refills a stage only after the consumers' arrivals
  on its "empty" barrier. racecheck does not model that ordering, so it reports the pair; the
  instructions are checked here (LDGSTS writes in the forward and where PRE is 0, STS writes where
  it is 1: in those kernels every STS is such a producer store, since the consumers store nothing
  to shared memory), so a report with any other kind of access is not excused;
- ours: everything else, a real race until shown otherwise.

What the second kind cannot show: a broken mbarrier protocol (a wrong parity or arrival count)
would produce exactly such pairs, so for those kernels the protocol rests on the tests against the
twin (test_fox, run twice bitwise in the ladders), not on racecheck. Write/write pairs are never
excused. Run racecheck with --print-limit 0: the script counts the reports it read against the
summary's count and fails when they differ (reports cut off by the print limit would go unseen).

    python3 dev/racecheck_triage.py sanitizer_racecheck.txt ./train_fox

Prints one line with the three counts; exit 1 when there is any report of the kind "ours".
"""
import re
import subprocess
import sys

# train_fox's kernels with a producer warp and mbarrier rings: the backward's dK/dV and dQ kernels,
# whose last template argument is PRE (the producer stores the stage's per-column terms with STS
# instead of copying raw floats with cp.async), and the forward at hd 64 (its producer copies c with
# cp.async only; its last template argument is GATE, not PRE)
WARP_SPECIALISED = re.compile(r"fox_backward_(dkdv|dq)_kernel20|fox_forward_kernel16")
WITH_PRE = re.compile(r"fox_backward_(dkdv|dq)_kernel20")


def producer_write(name, op, args):
    # the producer's fill of a stage in this instantiation: LDGSTS, or STS (not STSM) with PRE
    if WITH_PRE.fullmatch(name) and args and args[-1] == 1:
        return re.match(r"STS(\.|$)", op) is not None
    return op.startswith("LDGSTS")


def parse_mangled(symbol):
    # _Z22fox_bwd_dkdv_ws_kernelILi64ELi64ELi2ELb1ELb0EEv... -> ("fox_bwd_dkdv_ws_kernel", (64, 64, 2, 1, 0))
    m = re.match(r"_Z(\d+)", symbol)
    if m is None:
        return None
    n, start = int(m.group(1)), m.end()
    name, rest = symbol[start:start + n], symbol[start + n:]
    args = ()
    if rest.startswith("I"):
        args = tuple(int(x) for x in re.findall(r"L[a-z](-?\d+)E", rest[:rest.find("EE") + 1]))
    return name, args


def sass_opcodes(binary):
    out = subprocess.run(["cuobjdump", "-sass", binary], capture_output=True, text=True, check=True).stdout
    funcs, current = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = parse_mangled(m.group(1))
            funcs.setdefault(current, {})
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and current is not None:
            funcs[current][int(m.group(1), 16)] = m.group(2)
    return funcs


def parse_access(text):
    # "void fox_bwd_dq_ws_kernel<(int)64, (int)128, (bool)1>(...)+0x1680" -> (name, args, offset)
    m = re.match(r"(?:void )?(\w+)(<[^>]*>)?.*\+0x([0-9a-f]+)", text)
    if m is None:
        return None
    args = tuple(int(x) for x in re.findall(r"\((?:int|bool|unsigned int)\)(-?\d+)", m.group(2) or ""))
    return m.group(1), args, int(m.group(3), 16)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: racecheck_triage.py <racecheck log> <binary>")
    log, binary = sys.argv[1], sys.argv[2]
    funcs = sass_opcodes(binary)
    counts = {"library": 0, "mbarrier": 0, "ours": 0}
    ours = []
    text = open(log, errors="replace").read()  # a sample may print bytes that are no UTF-8
    reports = text.split("Race reported between")[1:]
    summary = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed", text)
    if summary is None or int(summary.group(1)) != len(reports):
        print(f"racecheck log unreadable: {len(reports)} reports read, summary "
              f"{summary.group(0) if summary else 'missing'} (run with --print-limit 0)")
        sys.exit(1)
    for report in reports:
        accesses = re.findall(r"(Read|Write) access at (.*?)(?: \[\d+ hazards\])?\n", report)
        names = [a[1] for a in accesses]
        if names and all(re.search(r"nvjet|cutlass|xmma", n) for n in names):
            counts["library"] += 1
            continue
        excused = bool(accesses) and any(kind == "Read" for kind, _ in accesses)  # write/write: never
        for kind, where in accesses:
            parsed = parse_access(where)
            if parsed is None or not WARP_SPECIALISED.fullmatch(parsed[0]):
                excused = False
                break
            op = funcs.get((parsed[0], parsed[1]), {}).get(parsed[2], "?")
            if not (producer_write(parsed[0], op, parsed[1]) if kind == "Write" else op.startswith("LDS")):
                excused = False
                break
        if excused:
            counts["mbarrier"] += 1
        else:
            counts["ours"] += 1
            ours.append(report.strip().splitlines()[0][:200])
    print(f"{counts['ours']} unexplained race report(s) in train_fox's kernels, {counts['mbarrier']} cp.async or st.shared -> "
          f"mbarrier pairs in the warp-specialised kernels (instructions checked), {counts['library']} inside cuBLASLt's kernels")
    for line in ours[:5]:
        print("  unexplained:", line)
    sys.exit(1 if counts["ours"] else 0)


if __name__ == "__main__":
    main()
