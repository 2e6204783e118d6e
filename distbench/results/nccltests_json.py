"""The JSON file nccl-tests writes with -J (util.cu, JSON_FILE_VERSION 2) read into a run
(nccltests_runs.py). No torch here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from distbench.core.errors import ReadError
from distbench.results.nccltests_runs import (
    NcclPlacement,
    NcclRun,
    NcclSize,
    as_whole,
    as_wrong_count,
)

# util.cu prints a double with "%lf", which writes an infinity as bare inf, not JSON.
_BARE_INF = re.compile(r"(?<=[:,\[])\s*-?inf(?=\s*[,}\]])")


def json_run(path: Path, text: str) -> NcclRun:
    def bad(what: str) -> ReadError:
        return ReadError(path, f"{what}; expected the JSON file nccl-tests writes with -J")

    try:
        doc = json.loads(_BARE_INF.sub("null", text))
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise bad("JSON without a 'results' list")
    test = NcclRun()
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        test.program = args[0]
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    iters = as_whole(config.get("iterations"))
    if iters is not None:
        test.iters = (iters * (as_whole(config.get("aggregated_iterations")) or 1)
                      * max(as_whole(config.get("graph")) or 0, 1))
    devices = [d for d in config.get("devices") or [] if isinstance(d, dict)]
    if devices:
        # One entry per process: util.cu parses only the first device line each sends.
        group = devices[0].get("group")
        members = [d for d in devices if d.get("group") == group]
        per_process = (as_whole(config.get("nthreads")) or 1) * (as_whole(config.get("ngpus")) or 1)
        test.world_size = len(members) * per_process
        test.nnodes = len({str(d.get("hostname")) for d in members})
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            raise bad(f"results[{i}] is not an object")
        size, count = as_whole(r.get("size")), as_whole(r.get("count"))
        if size is None or count is None or not isinstance(r.get("type"), str):
            raise bad(f"results[{i}] has no size, count and type")
        root = as_whole(r["root"].strip() if isinstance(r.get("root"), str) else r.get("root"))
        redop = r.get("redop") if isinstance(r.get("redop"), str) and r.get("redop") else None
        placements = []
        for in_place, key in enumerate(("out_of_place", "in_place")):
            m = r.get(key)
            if not isinstance(m, dict):
                continue  # null: nccl-tests printed nothing for this placement
            per_iter = r.get(f"{key}_per_iter")
            per_iter = per_iter if isinstance(per_iter, dict) else {}
            pl = NcclPlacement(in_place, m.get("time", m.get("cpu_time")), m.get("alg_bw"),
                               m.get("bus_bw"), as_wrong_count(m.get("nwrong")),
                               per_iter.get("p50_us"), per_iter.get("p99_us"),
                               per_iter.get("cv_pct"))
            if "cpu_time" in m and "time" not in m:
                pl.notes.append("time is CPU time (-C 1)")
            placements.append(pl)
        test.results.append(NcclSize(size, count, r["type"], redop, root, placements))
    if not test.results:
        raise bad("JSON with no results (did the run stop before its first size?)")
    return test
