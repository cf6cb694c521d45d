"""The shared limiter: rates, concurrency slots and token budgets for a fleet of proxies, on Redis.

Every limit the perimeter enforces otherwise lives in one proxy process (NGINX's limit_req zones
and njs shared dict, Envoy's local_ratelimit buckets), so N replicas admit N times the policy.
Here the state lives in Redis and each decision is one atomic Redis script, so N proxies
together admit what the policy says (issue 21).

Modules, one concept each:

* ``config``   the zones file: the plan's zones (scanner.plan.zones, kind rate | concurrency |
               tokens and their values) and the service's own settings around them;
* ``keys``     Redis key names (``vp:{key}|zone:b`` buckets, ``:s`` slots; a cluster hash tag;
               the slots' owners' indexes and registry);
* ``scripts``  the Lua scripts (token bucket take/give, slot hold, lease renewal), EVALSHA with
               EVAL fallback;
* ``store``    the Redis client (redis-py: one Redis, Sentinel or Cluster; password file, TLS),
               one typed call per decision, and the slots' leases (renewed by any limiter from
               their facts in Redis);
* ``decide``   one request's zones: acquire in order, release, settle; reasons, Retry-After;
* ``proto``    Envoy's rate limit service messages (the generated classes of xds-protos);
* ``rls``      ShouldRateLimit: the descriptor scheme (and its envoyproxy/ratelimit mapping);
* ``http_api`` the JSON door for njs (``/v1/acquire``, ``/v1/release``, ``/v1/settle``);
* ``server``   one port, both doors (gRPC over h2c, sniffed by its preface; HTTP/1.1 with h11);
* ``envoy_ratelimit`` the zones as an envoyproxy/ratelimit configuration (rate and token zones).

Beside them: the store's URL (one Redis, Sentinel ``redis+sentinel://`` or Cluster
``redis+cluster://``) is :mod:`scanner.store_url`; the zone model (made once from a plan's
decisions), a route's zones in order and the ``local`` per-replica share are
:mod:`scanner.plan.zones` (the plan stage comes before this one: the limiter reads the plan's
zones, the plan imports nothing of the limiter).

Errors (in the project's tree, scanner/errors.py)::

    LimiterError                   exit 3
    ├── StoreUnavailableError      Redis did not answer: "shared-store-unavailable" (gRPC 14,
    │                              HTTP 503); never an admission
    └── LimiterCallError           exit 2: a call that cannot be read (gRPC 3, HTTP 400)
    ConfigError                    exit 2: a zones file or password file that is wrong
    UsageError                     exit 2: a bad --redis URL or --listen address

**Failure policy** (``shared: {redis: URL, on_unavailable: deny|local}``, for the generators):
the service never answers "allow" without Redis's word, and a proxy never admits unlimited.

* ``deny``: the proxy turns the unavailable answer, and a limiter that does not answer at all,
  into 503 with ``X-Perimeter-Reason: shared-store-unavailable``. Envoy: the ratelimit filter
  with ``failure_mode_deny: true``, ``status_on_error: 503`` and a local reply mapper on the
  ``RLSE`` response flag adding the reason (tests/limiter/test_envoy.py). njs: a 503 answer or
  a failed ``ngx.fetch`` is a 503 with the reason.
* ``local`` (design): while Redis is down each proxy enforces today's local limits with every
  value divided by the replica count (``scanner.plan.zones.local_share``: rounded down, at least 1), so the
  fleet admits at most the policy. njs: on the service's 503 it continues through the local
  path the generators render today (``limit_req`` zones and the shared dict, with the shares'
  values) instead of the shared one; a limiter that does not answer counts as unavailable.
  Envoy: the service, started with the policy's choice, answers OK with the response's
  ``dynamic_metadata`` (rls.proto field 6) ``{shared: unavailable}``; ``local_ratelimit``
  filters after the ratelimit filter, with the shares' buckets, have descriptors that include
  a ``metadata`` action on that key, so they count only requests so marked (an action without
  its metadata yields no descriptor). A limiter that does not answer stays
  ``failure_mode_deny`` (503): Envoy cannot tell its own failure apart otherwise.
"""
