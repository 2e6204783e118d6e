"""Every torch API distbench uses exists in the installed torch, and the installed torch satisfies
the floor pyproject.toml declares: torch>=2.10 (TORCH_FLOOR below; the test holds all three equal).

The inventory is read from the package's source, not kept by hand: each import from torch, and
each attribute chain rooted at a name an import bound to torch (`dist.TCPStore`, `torch.cuda.
Event`, `PContext.close`), is resolved against the installed torch; a call to something resolved
must also bind its arguments (a required parameter that the code does not pass fails here, not
in a run). What the source reaches through an instance (a store client's `.append`) is not
visible to that scan, so INSTANCE_APIS and KEYWORDS name it. Everything missing is reported
together, naming where it is used. Nothing is run, so no GPU is needed: `torch.cuda.Event` is
resolved, never created.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import tomllib
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from paths import REPO

PACKAGE = REPO / "distbench"

# The lowest torch whose APIs the code as it stands uses; pyproject.toml must declare exactly
# this. It is set by parallel/pipeline.py's schedule.step(..., return_outputs=False): a parameter
# from 2.10 on; before, step() hands the keyword to the model's forward, which refuses it. The
# pyproject comment lists what else needs more than 2.4.
TORCH_FLOOR = "2.10"

# Reached through an instance, which the scan cannot type: resolved on the class that defines
# them. The stores peers.py uses are TCPStore clients, some wrapped in PrefixStore, so their
# methods are the Store base class's.
INSTANCE_APIS = [
    *(f"torch.distributed.Store.{m}" for m in
      ("set", "get", "add", "check", "wait", "multi_get", "append", "compare_set", "set_timeout")),
    "torch.distributed.TCPStore.host",  # peers.py opens its own client to the rendezvous store
    "torch.distributed.TCPStore.port",
    # parallel/pipeline.py wraps the stage's compute calls to time them, and asks where it sits
    *(f"torch.distributed.pipelining.PipelineStage.{m}" for m in
      ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk", "is_first",
       "is_last")),
    "torch.distributed.tensor.DTensor.full_tensor",  # parallel/data_parallel.py: a TP shard whole
]

_SCHEDULES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B")

# Keyword arguments passed where the scan cannot see them (through an instance, or a **dict).
# Each must be a named parameter: a schedule's step() hands unknown keywords on to the model's
# forward, so a **kwargs catch-all accepting them proves nothing.
KEYWORDS = {
    **{f"torch.distributed.pipelining.{s}.step": ("target", "losses", "return_outputs")
       for s in _SCHEDULES},
    # runtime.py builds timeout and device_id into a dict
    "torch.distributed.init_process_group": ("store", "rank", "world_size", "timeout",
                                             "device_id"),
}

# Defaults the code relies on without naming them: models.loss_fn is a per-micro-batch mean
# because the schedules divide the gradients by the micro-batch count (scale_grads, from 2.7;
# before, pp's gradients came out that many times the reference's).
DEFAULTS = {f"torch.distributed.pipelining.{s}": ("scale_grads", True) for s in _SCHEDULES}


class Use:
    """One use of a torch API: its dotted path, where, and for a call, what it passes."""

    def __init__(self, api: str, where: str, call: ast.Call | None = None):
        self.api, self.where, self.call = api, where, call


def _chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain starts at anything but a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _bindings(tree: ast.Module) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """Names that imports bind to torch objects, file-wide (distbench imports torch inside
    functions, and one helper returns `dist` to its callers), and each imported path."""
    bound: dict[str, str] = {}
    imported: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    imported.append((alias.name, node.lineno))
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:  # `import torch.distributed` binds `torch`
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                imported.append((path, node.lineno))
                bound[alias.asname or alias.name] = path
    return bound, imported


def uses_in(path: Path, rel: str) -> list[Use]:
    tree = ast.parse(path.read_text(), filename=str(path))
    bound, imported = _bindings(tree)
    found = [Use(api, f"{rel}:{line}") for api, line in imported]
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        # the longest chain only: `dist.ReduceOp.MAX`, not also `dist.ReduceOp`
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _chain(node)
            if chain and chain[0] in bound:
                api = ".".join([bound[chain[0]], *chain[1:]])
                found.append(Use(api, f"{rel}:{node.lineno}", calls.get(id(node))))
        elif isinstance(node, ast.Name) and id(node) in calls and node.id in bound:
            found.append(Use(bound[node.id], f"{rel}:{node.lineno}", calls[id(node)]))
    return found


@functools.cache  # two tests read the same parse of the package
def package_uses() -> list[Use]:
    return [u for path in sorted(PACKAGE.rglob("*.py"))
            for u in uses_in(path, str(path.relative_to(REPO)))]


def resolve(api: str):
    """The object at a dotted path, importing the modules on the way as Python would."""
    parts = api.split(".")
    obj = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], start=2):
        if isinstance(obj, types.ModuleType):
            try:  # a submodule not imported yet (torch.distributed.pipelining)
                obj = importlib.import_module(".".join(parts[:i]))
                continue
            except ModuleNotFoundError as e:
                # no such module: an attribute, or a namespace a module makes on access
                # (torch.ops._c10d_functional, which torch.ops is no package of)
                if e.name not in (".".join(parts[:i]), ".".join(parts[:i - 1])):
                    raise
        obj = getattr(obj, name)
    return obj


def _missing(api: str) -> str | None:
    try:
        resolve(api)
    except (ImportError, AttributeError) as e:
        return f"{api}: {type(e).__name__}: {e}"
    return None


def _bad_call(obj, call: ast.Call) -> str | None:
    """Why `call`'s arguments do not bind to obj's signature; None when they do, or when
    neither can be known (a C function without a signature, a *args or **dict at the call)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    names = [k.arg for k in call.keywords if k.arg is not None]
    try:
        if any(isinstance(a, ast.Starred) for a in call.args) or len(names) < len(call.keywords):
            sig.bind_partial(**dict.fromkeys(names))
        else:
            sig.bind(*[None] * len(call.args), **dict.fromkeys(names))
    except TypeError as e:
        return str(e)
    return None


def test_finds_the_apis_it_must():
    """The scan sees what the floor hangs on; a scan that found nothing would pass anything."""
    apis = {u.api for u in package_uses()}
    for api in ("torch.distributed.pipelining.PipelineStage", "torch.distributed.TCPStore",
                "torch.distributed.rendezvous", "torch.distributed.batch_isend_irecv",
                "torch.distributed.tensor.DTensor", "torch.OutOfMemoryError",
                "torch.cuda.mem_get_info", "torch.distributed.DistError"):
        assert api in apis, f"the scan of distbench/ no longer finds {api}"


def problems_in(uses: list[Use]) -> dict[str, list[str]]:
    """What the installed torch lacks, each with where it is used."""
    problems: dict[str, list[str]] = {}
    for u in uses:
        why = _missing(u.api)
        if why is None and u.call is not None:
            bad = _bad_call(resolve(u.api), u.call)
            why = bad and f"{u.api}(...): {bad}"
        if why and u.where not in problems.setdefault(why, []):
            problems[why].append(u.where)
    return problems


def test_every_api_the_package_uses_exists():
    problems = problems_in(package_uses())
    assert not problems, f"torch {torch.__version__} lacks what distbench uses:\n" + "\n".join(
        f"  {why} (at {', '.join(where)})" for why, where in sorted(problems.items()))


def test_instance_apis_and_keywords_exist():
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    problems = []
    for api in INSTANCE_APIS:
        # a name the code no longer uses should leave the list, not stay in it unchecked
        assert re.search(rf"\.{api.rsplit('.', 1)[1]}\b", source), f"distbench no longer uses {api}"
        problems.append(_missing(api))
    for api, keywords in KEYWORDS.items():
        if (why := _missing(api)) is not None:
            problems.append(why)
            continue
        params = inspect.signature(resolve(api)).parameters
        for kw in keywords:
            assert re.search(rf"\b{kw}\b", source), f"distbench no longer passes {kw}="
            if kw not in params:
                problems.append(f"{api}: no parameter {kw!r}")
    for api, (param, value) in DEFAULTS.items():
        found = inspect.signature(resolve(api)).parameters.get(param)
        if found is None or found.default != value:
            problems.append(f"{api}: no parameter {param}={value!r}")
    problems = [p for p in problems if p]
    assert not problems, f"torch {torch.__version__} lacks what distbench uses:\n" + "\n".join(
        f"  {p}" for p in problems)


def test_the_rendezvous_store_is_a_tcp_store(monkeypatch):
    """peers.py opens clients of its own at the rendezvous store's host and port. Under
    torchrun's agent store, env:// rendezvous gave a PrefixStore (no host) up to 2.5."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    for var, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "RANK": "1",
                       "WORLD_SIZE": "2", "TORCHELASTIC_USE_AGENT_STORE": "True",
                       "TORCHELASTIC_RESTART_COUNT": "0"}.items():  # as torchrun sets them
        monkeypatch.setenv(var, value)
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=10)))
    assert (getattr(store, "host", None), getattr(store, "port", None)) == (
        "127.0.0.1", server.port), f"torch {torch.__version__} gives a {type(store).__name__}"


def test_installed_torch_meets_the_declared_floor():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_reqs = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert [str(r.specifier) for r in torch_reqs] == [f">={TORCH_FLOOR}"], (
        "pyproject.toml's torch requirement and TORCH_FLOOR here must name the same floor")
    assert f"torch>={TORCH_FLOOR}" in __doc__, "the module docstring names another floor"
    # 2.13.0+cpu: the local label says which build, not which version
    installed = torch.__version__.split("+")[0]
    assert torch_reqs[0].specifier.contains(installed, prereleases=True), (
        f"torch {torch.__version__} is below the declared floor {TORCH_FLOOR}")


@pytest.mark.parametrize("planted, api", [
    ("torch.distributed.no_such_api", "torch.distributed.no_such_api"),
    ("dist.no_such_api.deeper", "torch.distributed.no_such_api.deeper"),
    ("F.no_such_api(1)", "torch.nn.functional.no_such_api"),
    ("dist.TCPStore.no_such_method", "torch.distributed.TCPStore.no_such_method"),
])
def test_a_missing_api_fails(tmp_path, planted, api):
    """The check is not vacuous: an API torch lacks, planted in a scratch module, is named."""
    scratch = tmp_path / "scratch.py"
    scratch.write_text("import torch\nimport torch.distributed as dist\n"
                       "import torch.nn.functional as F\n\n\ndef f():\n"
                       f"    return {planted}\n")
    problems = problems_in(uses_in(scratch, "scratch.py"))
    assert [(why.split(":")[0], where) for why, where in problems.items()] == [
        (api, ["scratch.py:7"])]
