"""Which agent processes and workers serve new calls, and how many live calls each serves.

Owns :class:`PeerLoad`: the ready agent processes and their live calls, the
agents that are stopping (a drain: no new call, their live calls go on), the
ready workers and the live calls each serves (all agents' calls), and the
choices made from them for a new call (:meth:`PeerLoad.resolve_agent`,
:meth:`PeerLoad.pick_worker`). The peer router
(:mod:`brisvox.gateway.core.peers`) changes who is ready (topology); the
call lifecycle (:mod:`brisvox.gateway.core.lifecycle`) counts calls in and out.

Invariants:

* ``workers`` counts, per worker, the live calls it serves (all agents);
  :meth:`PeerLoad.set_worker` is the only place that changes a call's worker
  while the worker is known, so the count stays true; a worker that left
  (:meth:`PeerLoad.drop_worker`) takes its count with it, and its calls have
  no worker (``-1``) until their next OutUtterance names the one they were
  re-attached to.
* ``agents`` counts, per ready agent process, the live calls it was given
  (:meth:`PeerLoad.agent_call_started` / :meth:`PeerLoad.agent_call_ended`);
  no count goes below zero.
* A new call goes to the least loaded agent process and the least loaded
  worker (ties: the lowest name / index); with no agent process up, the echo
  line-test agent serves it.
"""

from __future__ import annotations

from brisvox.gateway.core.calls import Call

ECHO = "echo"  # the built-in line-test agent
ECHO_TTS_RATE = 16000


class PeerLoad:
    """See the module docstring."""

    def __init__(self) -> None:
        self.agents: dict[str, int] = {}  # ready agent process -> live calls
        self.stopping_agents: set[str] = set()  # no new calls; their live calls go on (a drain)
        self.workers: dict[int, int] = {}  # ready worker index -> live calls it serves (all agents)

    # -- new calls -------------------------------------------------------------------------

    def resolve_agent(self, agent: str) -> tuple[str, str]:
        """(agent name actually used, agent process identity or "" for the echo agent)."""
        if agent == ECHO:
            return ECHO, ""
        if self.agents:
            proc = min(self.agents, key=lambda n: (self.agents[n], n))
            return agent, proc
        return ECHO, ""  # no agent process: the echo line-test agent serves the call

    def pick_worker(self) -> int:
        """The worker for a new call: the least loaded by the gateway's count of live calls.

        The gateway owns this choice for every call (pipeline and echo): it is the one
        place that sees all calls of all agent processes. The agent attaches to it (or,
        if it refuses, to another one and says which in CallAccepted)."""
        if not self.workers:
            return -1
        return min(self.workers, key=lambda i: (self.workers[i], i))

    # -- counting calls in and out -----------------------------------------------------------

    def set_worker(self, call: Call, index: int) -> None:
        """``call`` is served by worker ``index`` (-1: none known); keeps ``workers`` true."""
        if index not in self.workers:
            index = -1
        old = call.worker
        if old == index:
            return
        if old in self.workers:
            self.workers[old] = max(0, self.workers[old] - 1)
        call.worker = index
        if index >= 0:
            self.workers[index] += 1

    def forget_worker(self, call: Call) -> None:
        """The call's worker left (its count went with it): no worker serves the call."""
        call.worker = -1

    def agent_call_started(self, proc: str) -> None:
        self.agents[proc] = self.agents.get(proc, 0) + 1

    def agent_call_ended(self, proc: str) -> None:
        if proc in self.agents:
            self.agents[proc] = max(0, self.agents[proc] - 1)

    # -- who is ready (the router's topology) ------------------------------------------------

    def add_agent(self, name: str) -> None:
        """Agent process ``name`` is ready (again): it gets new calls."""
        self.agents.setdefault(name, 0)
        self.stopping_agents.discard(name)

    def agent_stopping(self, name: str) -> None:
        """No new calls for ``name``; its live calls go on."""
        self.agents.pop(name, None)
        self.stopping_agents.add(name)

    def agent_gone(self, name: str) -> None:
        self.stopping_agents.discard(name)

    def add_worker(self, index: int) -> None:
        self.workers.setdefault(index, 0)

    def drop_worker(self, index: int) -> None:
        """Worker ``index`` left: its count goes (its calls are forgotten by the router)."""
        self.workers.pop(index, None)
