"""The shared limiter: rates, concurrency slots and token budgets for a fleet of proxies, on Redis.

Every limit the perimeter enforces otherwise lives in one proxy process (NGINX's limit_req zones
and njs shared dict, Envoy's local_ratelimit buckets), so N replicas admit N times the policy.
Here the state lives in Redis and each decision is one atomic Redis script, so N proxies
together admit what the policy says (issue 21).

Modules, one concept each:

* ``config``   the zones file (kind rate | concurrency | tokens and their values), frozen models;
* ``keys``     Redis key names (``vp:{zone|key}:b`` buckets, ``:s`` slots; a cluster hash tag);
* ``scripts``  the Lua scripts (token bucket take/give, slot hold), EVALSHA with EVAL fallback;
* ``store``    the Redis client (URL, password file, TLS) and one typed call per decision;
* ``decide``   one request's zones: acquire in order, release, settle; reasons, Retry-After;
* ``proto``    the protobuf codec of Envoy's rate limit service messages (field numbers cited);
* ``rls``      ShouldRateLimit: the descriptor scheme (and its envoyproxy/ratelimit mapping);
* ``http_api`` the JSON door for njs (``/v1/acquire``, ``/v1/release``, ``/v1/settle``);
* ``server``   one port, both doors (gRPC over h2c, sniffed by its preface; HTTP/1.1 with h11).

Errors (in the project's tree, scanner/errors.py)::

    LimiterError                   exit 3
    ├── StoreUnavailableError      Redis did not answer: "shared-store-unavailable" (gRPC 14,
    │                              HTTP 503); never an admission
    └── LimiterCallError           exit 2: a call that cannot be read (gRPC 3, HTTP 400)
    ConfigError                    exit 2: a zones file or password file that is wrong
    UsageError                     exit 2: a bad --redis URL or --listen address

**Failure policy** (``shared: {redis: URL, on_unavailable: deny|local}``, for the generators):
the service never answers "allow" without Redis's word. Under ``deny`` the proxy turns the
unavailable answer (and a limiter that does not answer at all) into 503 with
``X-Perimeter-Reason: shared-store-unavailable``: Envoy's ratelimit filter with
``failure_mode_deny: true`` and ``status_on_error: 503`` plus a local reply mapper for the
reason; njs on a 503 or a failed ``ngx.fetch``. Under ``local`` the proxy keeps today's local
limits, rendered with each value divided by the replica count (rps / N, burst / N rounded up,
concurrency and tokens_per_minute / N rounded up, at least 1), and applies them only when the
shared store is unavailable: NGINX as a second njs-guarded ``limit_req``/dict path taken on that
answer, Envoy as its ``local_ratelimit`` filters enabled by a metadata flag the ratelimit
filter's failure leaves (``failure_mode_deny: false`` + a Lua/metadata switch). A fleet then
admits at most the policy while Redis is down, never unlimited.
"""
