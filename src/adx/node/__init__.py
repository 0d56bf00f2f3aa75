"""The node agent (``adxlet``): one serial state machine (a Controller) per Environment on this node.

It registers with the Coordinator and keeps its session, reports capacity and admission (RES-7 pressure
included), places and supervises executions through the runtime driver (sandboxd), detects idleness, pauses,
resumes and deletes per the lifecycle policy, recovers what it finds at start, and keeps every result in its
SQLite degradation journal while the Coordinator or Redis is away, replaying them in order when they return.
It serves the node API (gRPC) and the Relay, through which all data-plane traffic reaches a sandbox.

Public surface: :class:`NodeAgent` (``adx node`` runs one until SIGINT/SIGTERM).
"""

from adx.node._agent import NodeAgent

__all__ = ["NodeAgent"]
