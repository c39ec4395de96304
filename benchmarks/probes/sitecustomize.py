"""What holds an aiops process's event loop: put this directory first on PYTHONPATH and set

- `LOOP_PROBE_STALL_MS=40`: every loop callback longer than that is logged, with the main thread's
  stack sampled every 8 ms (or a quarter of the next setting) once the callback has run 20 ms (innermost frame first);
- `LOOP_PROBE_SAMPLE_MS=20`: how long a callback runs before its stack is sampled (default 20);
- `LOOP_PROBE_GC=1`: every collection of Python's cyclic collector of 1 ms or more;
- `LOOP_PROBE_YOUNG=1` (with GC): from 20 s after start, what each young collection walks (the
  objects allocated since the last one and alive), counted by type;
- `LOOP_PROBE_HOLDS=TypeName` (with GC): every 10 s from 20 s on, how many young objects of that
  type there are, and for four of them what holds them, four referrers deep (it unfreezes the
  permanent generation, which `gc.get_referrers` does not search: the process's collections change);
- `LOOP_PROBE_GARBAGE=1` (with GC): from 20 s after start, what a collection found in cycles,
  counted by type (`gc.DEBUG_SAVEALL` for one collection, then freed; again 5 s later);
- `LOOP_PROBE_FRAMES=1`: every frame a Textual screen draws, with its start, its length, whether
  it laid the screen out, and the widgets that asked for it (a layout's, else a repaint's);
- `LOOP_PROBE_FULL_MAP=1` (with FRAMES): every rebuild of the compositor's map of all widgets (the
  hidden ones too), its length and its caller, and the widgets out of sight that asked for a repaint
  (which throws that map away);
- `LOOP_PROBE_LAYOUT_WHO=1` (with FRAMES): under each layout frame, where each widget that asked
  for it asked (the first asking's callers);
- `LOOP_PROBE_RESTYLES=1` (with FRAMES): every ~5 s, the component classes Textual styled again
  (Textual's own method makes a virtual DOMNode per class each time, garbage in cycles once
  replaced; aiops/tui/cycles.py reuses them), counted by widget type and by where it was asked.

Lines go to /tmp/loop-probe-<pid>.log, for processes whose command line names aiops (the benchmarks'
consoles and servers inherit the environment; `AIOPS_*` variables are not passed on, hence the names).
Not for production: `asyncio.events.Handle._run` is wrapped. docs/PERFORMANCE.md, "Reproducing a
profile", says how it was used.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

_STALL_MS = float(os.environ.get("LOOP_PROBE_STALL_MS") or 0)
_GC = bool(os.environ.get("LOOP_PROBE_GC"))
_SAMPLE_AFTER = float(os.environ.get("LOOP_PROBE_SAMPLE_MS") or 20) / 1000
_FRAMES = bool(os.environ.get("LOOP_PROBE_FRAMES"))
_FULL_MAP = bool(os.environ.get("LOOP_PROBE_FULL_MAP"))
_WHO = bool(os.environ.get("LOOP_PROBE_LAYOUT_WHO"))
_GARBAGE = bool(os.environ.get("LOOP_PROBE_GARBAGE"))
_RESTYLES = bool(os.environ.get("LOOP_PROBE_RESTYLES"))
_YOUNG = bool(os.environ.get("LOOP_PROBE_YOUNG"))
_HOLDS = os.environ.get("LOOP_PROBE_HOLDS", "")
_who: dict[Any, str] = {}


def _names(widgets: Any, most: int = 6) -> str:
    names = sorted({f"{type(w).__name__}#{w.id}" if w.id else type(w).__name__ for w in widgets})
    return ",".join(names[:most]) + (f",+{len(names) - most}" if len(names) > most else "")


def _who_holds(out: Any, held: list[Any], depth: int = 4) -> None:
    """The chains of referrers above four of `held`, `depth` deep (frames and this probe's own
    lists left out)."""
    objects = held[:: max(1, len(held) // 4)][:4]
    skip = {id(objects), id(held)}
    for obj in objects:
        direct = [r for r in gc.get_referrers(obj) if id(r) not in skip]
        out.write(f"    REFS {sys.getrefcount(obj) - 4} beside the probe's, referrers: "
                  + ", ".join(type(r).__qualname__ + (f"({r.f_code.co_name})" if type(r).__name__ == "frame" else "")
                              for r in direct[:6]) + "\n")
        del direct
        level, seen = [obj], {id(obj)}
        for d in range(depth):
            above = []
            for o in level:
                for r in gc.get_referrers(o):
                    if id(r) in seen or id(r) in skip or type(r).__name__ == "frame" or r is level:
                        continue
                    seen.add(id(r))
                    above.append(r)
            if not above:
                break
            desc = ", ".join(sorted({type(r).__qualname__ + (f"(len {len(r)})" if isinstance(r, (list, dict, tuple, set)) else "")
                                     for r in above})[:8])
            out.write(f"    HELD{d + 1} {desc}\n")
            level = above[:6]
        out.write("    --\n")


def _restyles(out: Any) -> None:
    """Count the restyles of widgets' component classes by widget type and caller; log every ~5 s.

    Counted where Textual's `_process_component_classes` and the console's own (aiops/tui/cycles.py,
    installed later, over whatever is there then) both ask a widget for its component classes."""
    from textual.dom import DOMNode

    components = DOMNode.__dict__["_get_component_classes"].__func__
    kinds: Counter[str] = Counter()
    callers: Counter[str] = Counter()
    last = [time.monotonic()]

    def counted(cls: Any) -> frozenset[str]:
        classes: frozenset[str] = components(cls)
        if classes:
            kinds[cls.__name__] += len(classes)
            caller, where = sys._getframe(2), []
            while caller is not None and len(where) < 6:
                where.append(caller.f_code.co_name)
                caller = caller.f_back
            callers[" < ".join(where)] += len(classes)
        if time.monotonic() - last[0] > 5 and kinds:
            last[0] = time.monotonic()
            out.write(f"RESTYLES {last[0]:.3f} {sum(kinds.values())} component classes: "
                      + ", ".join(f"{k} {n}" for k, n in kinds.most_common(12)) + "\n")
            for where, n in callers.most_common(6):
                out.write(f"  FROM {n} {where}\n")
            kinds.clear()
            callers.clear()
        return classes

    DOMNode._get_component_classes = classmethod(counted)  # type: ignore[method-assign,assignment]


def _frames(out: Any) -> None:
    """Wrap `Screen._on_timer_update` (a frame) once Textual's screen module is imported."""
    import importlib.abc
    import importlib.util

    def wrap(module: Any) -> None:
        update = module.Screen._on_timer_update

        def timed(screen: Any) -> None:
            layout = screen._layout_required or screen._scroll_required
            asked = _names(screen._layout_widgets) if layout else _names(screen._dirty_widgets)
            if layout and _WHO:
                askers = {w for ws in screen._layout_widgets.values() for w in ws} | set(screen._layout_widgets)
                for widget in list(askers)[:8]:
                    if (where := _who.pop(widget, None)) is not None:
                        out.write(f"  WHO {type(widget).__name__}: {where}\n")
                _who.clear()
            t0 = time.monotonic()
            update(screen)
            ms = (time.monotonic() - t0) * 1000
            out.write(f"FRAME {t0:.4f} {ms:.1f}ms {'layout' if layout else 'paint'} {asked}\n")

        module.Screen._on_timer_update = timed
        if _RESTYLES:
            _restyles(out)
        if _WHO:
            from textual.widget import Widget

            refresh = Widget.refresh

            def asking(widget: Any, *regions: Any, repaint: bool = True, layout: bool = False,
                       recompose: bool = False) -> Any:
                if layout and widget not in _who:
                    caller, where = sys._getframe(1), []
                    while caller is not None and len(where) < 7:
                        where.append(f"{caller.f_code.co_name}:{caller.f_lineno}")
                        caller = caller.f_back
                    _who[widget] = " < ".join(where)
                return refresh(widget, *regions, repaint=repaint, layout=layout, recompose=recompose)

            Widget.refresh = asking  # type: ignore[method-assign]
        if not _FULL_MAP:
            return
        from textual._compositor import Compositor

        update_widgets = Compositor.update_widgets
        full_map = Compositor.full_map.fget

        def updating(compositor: Any, widgets: set[Any]) -> None:
            if not compositor._full_map_invalidated:
                hidden = widgets - compositor.visible_widgets.keys()
                if hidden:
                    out.write(f"HIDDEN {time.monotonic():.4f} {_names(hidden)}\n")
            update_widgets(compositor, widgets)

        def mapping(compositor: Any) -> Any:
            if not compositor._full_map_invalidated:
                return full_map(compositor)
            t0 = time.monotonic()
            result = full_map(compositor)
            caller = sys._getframe(1)
            where = []
            while caller is not None and len(where) < 5:
                where.append(f"{caller.f_code.co_name}:{caller.f_lineno}")
                caller = caller.f_back
            out.write(f"FULLMAP {t0:.4f} {(time.monotonic() - t0) * 1000:.1f}ms {len(result)} widgets "
                      f"{' < '.join(where)}\n")
            return result

        Compositor.update_widgets = updating  # type: ignore[method-assign]
        Compositor.full_map = property(mapping)  # type: ignore[assignment]

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "textual.screen":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def run(module: Any) -> None:
                exec_module(module)
                wrap(module)

            spec.loader.exec_module = run  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def _install() -> None:
    import asyncio.events

    out = open(f"/tmp/loop-probe-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115 - open for the process's life
    if _GC:
        started: dict[str, float] = {}

        def collected(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                if _YOUNG and info["generation"] == 0 and time.monotonic() > again["young"]:
                    # What a young collection walks (the objects allocated since the last one and
                    # still alive), by type: its cost, where there is little garbage.
                    kinds = Counter(type(o).__qualname__ for o in gc.get_objects(generation=0))
                    out.write(f"  YOUNG {sum(kinds.values())} objects: "
                              + ", ".join(f"{k} {n}" for k, n in kinds.most_common(25)) + "\n")
                started["t"] = time.perf_counter()
                return
            ms = (time.perf_counter() - started.get("t", time.perf_counter())) * 1000
            if ms >= 1:
                out.write(f"GC {time.monotonic():.3f} gen={info['generation']} {ms:.1f}ms "
                          f"collected={info['collected']}\n")
            if _GARBAGE and gc.garbage:  # what one collection found in cycles, by type; then freed
                gc.set_debug(0)
                kinds = Counter(type(o).__qualname__ for o in gc.garbage)
                out.write("  GARBAGE " + ", ".join(f"{k} {n}" for k, n in kinds.most_common(40)) + "\n")
                gc.garbage.clear()
                again["at"] = time.monotonic() + 5.0  # and again ~5 s later. No lock or thread
                # start in here: a collection can run in a thread holding it (Thread.start hung once)

        def sample_garbage() -> None:  # kept for the callback to read: from 20 s on, once start-up has settled
            while True:
                time.sleep(0.5)
                if again["at"] and time.monotonic() >= again["at"]:
                    again["at"] = 0.0
                    gc.set_debug(gc.DEBUG_SAVEALL)

        again = {"at": time.monotonic() + 20.0, "young": time.monotonic() + 20.0}
        gc.callbacks.append(collected)
        if _GARBAGE:
            threading.Thread(target=sample_garbage, daemon=True, name="loop-probe-garbage").start()
        if _HOLDS:

            def sample_holders() -> None:
                time.sleep(20.0)
                while True:
                    gc.unfreeze()  # get_referrers does not search the permanent generation: put it back
                    held = [o for o in gc.get_objects(generation=0) if type(o).__qualname__ == _HOLDS]
                    out.write(f"  HOLDS {time.monotonic():.3f} {len(held)} young {_HOLDS}\n")
                    _who_holds(out, held)
                    del held
                    time.sleep(10.0)

            threading.Thread(target=sample_holders, daemon=True, name="loop-probe-holds").start()
    if _FRAMES:
        _frames(out)
    if not _STALL_MS:
        return
    current: dict[str, Any] = {"t": 0.0, "samples": []}
    main = threading.main_thread().ident
    run = asyncio.events.Handle._run

    def timed_run(self: asyncio.events.Handle) -> None:
        current["samples"] = []
        t0 = current["t"] = time.perf_counter()
        try:
            run(self)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            current["t"] = 0.0
            if ms > _STALL_MS:
                callback = getattr(self, "_callback", None)
                out.write(f"STALL {time.monotonic():.3f} {ms:.1f}ms {callback!r:.150}\n")
                for sample in current["samples"]:
                    out.write(f"  S {sample}\n")

    def sample() -> None:
        while True:
            time.sleep(min(0.008, _SAMPLE_AFTER / 4))
            t0 = current["t"]
            if t0 and time.perf_counter() - t0 > _SAMPLE_AFTER:
                frame = sys._current_frames().get(main)  # noqa: SLF001 - the one way to see another thread's stack
                if frame is not None:
                    names = [f"{os.path.basename(f.filename)}:{f.name}" for f in traceback.extract_stack(frame)[-40:]]
                    current["samples"].append(f"{(time.perf_counter() - t0) * 1000:.0f} " + " < ".join(reversed(names)))

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    threading.Thread(target=sample, daemon=True, name="loop-probe").start()


if (_STALL_MS or _GC or _FRAMES) and "aiops" in " ".join(sys.argv):
    _install()
