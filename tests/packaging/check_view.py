#!/usr/bin/env python3
"""The history and its page, as people use them: `unimem stats --history H`
records a known workload; H must be trace-event JSON (every event with the
fields its phase needs) holding the workload's events in order; `unimem view
H -o PAGE` writes the page, which a real headless browser (Debian's
chromium) loads: no error in its console, one memory lane per device, the
block map holding exactly the blocks live at the page's instant (worked out
here from H), and a screenshot that is a real PNG.

Usage: check_view.py UNIMEM_TOOL WORKDIR. Exit 77 (skip) without chromium."""
import json
import os
import re
import shutil
import subprocess
import sys

KiB, MiB = 1024, 1024 * 1024


def fail(msg):
    print("check_view: FAIL: " + msg)
    sys.exit(1)


def need(cond, msg):
    if not cond:
        fail(msg)


# The fields each phase needs (the trace-event format).
NEEDS = {"M": ("name", "pid", "args"), "X": ("name", "ph", "ts", "dur", "pid", "tid"),
         "i": ("name", "ph", "ts", "pid", "tid", "s"), "C": ("name", "ph", "ts", "pid", "args")}


def check_format(doc):
    need(isinstance(doc.get("traceEvents"), list), "no traceEvents list")
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        need(ph in NEEDS, "an event of unknown phase: %r" % e)
        for k in NEEDS[ph]:
            need(k in e, "a %s event without %s: %r" % (ph, k, e))
        if ph in "XiC":
            need(isinstance(e["ts"], (int, float)) and e["ts"] >= 0, "a bad ts: %r" % e)
        if ph == "X":
            need(e["dur"] >= 0, "a negative duration: %r" % e)
        if ph == "C":
            need(all(isinstance(v, (int, float)) for v in e["args"].values()), "a counter that is no number: %r" % e)


def check_workload(doc):
    """Device 0's first 128 block events are step 1 of `unimem stats`: 16
    rounds of four allocations (4 KiB, 64 KiB, 1 MiB, 10 MiB) under the tag
    churn, then their four releases; in time order."""
    blocks = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] in ("alloc", "release") and e["pid"] == 0]
    need(len(blocks) >= 128, "%d block events on device 0" % len(blocks))
    sizes = [4 * KiB, 64 * KiB, MiB, 10 * MiB]
    want = []
    for _ in range(16):
        want += [("alloc", s) for s in sizes] + [("release", s) for s in sizes]
    got = [(e["cat"], e["args"]["bytes"]) for e in blocks[:128]]
    need(got == want, "device 0's first events are not step 1's: %r" % got[:12])
    need(all(e["args"]["tag"] == "churn" for e in blocks[:128]), "step 1 is not all tagged churn")
    need(all(blocks[i]["ts"] <= blocks[i + 1]["ts"] for i in range(127)), "the events are not in time order")
    first = blocks[0]["args"]
    need(first["how"] == 1, "the first allocation did not call the device")
    need(blocks[4 * 2]["args"]["how"] == 0, "round 2 was not served by the pool")
    copies = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "copy"]
    need(len(copies) >= 3, "the workload's copies are missing (%d)" % len(copies))


def live_at(doc, instant):
    """Blocks allocated at or before instant and not released by then, per device."""
    live = {}
    for e in doc["traceEvents"]:
        if e["ph"] != "i" or e["cat"] not in ("alloc", "release"):
            continue
        key = (e["pid"], e["args"]["address"])
        if e["cat"] == "alloc" and e["ts"] <= instant:
            live[key] = e
        elif e["cat"] == "release" and e["ts"] <= instant and key in live and live[key]["ts"] <= e["ts"]:
            del live[key]
    return len(live)


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    hist, page, shot = (os.path.join(work, n) for n in ("history.json", "page.html", "page.png"))
    subprocess.run([tool, "stats", "--history", hist], check=True, stdout=subprocess.DEVNULL)
    with open(hist) as f:
        doc = json.load(f)
    check_format(doc)
    check_workload(doc)
    ndev = len({e["pid"] for e in doc["traceEvents"] if e["ph"] == "C"})
    subprocess.run([tool, "view", hist, "-o", page], check=True, stdout=subprocess.DEVNULL)
    text = open(page).read()
    need(not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://", text.split('id="unimem-data"')[0]),
         "the page loads something from elsewhere")

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("check_view: SKIP: no chromium here (apt-get install chromium): the page was not loaded")
        sys.exit(77)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", "--window-size=1200,1400"]
    url = "file://" + os.path.abspath(page)
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    errors = [l for l in dom.stderr.splitlines() if "CONSOLE" in l and ("Uncaught" in l or "Error" in l)]
    need(not errors, "errors in the browser's console: %s" % errors[:3])
    body = re.search(r"<body([^>]*)>", dom.stdout)
    need(body is not None, "no body in the DOM the browser gave")
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
    need(attrs.get("status") == "ok", "the page says %r" % attrs.get("status"))
    lanes = len(re.findall(r'<div class="lane" data-device=', dom.stdout))
    need(lanes == ndev and attrs.get("lanes") == str(ndev), "%d lanes for %d devices" % (lanes, ndev))
    instant = float(attrs["instant-us"])
    want = live_at(doc, instant)
    got = len(re.findall(r'class="block"', dom.stdout))
    need(got == want and want > 0, "%d blocks drawn at %.3f us, %d live then" % (got, instant, want))
    need(len(re.findall(r'<tr class="largest">', dom.stdout)) == min(10, want), "the largest-blocks table")
    subprocess.run(flags + ["--screenshot=" + shot, url], capture_output=True, timeout=120)
    need(os.path.exists(shot), "no screenshot")
    with open(shot, "rb") as f:
        png = f.read()
    need(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, "the screenshot is no real picture (%d bytes)" % len(png))
    print("check_view: ok: %d events, %d lanes, %d blocks at %.1f us, screenshot %s (%d bytes)"
          % (len(doc["traceEvents"]), lanes, got, instant, shot, len(png)))


if __name__ == "__main__":
    main()
