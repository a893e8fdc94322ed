"""Protocol models of the three-warpgroup kernels of MOSAIC_GPU.md Sec. 56-58 (CPU, pure Python).

``kernel_mosaic_gpu_rs`` (``forward="fused_rs"``: the forward-only form, the residual form with
``residual_from="output"`` and ``"state"``, and the timing ablations) and
``kernel_mosaic_gpu_maps_x`` (the maps and passes from zero in one launch, with and without
``piece_skip``, with ``K = V`` and ``K != V``). The interpreter never runs the GPU code path of
these kernels (register-LHS ``wgmma``, ``RefUnion``, transposed views: MOSAIC_GPU.md Sec. 56.1),
so a race or a deadlock in that path can only be found by a model. Each model lists every
warpgroup's mbarrier waits / arrivals, SMEM writes / reads, async-proxy fences and TMA stores
in program order, **as the GPU path of the kernel code issues them** (the comments name the
lines at the commit that added this file; ``rs.py`` is ``kernel_mosaic_gpu_rs.py``, ``mx.py``
``kernel_mosaic_gpu_maps_x.py``, ``mgl.py`` ``common/mosaic_gpu_lib.py``).

The checker (:func:`_check`) is exact rather than sampled: it builds the happens-before order
(program order plus "the arrivals completing phase ``p`` of a barrier precede every wait for
phase ``p``", the phase of a wait or an arrival being its warpgroup's count of earlier waits or
arrivals on that barrier, as Mosaic GPU tracks it) with vector clocks, so each condition holds
under **every** schedule, not only sampled ones (``kernel_mosaic_gdn_t0_test._check_split_protocol``
samples). It reports:

* ``deadlock``: a wait for a phase whose arrivals never come, or a cycle;
* ``lapped``: a wait that need not run before its barrier completes the next phase (its parity
  would be back where it waited: a hang or a stale pass on the GPU);
* ``early``: an arrival that may land before the previous phase of its barrier completed;
* ``still read``: a write to an SMEM location (ring stage, published tile, staging tile,
  the ``RefUnion`` aliases) not ordered after the end of every read of the previous contents,
  including reads by ``wgmma`` (until its wait) and by TMA stores (until the bulk group's read
  wait);
* ``unwritten``: a read not ordered after the write of the contents it reads;
* ``unfenced``: an async-proxy read (``wgmma``, TMA store) of data a generic store wrote, with
  no ``commit_smem`` of the writer between the write and the read;
* ``in flight at exit``: TMA stores not waited for before the warpgroup's final barrier.

The whole file runs in well under a second.
"""

import itertools
import os

from absl.testing import absltest, parameterized

_RS_STAGES = (2, 3)  # kernel_mosaic_gpu_rs.RS_STAGES (the models import no jax)
_MAPS_X_STAGES = 2  # mgl.STAGES, the ring of kernel_mosaic_gpu_maps_x
_CHUNKS = range(1, 8)


class _Wg:
    """One warpgroup's program: events ``(kind, name, index, proxy)``. ``W``/``A``: a wait or
    an arrival on barrier ``name`` slot ``index``; ``X``: a write of buffer ``name``'s contents
    for chunk ``index``; ``R``/``E``: a read of them starts / ends; ``F``: ``commit_smem``.
    ``proxy``: ``"g"`` generic (``ld``/``st.shared``, ``ldmatrix``) or ``"a"`` async (TMA,
    ``wgmma``). TMA stores are tracked in bulk groups as ``copy_smem_to_gmem`` /
    ``wait_smem_to_gmem`` do."""

    def __init__(self):
        self.ev, self.pending, self.groups, self.inflight = [], [], [], []

    def wait(self, bar, slot):
        self.ev.append(("W", bar, slot, None))

    def arrive(self, bar, slot):
        self.ev.append(("A", bar, slot, None))

    def write(self, buf, n, proxy="g"):
        self.ev.append(("X", buf, n, proxy))

    def start(self, buf, n, proxy="g"):
        self.ev.append(("R", buf, n, proxy))

    def end(self, buf, n):
        self.ev.append(("E", buf, n, None))

    def read(self, buf, n, proxy="g"):  # a synchronous read (or a wgmma waited at once)
        self.start(buf, n, proxy)
        self.end(buf, n)

    def fence(self):
        self.ev.append(("F", None, None, None))

    def tma_load(self, buf, n, bar, slot):  # copy_gmem_to_smem: written, then the tx arrival
        self.write(buf, n, "a")
        self.arrive(bar, slot)

    def tma_load_own(self, buf, n, bar, slot, dma):
        """A copy this warpgroup issues and itself waits for (``mgl.entry_state``): the write
        lands in ``dma``'s program (the copy engine), ordered after the issue only."""
        self.arrive("issue", (buf, n))
        dma.wait("issue", (buf, n))
        dma.tma_load(buf, n, bar, slot)

    def tma_store(self, buf, n, commit=True):  # copy_smem_to_gmem(commit_group=commit)
        self.start(buf, n, "a")
        self.pending.append((buf, n))
        if commit:
            self.groups.append(self.pending)
            self.inflight.append(self.pending)
            self.pending = []

    def wait_stores(self, allowed, read_only=True):  # wait_smem_to_gmem(allowed, read_only)
        while len(self.groups) > allowed:
            for buf, n in self.groups.pop(0):
                self.end(buf, n)
        if not read_only:
            del self.inflight[:max(len(self.inflight) - allowed, 0)]

    def done(self):  # the kernel's last lines: all warpgroups arrive on `done` and wait
        self.ev.append(("S", "exit", len(self.inflight) + len(self.pending), None))
        self.arrive("done", 0)
        self.wait("done", 0)
        return self.ev


def _check(programs, arrivals, locations, where="", order_only=False):
    """Checks ``programs`` (one event list per warpgroup) under every schedule (module
    docstring). ``arrivals``: per barrier, the arrivals that complete a phase; ``locations``:
    ``(buf, n) -> [(location, order)]``, the SMEM bytes each buffer's contents occupy
    (aliases share a location) and their order among a location's writes. ``order_only``:
    after the deadlock check, return the happens-before relation ``hb(a, b)`` of events
    ``(warpgroup, index)`` instead of checking the rest."""
    nwg = len(programs)
    # 1. Phases, from each warpgroup's own count (schedule-free).
    phase, arr_of, counts = {}, {}, {}
    for w, prog in enumerate(programs):
        for i, (kind, name, idx, _) in enumerate(prog):
            if kind == "S" and idx:
                raise AssertionError(f"{where}: wg {w}: {idx} TMA stores in flight at exit")
            if kind in "WA":
                key = (w, kind, name, idx)
                phase[w, i] = counts.get(key, 0)
                counts[key] = phase[w, i] + 1
                if kind == "A":
                    arr_of.setdefault((name, idx, phase[w, i]), []).append((w, i))
    for (name, idx, p), arrs in arr_of.items():  # fewer: a wait for it deadlocks (below)
        if len(arrs) > arrivals[name]:
            raise AssertionError(f"{where}: {name}[{idx}] phase {p} gets {len(arrs)} arrivals, "
                                 f"not {arrivals[name]}")
    # 2. One schedule to a vector clock per event (any schedule gives the same clocks).
    clock, pcs, last = {}, [0] * nwg, [[0] * nwg for _ in range(nwg)]
    while any(pc < len(p) for pc, p in zip(pcs, programs)):
        moved = False
        for w, prog in enumerate(programs):
            while pcs[w] < len(prog):
                i = pcs[w]
                kind, name, idx, _ = prog[i]
                vc = list(last[w])
                if kind == "W":
                    arrs = arr_of.get((name, idx, phase[w, i]), [])
                    if len(arrs) < arrivals[name] or any(a not in clock for a in arrs):
                        break
                    for a in arrs:
                        vc = [max(x, y) for x, y in zip(vc, clock[a])]
                vc[w] = i + 1
                clock[w, i] = last[w] = vc
                pcs[w] += 1
                moved = True
        if not moved:
            stuck = [p[pc][:3] if pc < len(p) else "end" for pc, p in zip(pcs, programs)]
            raise AssertionError(f"{where}: deadlock at {stuck}")

    def hb(a, b):  # event a (w, i) happens before event b (or is b) under every schedule
        return clock[b][a[0]] >= a[1] + 1

    if order_only:
        return hb

    def show(e):
        return f"wg {e[0]} {programs[e[0]][e[1]][:3]}"

    # 3. Laps and early arrivals.
    for (w, i), p in phase.items():
        kind, name, idx, _ = programs[w][i]
        nxt = arr_of.get((name, idx, p + 1), [])
        if kind == "W" and nxt and not any(hb((w, i), a) for a in nxt):
            raise AssertionError(f"{where}: {show((w, i))} phase {p} lapped")
        if kind == "A":
            for a in nxt:
                if not hb((w, i), a):
                    raise AssertionError(f"{where}: {show(a)} early (phase {p + 1})")
    # 4. SMEM: writes per location in order, the reads of each contents.
    writes, reads, fences = {}, {}, {}
    for w, prog in enumerate(programs):
        opened = {}
        for i, (kind, name, idx, proxy) in enumerate(prog):
            if kind == "X":
                if (name, idx) in writes:
                    raise AssertionError(f"{where}: {name}[{idx}] written twice")
                writes[name, idx] = (w, i, proxy)
            elif kind == "R":
                opened[name, idx] = opened.get((name, idx), 0) + 1
                reads.setdefault((name, idx), []).append(((w, i), proxy))
            elif kind == "E":
                if not opened.get((name, idx)):
                    raise AssertionError(f"{where}: wg {w} ends an unopened read {name}[{idx}]")
                opened[name, idx] -= 1
                reads.setdefault((name, idx), []).append(((w, i), "end"))
            elif kind == "F":
                fences.setdefault(w, []).append(i)
        if any(opened.values()):
            raise AssertionError(f"{where}: wg {w} leaves reads open: {opened}")

    def fenced(x, r):  # a commit_smem of the writer after the write, before the read
        return any(f > x[1] and hb((x[0], f), r) for f in fences.get(x[0], []))

    for label, evs in reads.items():
        if label not in writes:
            raise AssertionError(f"{where}: {label} read, never written")
        x = writes[label]
        for r, proxy in evs:
            if proxy == "end":
                continue
            if not hb(x[:2], r):
                raise AssertionError(f"{where}: {show(r)} unwritten (write {show(x[:2])})")
            if x[2] == "g" and proxy == "a" and not fenced(x, r):
                raise AssertionError(f"{where}: {show(r)} unfenced after {show(x[:2])}")
    by_loc = {}
    for label, x in writes.items():
        for loc, order in locations(*label):
            by_loc.setdefault(loc, []).append((order, label, x))
    for loc, ws in by_loc.items():
        ws.sort()
        for (_, prev, xp), (_, label, x) in zip(ws, ws[1:]):
            if not hb(xp[:2], x[:2]):
                raise AssertionError(f"{where}: {loc}: {label} unordered after {prev}")
            if xp[2] == "g" and x[2] == "a" and not fenced(xp, x[:2]):
                raise AssertionError(f"{where}: {loc}: TMA {label} unfenced after {prev}")
            for r, kind in reads.get(prev, []):
                if kind == "end" and not hb(r, x[:2]):
                    raise AssertionError(f"{where}: {loc}: {show(x[:2])} while {prev} is "
                                         f"still read ({show(r)})")


# ---------------------------------------------------------------------------------------------
# kernel_mosaic_gpu_rs (fused_rs)

# rs.py:630-636 (in_bar: the eleven TMA copies are one arrival here; "issue": a copy's start)
RS_ARRIVALS = {"in_bar": 1, "in_free": 2, "ag_ready": 1, "s_ready": 1, "s_free": 1,
               "io_bar": 1, "done": 3, "issue": 1}


def rs_locations(depth):
    def locations(buf, n):
        if buf in ("ring", "t0", "ag"):  # Ag_< is written over T0 in the stage (rs.py:369)
            name = "ring" if buf == "ring" else "t0"
            return [((name, n % depth), (n, buf != "t0"))]
        if buf == "stage":  # state_s: one RefUnion with both halves of sb_s (rs.py:627)
            return [(("sb", 0), (n, 1)), (("sb", 1), (n, 1))]
        return [((buf, n % 2), (n, 0))]  # sb, vn, o, hr, vr: double-buffered
    return locations


def rs_protocol(depth, num_chunks, store_h=False, store_v_new=False, residual_from="output",
                ablation="full", has_h0=True, protocol="joint"):
    """The GPU path of ``kernel_mosaic_gpu_rs._rs_kernel``: ``[state, output, memory, copy
    engine]``. ``protocol``: ``kernel_mosaic_gpu_rs.RS_PROTOCOLS`` (the output warpgroup's
    order only; MOSAIC_GPU.md Sec. 64)."""
    n_all = range(num_chunks)
    stores = store_h or store_v_new
    res_state = stores and residual_from == "state"  # rs.py:206
    out_stores = stores and not res_state  # rs.py:383
    mem, st, out, dma = _Wg(), _Wg(), _Wg(), _Wg()
    # memory: mgl.ring_producer (mgl.py:202-216) with kfused._t0_issuer (eleven copies)
    for i in n_all:
        if i >= depth:
            mem.wait("in_free", i % depth)  # mgl.py:212
        mem.write("t0", i, "a")
        mem.tma_load("ring", i, "in_bar", i % depth)
    for i in range(max(num_chunks - depth, 0), num_chunks):
        mem.wait("in_free", i % depth)  # mgl.py:215-216
    # state: rs.py:242-347
    if has_h0:  # mgl.entry_state: TMA of h0^T into state_s (aliases sb_s), io_bar, load
        st.tma_load_own("stage", -1, "io_bar", 0, dma)
        st.wait("io_bar", 0)
        st.read("stage", -1)
    for n in n_all:
        slot, half = n % depth, n % 2
        if n >= 2:
            st.wait("s_free", half)  # rs.py:256-258 (also frozen_step 329-331)
        if ablation == "readout":  # frozen_step, rs.py:326-340
            st.write("sb", n)
            st.write("vn", n)
            st.wait("in_bar", slot)
            st.wait("ag_ready", slot)
            st.fence()
            st.arrive("s_ready", half)
            st.arrive("in_free", slot)
            continue
        if res_state:
            st.wait_stores(1)  # rs.py:260-261
        st.write("sb", n)  # publish S^T (or S), rs.py:262-263
        st.wait("in_bar", slot)  # rs.py:264
        st.start("ring", n, "a")  # k_s (S^T K^T), v_s, vectors, rs.py:265-293
        st.wait("ag_ready", slot)  # rs.py:295
        st.read("ag", n, "a")  # X^T Ag_<^T, waited at rs.py:303
        st.write("vn", n)  # rs.py:306
        st.fence()  # rs.py:307
        st.arrive("s_ready", half)  # rs.py:308
        if res_state:  # rs.py:309-315
            if store_h:
                st.tma_store("sb", n, commit=not store_v_new)
            if store_v_new:
                st.tma_store("vn", n)
        st.end("ring", n)  # last_s, conn_s, k_s (the update, waited by _acc_plus), 318-322
        st.arrive("in_free", slot)  # rs.py:323
    for n in range(max(num_chunks - 2, 0), num_chunks):
        st.wait("s_free", n % 2)  # rs.py:343-344
    # mgl.store_state (mgl.py:141-150) with wait_stores=res_state, rs.py:347
    if res_state:
        st.wait_stores(0)
    st.write("stage", num_chunks)
    st.fence()
    st.tma_store("stage", num_chunks)
    st.wait_stores(0, read_only=False)

    # output: rs.py:349-480; protocol="ag_ahead" (Sec. 64): prepare(n + 1) before finish(n)
    def prepare(n):  # W in_bar, Q K^T with form_ag under it (prepare / state_only_prepare)
        slot = n % depth
        out.wait("in_bar", slot)  # rs.py:434 (state_only_step 376)
        out.start("ring", n, "a")  # q_s, k_s (Q K^T), vectors
        out.read("t0", n)  # form_ag: load_tile, rs.py:365
        out.write("ag", n)  # rs.py:369
        out.fence()  # rs.py:370
        out.arrive("ag_ready", slot)  # rs.py:371

    def finish(n):  # from W s_ready on (finish / state_only_finish)
        slot, half = n % depth, n % 2
        if ablation == "state":  # state_only_finish
            out.wait("s_ready", half)
            out.arrive("s_free", half)
            out.end("ring", n)
            out.arrive("in_free", slot)
            return
        out.wait("s_ready", half)  # rs.py:446
        if out_stores:
            out.wait_stores(1)  # rs.py:457-458
        out.start("sb", n, "a")  # Q S, rs.py:461 (transposed view of the published tile)
        out.start("vn", n, "a")  # P v_new, rs.py:462
        if out_stores:  # store_residuals, rs.py:407-429 (ldmatrix.trans, or I S on 0.10.2)
            for flag, src, dst in ((store_h, "sb", "hr"), (store_v_new, "vn", "vr")):
                if flag:
                    out.read(src, n, "g")
                    out.write(dst, n)
            out.fence()  # rs.py:423
            for flag, dst in ((store_h, "hr"), (store_v_new, "vr")):
                if flag:
                    out.tma_store(dst, n, commit=False)  # rs.py:424-429
        out.end("sb", n)  # the accumulators' reads, rs.py:465
        out.end("vn", n)
        out.end("ring", n)
        out.arrive("s_free", half)  # rs.py:469
        out.arrive("in_free", slot)  # rs.py:470
        if not out_stores:
            out.wait_stores(1)  # rs.py:472-473
        out.write("o", n)  # rs.py:474
        out.fence()  # rs.py:475
        out.tma_store("o", n)  # rs.py:476 (commits the chunk's group)

    if protocol == "joint":
        for n in n_all:
            prepare(n)
            finish(n)
    else:  # "ag_ahead": prepare(0); then prepare(n + 1), finish(n); finish(N - 1)
        prepare(0)
        for n in range(num_chunks - 1):
            prepare(n + 1)
            finish(n)
        finish(num_chunks - 1)
    out.wait_stores(0, read_only=False)  # rs.py:480
    return [st.done(), out.done(), mem.done(), dma.ev]


RS_FORMS = (
    dict(),  # forward only
    dict(store_h=True, store_v_new=True),  # RS_RESIDUALS, residual_from="output"
    dict(store_h=True),
    dict(store_v_new=True),
    dict(store_h=True, store_v_new=True, residual_from="state"),
    dict(store_h=True, residual_from="state"),
    dict(store_v_new=True, residual_from="state"),
    dict(ablation="state"),
    dict(ablation="readout"),
    dict(has_h0=False),
)
_RS_PROTOCOLS = ("joint", "ag_ahead")  # kernel_mosaic_gpu_rs.RS_PROTOCOLS
# every form under every protocol (ag_ahead takes all forms and ablations)
RS_FORMS_ALL = tuple(dict(form, protocol=p) if p != "joint" else form
                     for p in _RS_PROTOCOLS for form in RS_FORMS)


def _check_rs(model=rs_protocol, forms=RS_FORMS_ALL, depths=_RS_STAGES, chunks=_CHUNKS):
    for form, depth, num_chunks in itertools.product(forms, depths, chunks):
        _check(model(depth, num_chunks, **form), RS_ARRIVALS, rs_locations(depth),
               where=f"fused_rs {form}, {depth} stages, {num_chunks} chunks")


# ---------------------------------------------------------------------------------------------
# kernel_mosaic_gpu_maps_x

MAPS_X_ARRIVALS = {"in_bar": 1, "in_free": 2, "io_bar": 1, "done": 3, "issue": 1}  # mx.py:364-367


def maps_x_locations(depth):
    def locations(buf, n):
        if buf == "ring":
            return [(("ring", n % depth), (n, 0))]
        return [((buf, 0), (n, 0))]  # sbm, vdm, stm, sbx, vdx, stx: one buffer each
    return locations


def maps_x_protocol(depth, num_chunks, maps_on=True, x_on=True, cut=None):
    """The GPU path of ``kernel_mosaic_gpu_maps_x._maps_x_kernel`` for one CTA:
    ``[maps, local, memory, copy engine]``. ``maps_on`` / ``x_on``: whether block ``iv``
    carries the chain (mx.py:102-103); ``cut``: ``None`` without ``piece_skip``, else the
    piece's cut (mx.py:104-105)."""
    lo = 0 if cut is None else max(cut, 0)
    mem, mp, lc, dma = _Wg(), _Wg(), _Wg(), _Wg()
    # memory: mgl.ring_producer / ring_producer_from (mgl.py:202-241), mx.py:113-129
    if cut is None:
        first, refill, last = range(min(depth, num_chunks)), range(depth, num_chunks), range(
            max(num_chunks - depth, 0), num_chunks)
    else:
        first = [lo + i for i in range(depth) if lo + i < num_chunks]
        refill = range(lo + depth, num_chunks)
        last = [n for n in range(max(num_chunks - depth, 0), num_chunks) if lo <= n]
    for n in first:
        mem.tma_load("ring", n, "in_bar", n % depth)
    for n in refill:
        mem.wait("in_free", n % depth)
        mem.tma_load("ring", n, "in_bar", n % depth)
    for n in last:
        mem.wait("in_free", n % depth)

    def chain(wg, run, step):  # mx.py:138-146; release, mx.py:131-136
        hi = num_chunks if run else lo
        for n in range(lo, hi):
            step(n)
        for n in range(hi, num_chunks):
            wg.wait("in_bar", n % depth)
            wg.arrive("in_free", n % depth)

    def store_state(wg, buf):  # mgl.store_state, mgl.py:141-150 (wait_stores=True)
        wg.wait_stores(0)
        wg.write(buf, num_chunks)
        wg.fence()
        wg.tma_store(buf, num_chunks)
        wg.wait_stores(0, read_only=False)

    # maps: mx.py:148-191
    mp.tma_load_own("stm", -1, "io_bar", 0, dma)  # mgl.entry_state (both branches, mx.py:152-157)
    mp.wait("io_bar", 0)
    mp.read("stm", -1)

    def maps_step(n):  # mx.py:159-186
        mp.wait_stores(0)  # mx.py:161 (nothing in flight: a no-op)
        mp.write("sbm", n)  # mx.py:162
        mp.fence()  # mx.py:163
        mp.wait("in_bar", n % depth)  # mx.py:164
        mp.start("ring", n, "a")  # w_s, vectors, k_s
        mp.read("sbm", n, "a")  # W M, waited at mx.py:170
        mp.write("vdm", n)  # mx.py:176
        mp.fence()  # mx.py:177
        mp.read("vdm", n, "a")  # K^T (decayed -W M), waited at mx.py:184
        mp.end("ring", n)
        mp.arrive("in_free", n % depth)  # mx.py:185

    chain(mp, maps_on and (cut is None or cut < 0), maps_step)  # mx.py:151, 188
    if maps_on:
        store_state(mp, "stm")  # mx.py:191

    def local_step(n):  # mx.py:199-238
        lc.wait_stores(0)  # mx.py:201
        lc.write("sbx", n)  # mx.py:202
        lc.fence()  # mx.py:203
        lc.wait("in_bar", n % depth)  # mx.py:204
        lc.start("ring", n, "a")  # vectors, t0_s (generic loads), w_s, v_s (wgmma), k_s
        lc.read("sbx", n, "a")  # W X (with Ag V), waited at mx.py:223
        lc.write("vdx", n)  # mx.py:228
        lc.fence()  # mx.py:229
        lc.read("vdx", n, "a")  # K^T (decayed v_new), waited at mx.py:236
        lc.end("ring", n)
        lc.arrive("in_free", n % depth)  # mx.py:237

    chain(lc, x_on, local_step)  # mx.py:240
    if x_on:
        store_state(lc, "stx")  # mx.py:241
    return [mp.done(), lc.done(), mem.done(), dma.ev]


def _maps_x_forms(num_chunks):
    blocks = ((True, True), (True, False), (False, True))  # K = V; K > V, iv >= V/64; K < V
    cuts = (None, -1) + tuple(range(num_chunks))
    return [dict(maps_on=m, x_on=x, cut=c) for (m, x), c in itertools.product(blocks, cuts)]


def _check_maps_x(model=maps_x_protocol, depths=(_MAPS_X_STAGES, 3), chunks=_CHUNKS):
    for depth, num_chunks in itertools.product(depths, chunks):
        for form in _maps_x_forms(num_chunks):
            _check(model(depth, num_chunks, **form), MAPS_X_ARRIVALS, maps_x_locations(depth),
                   where=f"maps_x {form}, {depth} stages, {num_chunks} chunks")


def _without(model, wg, event, count=None):
    """``model`` with warpgroup ``wg``'s events whose first fields are ``event`` removed (all,
    or the first ``count``): a seeded bug."""
    def broken(*args, **kw):
        programs = model(*args, **kw)
        prog, kept, dropped = programs[wg], [], 0
        for e in prog:
            if e[:len(event)] == event and (count is None or dropped < count):
                dropped += 1
                continue
            kept.append(e)
        programs[wg] = kept
        return programs
    return broken


# The synchronization calls in each kernel's source when its model above was written from it. A
# change here means the kernel's protocol changed: update the model (and its line references),
# then these counts.
_KERNEL_SYNC_CALLS = {
    "kernel_mosaic_gpu_rs.py": {
        "barrier_wait(": 12, "barrier_arrive(": 10, "commit_smem(": 6, "copy_smem_to_gmem(": 5,
        "wait_smem_to_gmem(": 4, "copy_gmem_to_smem(": 0, "plgpu.Barrier(": 7,
        "entry_state(": 1, "store_state(": 1, "ring_producer": 1},
    "kernel_mosaic_gpu_maps_x.py": {
        "barrier_wait(": 4, "barrier_arrive(": 4, "commit_smem(": 4, "copy_smem_to_gmem(": 0,
        "wait_smem_to_gmem(": 2, "copy_gmem_to_smem(": 1, "plgpu.Barrier(": 4,
        "entry_state(": 2, "store_state(": 2, "ring_producer": 2},
}


class ProtocolTest(parameterized.TestCase):

    def test_models_match_the_kernels_synchronization_calls(self):
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.join(here, os.pardir, os.pardir, "pallas_kernels", "gated_delta_rule")
        for name, want in _KERNEL_SYNC_CALLS.items():
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
            got = {call: text.count(call) for call in want}
            self.assertEqual(got, want, msg=f"{name}'s synchronization changed: update its "
                             "protocol model in this file, then _KERNEL_SYNC_CALLS")

    def test_exact_check_passes_the_split_kernels_sampled_model(self):
        # The exact checker on kernel_mosaic_gdn_t0_test._split_protocol (every valid order,
        # stage ablation, protocol, depth, 1 to 7 chunks), which that file samples: it passes,
        # and the seeded s_free bug of test_split_protocol_check_finds_a_deadlock_and_a_race
        # is found. That model has no fences, and ends reads it never starts ("state").
        from pallas_kernels.gated_delta_rule import kernel_mosaic_gpu_fused as kfused
        from tests.pallas_kernels import kernel_mosaic_gdn_t0_test as t0_test

        def check(programs, depth):
            slots = {"in_bar": depth, "in_free": depth, "ag_ready": depth, "ring": depth,
                     "ag": depth}
            arrivals = {"in_bar": 1, "in_free": 2, "ag_ready": 1, "s_ready": 1, "s_free": 1,
                        "s_pub": 1, "done": 3}
            adapted = []
            for program in programs:
                wg, opened = _Wg(), set()
                for kind, name, n in program:
                    slot = n % slots.get(name, 2) if name != "done" else 0
                    if kind in "WA":
                        wg.ev.append((kind, name, slot, None))
                    elif kind == "X":
                        wg.write(name, n, "a")  # no fences in that model: not checked
                    else:
                        if kind == "E" and (name, n) not in opened:
                            wg.start(name, n, "a")
                        opened.add((name, n))
                        wg.ev.append((kind, name, n, "a" if kind == "R" else None))
                adapted.append(wg.ev)
            _check(adapted, arrivals, lambda buf, n: [
                ((buf, n % slots.get(buf, 2)), (n, 0))])

        for protocol, order, depth, num_chunks, stages in itertools.product(
                ("joint", "early_s"), kfused.SPLIT_ORDERS, kfused.SPLIT_STAGES, _CHUNKS,
                ("full", "io", "state", "readout")):
            if (protocol == "early_s" and stages != "full") or (
                    stages in ("state", "readout") and order != "state_ag"):
                continue  # refused by the kernel
            check(t0_test._split_protocol(order, depth, num_chunks, stages, protocol), depth)
        state, *others = t0_test._split_protocol("prepare_first", 2, 4)
        with self.assertRaisesRegex(AssertionError, "still read"):
            check([[e for e in state if e[:2] != ("W", "s_free")]] + others, 2)

    def test_fused_rs_protocol_is_safe(self):
        # Every form (forward only; h and v_new from the output or the state warpgroup; the
        # ablations; no h0), ring depths 2 and 3, 1 to 7 chunks: no deadlock, no lapped phase,
        # no early arrival, no SMEM location (ring stage, Ag over T0, published tiles, the
        # RefUnion'd fp32 staging, o / h / v_new staging) overwritten while read or read
        # before written or unfenced, no TMA store in flight at exit.
        _check_rs()

    @parameterized.parameters(2, 3)
    def test_fused_rs_coupling_edge(self, depth):
        # MOSAIC_GPU.md Sec. 64: the state warpgroup's W ag_ready[n] (before X^T Ag_<^T, on
        # its chain) under "joint" waits for the output warpgroup's read-out of chunk n - 1
        # (its A s_free[n - 1], after Q S_{n-1} and P v_new_{n-1}), which itself waits for
        # the state's A s_ready[n - 1]: the cycle that serialises the two warpgroups. Under
        # "ag_ahead" it waits only for the read-out of chunk n - 2.
        num_chunks = 6

        def nth(prog, event, k):  # index of the k-th event whose first fields are `event`
            return [i for i, e in enumerate(prog) if e[:len(event)] == event][k]

        for protocol, behind in (("joint", 1), ("ag_ahead", 2)):
            programs = rs_protocol(depth, num_chunks, protocol=protocol)
            hb = _check(programs, RS_ARRIVALS, rs_locations(depth), order_only=True)
            state, out = programs[0], programs[1]
            for n in range(2, num_chunks):
                wait_ag = (0, nth(state, ("W", "ag_ready", n % depth), n // depth))
                for m in (n - 1, n - 2):
                    freed = (1, nth(out, ("A", "s_free", m % 2), m // 2))
                    self.assertEqual(hb(freed, wait_ag), n - m >= behind,
                                     msg=f"{protocol}: read-out {m} before W ag_ready[{n}]")
                # W s_free[n - 2] (chunk n's first wait) is implied under "joint" by the
                # state's own earlier W ag_ready[n - 1]: a third published buffer would relax
                # nothing there; under "ag_ahead" it is a wait of its own.
                prev_ag = (0, nth(state, ("W", "ag_ready", (n - 1) % depth), (n - 1) // depth))
                freed = (1, nth(out, ("A", "s_free", n % 2), (n - 2) // 2))
                self.assertEqual(hb(freed, prev_ag), protocol == "joint", msg=protocol)

    def test_maps_x_protocol_is_safe(self):
        # Blocks with both chains and with one (K != V), with and without piece_skip at every
        # cut, ring depth 2 (the kernel's) and 3, 1 to 7 chunks.
        _check_maps_x()

    @parameterized.named_parameters(
        # ag_ahead: the output warpgroup never releases a stage (it holds two at a time)
        ("ah_no_release", 1, ("A", "in_free"), 1, "deadlock"),
        # ag_ahead: the state warpgroup reads Ag_< of chunk n + 1 before it was formed
        ("ah_no_ag_ready", 0, ("W", "ag_ready"), None, "unwritten"),
        # ag_ahead: Ag_< published without commit_smem (the fence before ag_ready)
        ("ah_no_ag_fence", 1, ("F",), 1, "unfenced"),
        # ag_ahead: republishing S^T over a tile the read-out of chunk n - 2 still reads
        ("ah_no_s_free", 0, ("W", "s_free"), 1, "still read|lapped"),
    )
    def test_fused_rs_ag_ahead_check_finds_seeded_bugs(self, wg, event, count, error):
        with self.assertRaisesRegex(AssertionError, error):
            _check_rs(_without(rs_protocol, wg, event, count),
                      forms=(dict(protocol="ag_ahead"),), chunks=(3, 5))

    @parameterized.named_parameters(
        # the state warpgroup publishes over a tile the output warpgroup still reads
        ("rs_no_s_free", 0, ("W", "s_free"), 1, {}, "still read|lapped"),
        # the final state's staging (RefUnion with sb_s) while the last S^T is read
        ("rs_no_last_s_free", 0, ("W", "s_free"), None, {}, "still read"),
        # S^T / v_new^T published without commit_smem before wgmma reads them
        ("rs_no_fence", 0, ("F",), None, {}, "unfenced"),
        # the output warpgroup never releases a stage: the ring stops
        ("rs_no_release", 1, ("A", "in_free"), 1, {}, "deadlock"),
        # the memory warpgroup refills without waiting: a consumer's in_bar phase laps
        ("rs_no_refill_wait", 2, ("W", "in_free"), 1, {}, "lapped|early|still read"),
        # the state warpgroup reads Ag_< before the output warpgroup wrote it
        ("rs_no_ag_ready", 0, ("W", "ag_ready"), None, {}, "unwritten"),
        # h0 read before its copy landed
        ("rs_no_io_bar", 0, ("W", "io_bar"), None, {}, "unwritten"),
    )
    def test_fused_rs_check_finds_seeded_bugs(self, wg, event, count, form, error):
        with self.assertRaisesRegex(AssertionError, error):
            _check_rs(_without(rs_protocol, wg, event, count), forms=(form,), chunks=(3, 5))

    @parameterized.named_parameters(
        # residual_from="state": republishing S while chunk n - 2's TMA store reads the tile
        # (rs.py:260-261)
        ("state", dict(store_h=True, store_v_new=True, residual_from="state"), "sb"),
        # residual_from="output": staging h while chunk n - 2's store reads it (rs.py:457-458)
        ("output", dict(store_h=True, store_v_new=True), "hr"),
        # the forward only: o's tile (rs.py:472-473)
        ("forward", dict(), "o"),
    )
    def test_fused_rs_check_finds_a_dropped_store_wait(self, form, buf):
        # wait_smem_to_gmem(1, read_only) inside the loop dropped (the final waits kept): the
        # staging or published tile is written while a TMA store still reads it.
        def no_wait(depth, num_chunks, **kw):
            with absltest.mock.patch.object(_Wg, "wait_stores", _final_store_waits_only):
                return rs_protocol(depth, num_chunks, **kw)
        with self.assertRaisesRegex(AssertionError, rf"\('{buf}', 0\).*still read"):
            _check_rs(no_wait, forms=(form,), chunks=(3,))

    @parameterized.named_parameters(
        ("maps_no_fence", 0, ("F",), 1, "unfenced"),
        ("local_no_release", 1, ("A", "in_free"), 1, "deadlock"),
        ("local_no_in_bar", 1, ("W", "in_bar"), 1, "unwritten|lapped|early"),
        ("maps_no_io_bar", 0, ("W", "io_bar"), 1, "unwritten"),
        ("memory_no_refill_wait", 2, ("W", "in_free"), 1, "lapped|early|still read"),
    )
    def test_maps_x_check_finds_seeded_bugs(self, wg, event, count, error):
        with self.assertRaisesRegex(AssertionError, error):
            _check_maps_x(_without(maps_x_protocol, wg, event, count), depths=(2,),
                          chunks=(3, 4))


_WAIT_STORES = _Wg.wait_stores


def _final_store_waits_only(self, allowed, read_only=True):
    if allowed == 0:
        _WAIT_STORES(self, allowed, read_only)


if __name__ == "__main__":
    absltest.main()
