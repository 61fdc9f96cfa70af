#!/usr/bin/env python3
"""Check the report `unimem bench --json FILE` wrote: strict JSON (no NaN or
Infinity), the merged report's keys, and one benchmark's entry: its status,
its report's facts and rows.

  check_report.py FILE BENCH STATUS [TABLE:KEY ...]

Each TABLE:KEY asks for a row of table TABLE in BENCH's report with a value
under KEY. Exit 0, or 1 with what is wrong."""
import json
import math
import sys


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def reject_constant(name):
    fail(f"not JSON: {name}")


def expect(obj, key, kind, where):
    if not isinstance(obj, dict) or key not in obj:
        fail(f"{where}: no \"{key}\"")
    value = obj[key]
    # bool is an int in Python: a number must not be a bool
    if not isinstance(value, kind) or (kind in ((int, float), int) and isinstance(value, bool)):
        fail(f"{where}: \"{key}\" is {value!r}, not {kind}")
    return value


def check_merged(doc):
    if expect(doc, "tool", str, "report") != "unimem bench":
        fail("\"tool\" is not \"unimem bench\"")
    for key in ("version", "date"):
        expect(doc, key, str, "report")
    expect(doc, "quick", bool, "report")
    machine = expect(doc, "machine", dict, "report")
    expect(machine, "arch", str, "machine")
    expect(machine, "kernel", str, "machine")
    expect(machine, "cpus", int, "machine")
    devices = expect(doc, "devices", list, "report")
    if not devices or devices[0].get("index") != 0 or devices[0].get("backend") != "cpu":
        fail(f"devices: device 0 is not the cpu: {devices[:1]}")
    for d in devices:
        for key, kind in (("index", int), ("backend", str), ("name", str), ("caps", int),
                          ("locations", int), ("total_bytes", int)):
            expect(d, key, kind, "device")
    return expect(doc, "benchmarks", list, "report")


def check_rows(rows, bench):
    if not rows:
        fail(f"{bench}: no rows")
    for row in rows:
        where = f"{bench} row {row.get('name')!r}"
        expect(row, "table", str, where)
        expect(row, "name", str, where)
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value) or value < 0:
                    fail(f"{where}: \"{key}\" is {value}")


def main():
    if len(sys.argv) < 4:
        fail("usage: check_report.py FILE BENCH STATUS [TABLE:KEY ...]")
    path, bench, status = sys.argv[1:4]
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f, parse_constant=reject_constant)
        except json.JSONDecodeError as e:
            fail(f"{path} is not JSON: {e}")
    entries = [b for b in check_merged(doc) if b.get("name") == bench]
    if len(entries) != 1:
        fail(f"{len(entries)} entries for benchmark {bench}")
    entry = entries[0]
    if expect(entry, "status", str, bench) != status:
        fail(f"{bench}: status {entry['status']!r}, expected {status!r}")
    expect(entry, "exit_status", int, bench)
    expect(entry, "seconds", (int, float), bench)
    report = expect(entry, "report", dict, bench)
    if expect(report, "bench", str, f"{bench} report") != bench:
        fail(f"{bench}: the report says it is {report['bench']!r}")
    expect(report, "quick", bool, f"{bench} report")
    expect(report, "device", str, f"{bench} report")
    rows = expect(report, "rows", list, f"{bench} report")
    check_rows(rows, bench)
    for want in sys.argv[4:]:
        table, key = want.split(":", 1)
        if not any(r["table"] == table and key in r for r in rows):
            fail(f"{bench}: no row of table {table!r} with {key!r}")
    print(f"PASS: {path}: {bench} {status}, {len(rows)} rows, {', '.join(sys.argv[4:]) or 'no keys asked'}")


main()
