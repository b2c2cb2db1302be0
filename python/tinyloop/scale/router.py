"""PrefixAffinityRouter: Ray Serve's request router for the engine deployment (alpha API,
ray.serve.request_router.RequestRouter), on the rules of routing.py.

It lives in the process holding the DeploymentHandle (the ingress replica). Each request's
first argument is its route, a dict: {"key": hex or None} (affinity by rendezvous hashing,
least-loaded without a key), {"pin": replica id} (that replica only: /metrics asks every
replica this way), "avoid": [replica ids] (a retry). The router writes back into that same
dict the replica that served it ("replica", set when the request completes or fails), so
the ingress knows which replica to avoid when it retries.

The live replica ids and the routing decisions are published through routing.py
(`routing.live()`, `routing.decisions()`) for the ingress's /metrics: Serve pickles this
module by value into the handle's process, so state kept here would be a private copy.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import routing
from .routing import ReplicaView, rank_replicas

DEFAULT_SPILL_AT = 16


def route_of(pending_request: Optional[PendingRequest]) -> dict | None:
    if pending_request is None or not pending_request.args:
        return None
    route = pending_request.args[0]
    return route if isinstance(route, dict) and ("key" in route or "pin" in route) else None


class PrefixAffinityRouter(RequestRouter):
    """Same routing key -> same replica (rendezvous hashing over the live replicas);
    least-loaded when there is no key or the key's replica holds `spill_at` requests."""

    def initialize_state(self, spill_at: int = DEFAULT_SPILL_AT, **kwargs):
        self.spill_at = max(1, int(spill_at))
        self._routes: OrderedDict = OrderedDict()  # internal request id -> route (to write back)

    def _publish(self) -> None:
        routing.publish_live(self._deployment_id.name, [r.unique_id for r in self._replica_id_set])

    def update_replicas(self, replicas: List[RunningReplica]):
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID):
        super().on_replica_actor_died(replica_id)
        self._publish()

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if not hasattr(self, "spill_at"):
            self.initialize_state()
        if pending_request is not None:
            # One pass is the whole policy: when no rank takes the request, back off
            # before the next pass instead of spinning.
            pending_request.routing_context.should_backoff = True
        route = route_of(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        views = [ReplicaView(rid, cache.get(r.replica_id)) for rid, r in by_id.items()]
        ranks, decision = rank_replicas(route, views, self.spill_at)
        if route is not None and pending_request is not None:
            self._routes[pending_request.metadata.internal_request_id] = route
            while len(self._routes) > 10000:  # requests cancelled before they were sent
                self._routes.popitem(last=False)
        routing.count_decision(decision, ranks[0][0] if ranks and len(ranks[0]) == 1 else "")
        return [[by_id[i] for i in rank if i in by_id] for rank in ranks]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str):
        route = self._routes.pop(internal_request_id, None)
        if route is not None:
            route["replica"] = replica_id.unique_id
