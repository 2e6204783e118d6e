"""`distbench p2p`: ring and ping-pong over the size sweep, and the pairwise link matrix (every
ordered pair measured alone while the others wait, one-way and bidirectional) with outliers
judged against their own class of link."""

from __future__ import annotations

import torch

from distbench import session as session_mod
from distbench.accounting import bandwidth, layout
from distbench.links import Link, culprits, find_outliers
from distbench.measure import fail_if_wrong, measure_case, stats_columns
from distbench.memory import allocate_fitting
from distbench.ops import p2p
from distbench.ops.dtypes import TORCH_DTYPES, element_size
from distbench.results import MATRIX_COLUMNS, P2P_COLUMNS
from distbench.sizes import format_size

EXIT_SLOW_LINK = 4


def run(opts) -> int:
    return session_mod.run("p2p", opts, _sweep)


def _sweep(s: session_mod.Session) -> int:
    rt, opts = s.rt, s.opts
    bad: list[str] = []
    patterns = [p for p in ("ring", "pingpong") if p in opts.patterns]
    steps = len(opts.sizes) * len(opts.dtypes) * (
        len(patterns) + (2 * rt.world * (rt.world - 1) if "matrix" in opts.patterns else 0))
    s.console.start_progress(steps)
    if patterns:
        sink = s.csv("p2p.csv", P2P_COLUMNS)
        for pattern in patterns:
            for dtype in opts.dtypes:
                _pattern_sweep(s, pattern, dtype, sink, bad)
    code = session_mod.EXIT_OK
    if "matrix" in opts.patterns:
        code = _matrix(s, bad)
    s.console.stop_progress()
    fail_if_wrong(bad)
    return code


def _buffers(dtype: str, sizes: list[int], device):
    """Send and receive buffers for the largest size that fits on every rank, that size's
    element count (larger sizes are skipped), and the element size."""
    tdtype = TORCH_DTYPES[dtype]
    elt = element_size(dtype)
    counts = [size // elt for size in sizes if size >= elt]
    bufs, fitted = allocate_fitting(
        lambda c: (torch.empty(c, dtype=tdtype, device=device),
                   torch.empty(c, dtype=tdtype, device=device)), counts or [1], device)
    send, recv = bufs if bufs else (None, None)
    return send, recv, fitted, elt


def _pattern_sweep(s, pattern: str, dtype: str, sink, bad: list[str]) -> None:
    rt, opts, console = s.rt, s.opts, s.console
    n = rt.world
    pairs = n // 2 if pattern == "pingpong" else n
    console.section(f"p2p {pattern}  {dtype}  ranks {n}  nodes {rt.nnodes}  backend "
                    f"{rt.backend}" + ("  (time = one-way latency, half the round trip)"
                                       if pattern == "pingpong" else ""))
    send, recv, fitted, elt = _buffers(dtype, opts.sizes, rt.device)
    for size in opts.sizes:
        lay = layout("sendrecv", size, elt, n)
        row = {"pattern": pattern, "dtype": dtype, "world_size": n, "nnodes": rt.nnodes,
               "pairs": pairs, "size_bytes": lay.size_bytes if lay else size,
               "count": lay.count if lay else 0, "backend": rt.backend, "status": "ok",
               "note": ""}
        if lay is None:
            row.update(status="skipped", note=f"too small: needs at least {elt} B of {dtype}")
        elif lay.count > fitted:
            row.update(status="skipped", note="does not fit in device memory")
        else:
            c = lay.count
            what = f"p2p {pattern} {format_size(lay.size_bytes)} {dtype}"
            console.working_on(what)
            if pattern == "ring":
                case = p2p.ring(rt.rank, n, send[:c], recv[:c])
            else:
                case = p2p.pingpong(rt.rank, n, send[:c])
            st = measure_case(s, case, what, size, scale=0.5 if pattern == "pingpong" else 1.0)
            algbw, busbw = bandwidth("sendrecv", lay.size_bytes, st.time_us / 1e6, n)
            row.update(stats_columns(st, opts.check), algbw_gbps=algbw, busbw_gbps=busbw)
            if st.wrong:
                bad.append(f"{what}: {st.wrong} wrong")
        sink.append(row)
        console.row({**row, "redop": "none", "root": -1, "in_place": False})
        console.advance()


def _matrix(s, bad: list[str]) -> int:
    rt, opts, console = s.rt, s.opts, s.console
    n = rt.world
    sink = s.csv("p2p_matrix.csv", MATRIX_COLUMNS)
    who = [f"{r['host']}:{r['local_rank']}" for r in rt.ranks]
    links: list[Link] = []
    for dtype in opts.dtypes:
        send, recv, fitted, elt = _buffers(dtype, opts.sizes, rt.device)
        for size in opts.sizes:
            lay = layout("sendrecv", size, elt, n)
            if lay is None or lay.count > fitted:
                why = "is too small for one" if lay is None else "does not fit in memory as"
                console.log(f"matrix: {size} B {why} {dtype}: skipped")
                continue
            c = lay.count
            for direction in ("uni", "bi"):
                grid: dict[tuple[int, int], float] = {}
                for src in range(n):
                    for dst in range(n):
                        if src == dst or (direction == "bi" and dst < src):
                            continue
                        arrow = "<->" if direction == "bi" else "->"
                        what = (f"p2p matrix {src}{arrow}{dst} {format_size(lay.size_bytes)} "
                                f"{dtype}")
                        console.working_on(what)
                        case = p2p.one_link(rt.rank, src, dst, direction == "bi", send[:c],
                                            recv[:c])
                        st = measure_case(s, case, what, size)
                        moved = lay.size_bytes * (2 if direction == "bi" else 1)
                        gbps = moved / (st.time_us / 1e6) / 1e9
                        grid[src, dst] = gbps
                        if direction == "bi":
                            grid[dst, src] = gbps
                        same_node = rt.ranks[src]["node"] == rt.ranks[dst]["node"]
                        link = Link(src, dst, who[src], who[dst],
                                    "intra" if same_node else "inter", direction,
                                    lay.size_bytes, gbps)
                        links.append(link)
                        if st.wrong:
                            bad.append(f"{what}: {st.wrong} wrong")
                        sink.append({
                            "direction": direction, "src_rank": src, "dst_rank": dst,
                            "src_host": rt.ranks[src]["host"],
                            "dst_host": rt.ranks[dst]["host"],
                            "src_local_rank": rt.ranks[src]["local_rank"],
                            "dst_local_rank": rt.ranks[dst]["local_rank"],
                            "link": link.link, "dtype": dtype, "world_size": n,
                            "nnodes": rt.nnodes, "size_bytes": lay.size_bytes, "count": c,
                            "iters": st.iters, "time_us": st.time_us, "p50_us": st.p50_us,
                            "p99_us": st.p99_us, "cv_pct": st.cv_pct, "gbps": gbps,
                            "wrong": st.wrong if opts.check else None,
                            "backend": rt.backend})
                        console.advance()
                        if direction == "bi":
                            console.advance()
                console.matrix(f"p2p matrix {direction} GB/s, {format_size(lay.size_bytes)} "
                               f"{dtype} (row = sender)", who, grid)
    return _judge(s, links)


def _judge(s, links: list[Link]) -> int:
    opts, console = s.opts, s.console
    outliers = find_outliers(links, opts.outlier_below)
    suspects = culprits(outliers)
    failing = find_outliers(links, opts.fail_below) if opts.fail_below else []
    if outliers:
        console.log(f"{len(outliers)} of {len(links)} links below "
                    f"{opts.outlier_below:.0%} of their class median:")
        for o in outliers[:20]:
            console.log(f"  slow link {o.describe()}")
        for name in suspects:
            console.log(f"  likely culprit: {name}")
    else:
        console.log(f"matrix: no link below {opts.outlier_below:.0%} of its class median "
                    f"({len(links)} links)")
    if s.record is not None:
        s.record.update(matrix={
            "outlier_below": opts.outlier_below, "links": len(links),
            "outliers": [o.describe() for o in outliers], "culprits": suspects,
            "fail_below": opts.fail_below, "failing": [o.describe() for o in failing]})
    if failing:
        raise session_mod.RunFailure(
            f"{len(failing)} links below --fail-below {opts.fail_below:.0%} of their class "
            f"median, the worst {failing[0].describe()}"
            + (f"; likely culprit {suspects[0]}" if suspects else ""),
            status="slow_links", exit_code=EXIT_SLOW_LINK)
    return session_mod.EXIT_OK
