"""Tool hosting: what an agent definition's ``tools`` resolve to, and a call's registry.

Owns the loading of application tools and the fail-closed setup of a call's
:class:`~brisvox.agent.tool_engine.registry.ToolRegistry`:

* A tool module is named in the agent file as ``package.module:function``
  (importable on the process's path) or ``path/to/file.py:function`` (relative
  to the agent file's folder), in ``tool_modules``. The function takes no
  argument and returns an iterable
  of ``(ToolSpec, tool)`` pairs (a tool is the async ``(args, ctx)`` callable
  of :mod:`brisvox.agent.tool_engine.registry`). Modules are imported once per process
  (:func:`provided_tools` caches by reference), so a call pays no import or
  schema compile.
* The built-in telephony tools (:mod:`brisvox.agent.tool_engine.builtin`) are
  always provided; an application tool with a built-in's name is refused.
* :func:`build_registry` registers exactly the agent's ``tools`` (the
  telephony ones bound to the call's port), then turns the confirmation gate
  on for ``confirm_tools`` and for ``transfer_call`` / ``warm_transfer`` (unless the agent file says
  ``confirm_transfer = false``). A listed tool nothing provides raises
  :class:`ToolSetupError`: the call does not start without its tools; so does
  ``transfer_call`` or ``warm_transfer`` without ``transfer_targets`` (:data:`NO_TRANSFER_TARGETS`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from typing import Any

from brisvox.agent.tool_engine.builtin import (
    BUILTIN_NAMES,
    END_CALL,
    SEND_DTMF,
    TRANSFER_CALL,
    TRANSFER_TOOLS,
    WARM_TRANSFER,
    TelephonyPort,
    telephony_tools,
)
from brisvox.agent.tool_engine.registry import RegistryError, Tool, ToolRegistry, ToolSpec


class ToolSetupError(Exception):
    def __init__(self, message: str, module: str = "", tool: str = "") -> None:
        super().__init__(message)
        self.module = module
        self.tool = tool


NO_TRANSFER_TARGETS = ("transfer_call and warm_transfer need transfer_targets: list the numbers or SIP addresses "
                       "they may transfer to (without a list the model could be talked into transferring the "
                       "caller anywhere)")
_CACHE: dict[str, list[tuple[ToolSpec, Tool]]] = {}
BUILTIN_SPECS = {s.name: s for s in (END_CALL, SEND_DTMF, TRANSFER_CALL, WARM_TRANSFER)}


def _import(ref: str, mod_name: str, base_dir: str | None) -> Any:
    if mod_name.endswith(".py"):
        import hashlib
        from pathlib import Path

        path = Path(mod_name)
        if not path.is_absolute():
            path = Path(base_dir or ".") / path
        path = path.resolve()
        if not path.is_file():
            raise ToolSetupError(f"{ref!r}: no file {path}", ref)
        name = f"brisvox_tools_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolSetupError(f"{ref!r}: cannot load {path}", ref)
        import sys

        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001
            sys.modules.pop(name, None)
            raise ToolSetupError(f"{ref!r}: {path.name} failed to load: {type(e).__name__}: {e}", ref) from None
        return mod
    try:
        return importlib.import_module(mod_name)
    except ImportError as e:
        raise ToolSetupError(f"{ref!r}: cannot import {mod_name}: {e}", ref) from None


def load_module_tools(ref: str, base_dir: str | None = None) -> list[tuple[ToolSpec, Tool]]:
    """Import ``package.module:function`` (or ``file.py:function`` relative to ``base_dir``) and
    return its validated ``(ToolSpec, tool)`` pairs."""
    key = f"{base_dir or ''}|{ref}"
    if key in _CACHE:
        return _CACHE[key]
    mod_name, _, fn_name = ref.rpartition(":")
    if not mod_name or not fn_name:
        raise ToolSetupError(f"{ref!r}: expected package.module:function", ref)
    mod = _import(ref, mod_name, base_dir)
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ToolSetupError(f"{ref!r}: {mod_name} has no function {fn_name}", ref)
    try:
        pairs = list(fn())
    except Exception as e:  # noqa: BLE001 - a broken tool module is a setup error, not a crash
        raise ToolSetupError(f"{ref!r}: {fn_name}() failed: {type(e).__name__}: {e}", ref) from None
    out: list[tuple[ToolSpec, Tool]] = []
    probe = ToolRegistry()
    for item in pairs:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], ToolSpec) and callable(item[1])):
            raise ToolSetupError(f"{ref!r}: {fn_name}() must return (ToolSpec, tool) pairs", ref)
        spec, tool = item
        if spec.name in BUILTIN_NAMES:
            raise ToolSetupError(f"{ref!r}: {spec.name!r} is a built-in tool name", ref, spec.name)
        try:
            probe.register(spec, tool)  # validates name, schema, kind rules once
        except RegistryError as e:
            raise ToolSetupError(f"{ref!r}: tool {spec.name!r} rejected: {e}", ref, spec.name) from None
        out.append((spec, tool))
    _CACHE[key] = out
    return out


def provided_tools(modules: Iterable[str], base_dir: str | None = None) -> dict[str, ToolSpec]:
    """Every tool name the process can offer an agent with these modules -> its spec."""
    out: dict[str, ToolSpec] = dict(BUILTIN_SPECS)
    for ref in modules:
        for spec, _ in load_module_tools(ref, base_dir):
            if spec.name in out:
                raise ToolSetupError(f"{ref!r}: tool {spec.name!r} is provided twice", ref, spec.name)
            out[spec.name] = spec
    return out


def build_registry(agent: Any, port: TelephonyPort | None) -> ToolRegistry:
    """A call's registry with exactly ``agent.tools`` (fail closed)."""
    reg = ToolRegistry()
    app: dict[str, tuple[ToolSpec, Tool]] = {}
    base = _base_dir(agent)
    for ref in agent.tool_modules:
        for spec, tool in load_module_tools(ref, base):
            app[spec.name] = (spec, tool)
    builtins_wanted = tuple(n for n in agent.tools if n in BUILTIN_NAMES)
    tele: dict[str, tuple[ToolSpec, Tool]] = {}
    if builtins_wanted:
        if port is None:
            raise ToolSetupError("the telephony tools need the call's telephony port")
        wanted_transfers = [n for n in TRANSFER_TOOLS if n in builtins_wanted]
        if wanted_transfers and not agent.transfer_targets:
            raise ToolSetupError(NO_TRANSFER_TARGETS, tool=wanted_transfers[0])
        warm = getattr(agent, "warm_transfer", None)
        tele = {s.name: (s, t) for s, t in telephony_tools(port, transfer_targets=tuple(agent.transfer_targets),
                                                          names=builtins_wanted,
                                                          warm_timeout_s=warm.consult_bound_s() if warm else 30.0)}
    for name in agent.tools:
        entry = tele.get(name) or app.get(name)
        if entry is None:
            raise ToolSetupError(f"tool {name!r} is listed in the agent definition but nothing provides it",
                                 tool=name)
        reg.register(*entry)
    gated = list(agent.confirm_tools)
    if getattr(agent, "confirm_transfer", True):  # a transfer asks the caller first unless the file says not to
        gated += [n for n in TRANSFER_TOOLS if n in agent.tools and n not in gated]
    for name in gated:
        try:
            reg.require_confirmation(name)
        except RegistryError as e:
            raise ToolSetupError(f"confirm_tools: {name!r}: {e}", tool=name) from None
    return reg


def _base_dir(agent: Any) -> str | None:
    from pathlib import Path

    p = getattr(agent, "path", "")
    return str(Path(p).resolve().parent) if p else None
