#!/usr/bin/env python3
"""Write the seed corpus of tests/reliability/fuzz/fuzz_api.c into tests/reliability/fuzz/corpus/.

Deterministic (fixed seeds): rerunning it rewrites the same files. Each
seed is a program for fuzz_api.c: two configuration bytes, then
operations, each an operation byte followed by argument bytes (the
harness reads as many as the operation needs; any byte string is valid).
The seeds cover every configuration bit (debug quarantine, pooling off,
scrub, no pinned staging, worker counts, two fault devices, small device
memory, the asynchronous fault flavour) and lean on allocations first so that later operations find
buffers to work on. Scenario seeds at the end aim at one feature each;
the "destroy" ones end with two bytes chosen so that the harness ends
them by destroying the manager (a hash of the input, see fuzz_api.c).

    python3 tests/reliability/fuzz/make_corpus.py [OUT_DIR]
"""
import os
import random
import sys

# Operation bytes, as fuzz_api.c decodes them (byte % 20).
ALLOC, WRAP, RELEASE, H2D, D2H, COPY, FILL, MAP, UNMAP, BATCH, EVENT, STALE, VERIFY, FAULT, MISC = (
    0, 3, 4, 6, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19)
WEIGHTS = [(ALLOC, 6), (WRAP, 1), (RELEASE, 3), (H2D, 5), (D2H, 3), (COPY, 5), (FILL, 3),
           (MAP, 2), (UNMAP, 2), (BATCH, 2), (EVENT, 4), (STALE, 2), (VERIFY, 4), (FAULT, 1),
           (MISC, 1)]


def op(rng, kind, nargs=8):
    return bytes([kind + 20 * rng.randrange(12)]) + bytes(rng.randrange(256) for _ in range(nargs))


def program(rng, c0, c1, nops, faults=True):
    out = bytearray([c0, c1])
    for _ in range(3):
        out += op(rng, ALLOC)
    kinds = [k for k, w in WEIGHTS for _ in range(w) if faults or k != FAULT]
    for _ in range(nops):
        out += op(rng, rng.choice(kinds))
    return bytes(out)


def fnv1a(data):
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def ending_by_destroy(data):
    """data and two more bytes, so that fuzz_api.c ends it by destroying
    its manager (FNV-1a of the input with top byte 0)."""
    for b1 in range(256):
        for b2 in range(256):
            out = data + bytes([b1, b2])
            if fnv1a(out) >> 24 == 0:
                return out
    raise AssertionError("no two-byte ending found")


def scenarios(rng):
    """A few programs aimed at one feature each."""
    yield "quarantine", program(rng, 0x01, 0x00, 40, faults=False)
    yield "quarantine_small_device", program(rng, 0x41, 0x04, 60)
    yield "no_pooling_scrub", program(rng, 0x06, 0x00, 40, faults=False)
    yield "pool_limits", program(rng, 0x30, 0x03, 60, faults=False)
    yield "peer_two_devices", program(rng, 0x40, 0x00, 60, faults=False)
    yield "no_staging", program(rng, 0x08, 0x00, 40, faults=False)
    # allocations, then many asynchronous copies and event operations
    out = bytearray([0x10, 0x00])
    for _ in range(5):
        out += op(rng, ALLOC)
    for _ in range(40):
        out += op(rng, rng.choice([H2D, COPY, FILL, EVENT, EVENT, BATCH]))
    yield "async_events", bytes(out)
    # faults early, then everything
    out = bytearray([0x20, 0x04])
    for _ in range(3):
        out += op(rng, ALLOC)
    out += op(rng, FAULT)
    for _ in range(50):
        out += op(rng, rng.choice([H2D, D2H, COPY, FILL, MAP, UNMAP, BATCH, EVENT, VERIFY, FAULT]))
    yield "faults", bytes(out)
    # the same mix on single-queue devices: "fault-queue" (batches go in
    # quiet runs behind queue marks, refused submissions fail behind a
    # mark) and "fault-inline" (completions inside the core's own call)
    for name, c1 in (("single_queue_faults", 0x0C), ("inline_faults", 0x14)):
        out = bytearray([0x60, c1])
        for _ in range(4):
            out += op(rng, ALLOC)
        out += op(rng, FAULT)
        for _ in range(50):
            out += op(rng, rng.choice([H2D, D2H, COPY, FILL, BATCH, BATCH, EVENT, VERIFY, FAULT]))
        yield name, bytes(out)
    # fills queued on a fault device whose events are released unwaited,
    # then the manager destroyed with them possibly still running. Written
    # byte by byte, as the harness reads them: ALLOC slot, device 1 (fault),
    # DEVICE, size selector 2 and 4000 (4001 bytes), no flags; FILL slot,
    # range [0, 4000), value 0x55, asynchronous; EVENT release unwaited.
    out = bytearray([0x30, 0x00])
    for i in range(5):
        out += bytes([ALLOC, i, 1, 1, 2, 0xA0, 0x0F, 0])
    for i in range(30):
        out += bytes([FILL, i % 5, 0, 0, 0, 0xFF, 0x0F, 0x55, 1, 1])
        out += bytes([EVENT, 3, 0])
    yield "destroy_in_flight", ending_by_destroy(bytes(out))
    yield "destroy_quarantine", ending_by_destroy(program(rng, 0x01, 0x00, 40, faults=False))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if name.startswith("seed_"):
            os.remove(os.path.join(out_dir, name))
    n = 0
    for i in range(32):
        rng = random.Random(1000 + i)
        c0 = (i & 0x0F) | ((i % 4) << 4) | (0x40 if i % 3 == 0 else 0)
        # c1 bits 0-2 in turn; bits 3-4 (the asynchronous fault flavour:
        # fault, fault-queue, fault-inline twice) by eights
        c1 = (i % 8) | ((i // 8) % 4) << 3
        data = program(rng, c0, c1, 20 + 4 * (i % 10))
        with open(os.path.join(out_dir, "seed_%02d" % i), "wb") as f:
            f.write(data)
        n += 1
    rng = random.Random(7)
    for name, data in scenarios(rng):
        with open(os.path.join(out_dir, "seed_" + name), "wb") as f:
            f.write(data)
        n += 1
    print("wrote %d seeds to %s" % (n, out_dir))


if __name__ == "__main__":
    main()
