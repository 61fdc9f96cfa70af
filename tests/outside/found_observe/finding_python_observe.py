# FINDING (Python binding, observe API): dropping History/Tag objects and managers at odd moments.
# Checks: an exception inside `with m.history()` / `with m.tag()` still stops/pops and keeps the counts;
# h.events() after `del m` (History keeps the manager alive: works); h.events()/h.save()/m.tag_stats()/
# m.snapshot() after m.close() raise InvalidState (clean); bad names raise InvalidArgument/TypeError; a
# nested m.history() raises InvalidState.
# Surprising: a `with m.tag("t"):` block inside which the manager is closed raises InvalidState from
# Tag.__exit__ (um_tag_pop on a closed manager), which would replace an exception already propagating.
# Promise: guide "Python": `with m.tag(...)`, `with m.history() as h`; Tag.__exit__ "Close it
# (um_tag_pop), whatever ended the block".
# Run (from /work/main):
#   LD_PRELOAD=$(clang -print-resource-dir)/lib/linux/libclang_rt.asan-x86_64.so ASAN_OPTIONS=detect_leaks=0 \
#   PYTHONMALLOC=malloc PYTHONPATH=build-h/python POCL_DEVICES=pthread UNIMEM_BACKENDS=cpu,opencl \
#   /usr/bin/python3 tests/outside/found_observe/finding_python_observe.py
# Printed: snapshot tags of live blocks: ['boom', ''] / events after del m: 2 / events|save|tag_stats|
#   snapshot after close raised InvalidState UM_ESTATE: the manager is closed / tag exit after close raised
#   InvalidState ... / tag '' raised InvalidArgument / nested history raised InvalidState / ok  (exit 0; no ASan report)
import gc, json, os, sys, unimem
bad = 0
def check(c, msg):
    global bad
    if not c: bad = 1; print("FAIL:", msg)
m = unimem.Manager()
# exception inside with tag / history
try:
    with m.history() as h:
        with m.tag("boom"):
            b = m.alloc(4096)
            raise ValueError("x")
except ValueError:
    pass
check(m.tag_stats()["boom"]["bytes_in_use"] == 4096, "tag stats after exception %r" % m.tag_stats().get("boom"))
ev = h.events(); check(any(e["tag"] == "boom" for e in ev), "events after exception")
# tag popped by exception: new alloc untagged
c = m.alloc(10)
snap = m.snapshot()
tags = [blk.get("tag") for blk in snap["blocks"] if blk.get("state") in ("in_use", 0)]
print("snapshot tags of live blocks:", tags)
b.release(); c.release()
h.save("/tmp/o/py-h.json"); json.load(open("/tmp/o/py-h.json"))
unimem.dump_snapshot(m, "/tmp/o/py-s.pickle", history=h)
# del m inside with m.history()
m2 = unimem.Manager()
hh = m2.history(); hh.start()
x = m2.alloc(100); x.release()
del m2; gc.collect()
try:
    print("events after del m:", len(hh.events()))
except Exception as e:
    print("events after del m raised", type(e).__name__, e)
try: hh.stop()
except Exception as e: print("stop after del m raised", type(e).__name__, e)
del hh; gc.collect()
# h.events() after m.close()
m3 = unimem.Manager()
with m3.history() as h3:
    y = m3.alloc(100); y.release()
m3.close()
for what, f in (("events", h3.events), ("save", lambda: h3.save("/tmp/o/py-closed.json")), ("tag_stats", m3.tag_stats), ("snapshot", m3.snapshot)):
    try: r = f(); print(what, "after close ->", type(r).__name__, len(r) if hasattr(r, "__len__") else r)
    except Exception as e: print(what, "after close raised", type(e).__name__, e)
try:
    with m3.tag("after"): pass
    print("tag after close: no error")
except Exception as e: print("tag after close raised", type(e).__name__, e)
# exit the tag of a closed manager
m4 = unimem.Manager()
t = m4.tag("t"); t.__enter__(); m4.close()
try: t.__exit__(None, None, None); print("tag exit after close: ok")
except Exception as e: print("tag exit after close raised", type(e).__name__, e)
# odd names
m5 = unimem.Manager()
for nm in ["", "x" * 64, "é" * 40, "a\"b\\c\n", 123, None]:
    try:
        with m5.tag(nm): pass
        print("tag %r accepted" % (nm,))
    except Exception as e: print("tag %r raised %s" % (nm if not isinstance(nm, str) or len(nm) < 20 else nm[:5] + "...", type(e).__name__))
# history inside history
with m5.history() as a:
    try:
        with m5.history() as b2: pass
        print("nested history: no error")
    except Exception as e: print("nested history raised", type(e).__name__)
m5.close()
print("FAILED" if bad else "ok")
sys.exit(bad)
