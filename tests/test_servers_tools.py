"""Shape of the MCP tool modules: module-level typed tool functions in TOOLS over a typed lifespan state."""

import inspect
import typing

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel

from evotrainer.servers import analyzers, backtests, logs, rollouts, skills, training
from evotrainer.servers.app import TOOL_META, TOOLS, TOOLSETS, build_server
from evotrainer.servers.common import ServerState, ToolContext

MODULES = (training, rollouts, logs, analyzers, backtests, skills)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_tools_are_module_level_typed_functions(module):
    assert module.TOOLS and isinstance(module.TOOLS, tuple)
    for fn in module.TOOLS:
        assert inspect.isfunction(fn) and fn.__qualname__ == fn.__name__, fn  # top level, not a closure
        owner = backtests if module is analyzers and fn in backtests.TOOLS else module
        assert getattr(owner, fn.__name__) is fn
        assert (fn.__doc__ or "").strip(), fn.__name__
        hints = typing.get_type_hints(fn, include_extras=True)
        params = inspect.signature(fn).parameters
        assert set(params) <= set(hints) and "return" in hints, fn.__name__
        assert hints[next(iter(params))] is ToolContext, fn.__name__  # the first argument is the typed context
        assert issubclass(hints["return"], BaseModel), fn.__name__
        assert fn.__name__ in TOOL_META, fn.__name__


def test_catalogue_order_is_the_tuples_and_state_is_the_lifespan_context(tmp_path):
    expected = [fn.__name__ for fns in TOOLSETS.values() for fn in fns] + [fn.__name__ for fn in TOOLS]
    server = build_server("all", tmp_path, backend="openrlhf")
    assert [t.name for t in anyio.run(server.list_tools)] == expected
    assert not [k for k in vars(server) if "state" in k]  # the state is not an attribute of the server

    async def info() -> dict:
        async with Client(server) as c:
            return (await c.call_tool("server_info", {})).structured_content

    got = anyio.run(info)
    assert got["backend"] == "openrlhf" and got["toolsets"] == list(TOOLSETS) and got["server"] == "evotrainer-all"
    assert ServerState(tmp_path).jobs.running() == []
