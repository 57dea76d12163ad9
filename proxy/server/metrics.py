"""Prometheus metrics, one registry per application (so several apps can live in one process)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_SLOW = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _loop_tasks() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # rendered outside a running loop: none of its tasks to count
        return 0


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("loopwarden_requests", "Requests answered, by route and status",
                                ["route", "status"], registry=r)
        self._served: dict = {}  # (route, status) -> its labelled counter (routes are the app's; statuses few)
        self.upstream_latency = Histogram("loopwarden_upstream_latency_seconds",
                                          "Time until the upstream's response headers", buckets=_SLOW, registry=r)
        self.overhead = Histogram("loopwarden_proxy_overhead_seconds",
                                  "Time the proxy spends on a chat request before forwarding it (parse, verdict)",
                                  buckets=_FAST, registry=r)
        self.detections = Counter("loopwarden_detections", "Loop episodes, by type, action and mode (enforce, observe)",
                                  ["type", "action", "mode"], registry=r)
        self.body_bytes = Counter("loopwarden_request_body_bytes",
                                  "Bytes of watched request bodies, by how they were read: parsed, or known (the "
                                  "items a conversation's previous request held, not parsed again)", ["read"],
                                  registry=r)
        self.body_parsed, self.body_known = self.body_bytes.labels("parsed"), self.body_bytes.labels("known")
        self.open_streams = Gauge("loopwarden_open_streams", "Streams being relayed now", registry=r)
        # Read when scraped: a count that only grows is a leak (a task per request never finished).
        self.loop_tasks = Gauge("loopwarden_event_loop_tasks", "Tasks alive on the proxy's event loop", registry=r)
        self.loop_tasks.set_function(_loop_tasks)
        self.log_dropped = Counter("loopwarden_log_writes_dropped", "Log records dropped because the buffer was full",
                                   registry=r)
        self.log_rejected = Counter("loopwarden_log_records_rejected", "Log records the database refused even alone, "
                                    "kept in the dead_letters table", registry=r)
        self.log_failing = Gauge("loopwarden_log_writer_failing_seconds", "Seconds the log writer has been failing "
                                 "to write (0 when it writes)", registry=r)
        # Read when scraped: each memory bounded in bytes (`proxy.lru.LRU`, the long-body cache), as its bound counts.
        self.cache_bytes = Gauge("loopwarden_cache_bytes", "Bytes each in-memory cache holds, as its bound counts them "
                                 "(at most what it holds)", ["cache"], registry=r)
        self.judge_checks = Counter("loopwarden_judge_checks", "Judge checks, by outcome", ["outcome"], registry=r)
        self.judge_tokens = Counter("loopwarden_judge_tokens", "Tokens the judge used", registry=r)
        self.webhook_deliveries = Counter("loopwarden_webhook_deliveries",
                                          "Alerts to WEBHOOK_URL, by outcome (sent, failed after retries, dropped "
                                          "with the queue full)", ["outcome"], registry=r)

    def watch_caches(self, caches: dict) -> None:
        """Each cache's bytes (`held`), read when scraped."""
        for name, cache in caches.items():
            self.cache_bytes.labels(name).set_function(lambda cache=cache: cache.held)

    def served(self, route: str, status: int) -> None:
        """Count one answer. The labelled child is looked up once per route and status, not per request."""
        key = (route, status)
        child = self._served.get(key)
        if child is None:
            child = self._served[key] = self.requests.labels(route, str(status))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
