"""The Redis scripts: each decision is one script, run atomically by Redis, timed by Redis.

Every script reads the clock with ``TIME`` (Redis's, not the caller's: N proxies on N hosts
with N clocks share one), touches one key (scanner.limiter.keys) and leaves it with a TTL.
Scripts are run with ``EVALSHA``; on ``NOSCRIPT`` (a restarted or failed-over Redis, a flushed
script cache) with ``EVAL``, which also caches them again.

``BUCKET`` (rate and token zones): a token bucket of ``capacity`` refilled continuously at
``per_second``; state ``{t: last update in µs, v: tokens}``. ``take n`` admits when ``v >= n``
and subtracts ``n``; otherwise refuses and answers the µs until ``n`` tokens are there (-1 when
``n > capacity``: never). ``give n`` adds ``n``, capped at ``capacity`` (a settlement's refund);
its optional ``ARGV[5]`` is a deadline (µs of Redis time, 0: none) past which it writes nothing
and answers ``{-1, 0, 0}``.
An absent key is a full bucket, so the key expires once a bucket left alone would be full again
(capacity / per_second, + 1 s): expiry loses nothing.
Answer: ``{admitted 0|1, tokens left (floor), µs to wait}``.

``SLOT`` (concurrency zones): a sorted set of slot ids scored by their expiry (ms, Redis time).
Expired slots are removed first; the same slot id again (a retried call) is refreshed and
admitted; a new one is admitted when fewer than ``limit`` are live. The key expires with its
last slot. Answer: ``{admitted 0|1, live slots, ms until the oldest slot expires (refused)}``.
Release is one ``ZREM`` (atomic without a script).

``ACQUIRE`` (one request, every zone it touches, ONE round trip): the buckets and slots above,
walked in the request's order (rate, concurrency, tokens) inside one script, so the reservation
across zones is atomic and costs one ``EVALSHA`` however many zones a route has. ``ARGV[1]`` is
the slot id, ``ARGV[2]`` the caller's **deadline** and ``ARGV[3]`` the **outage floor** (both µs
of Redis time, 0: none); per zone ``KEYS[i]`` and four ``ARGV`` from ``ARGV[4]``: ``r|t
per_second capacity n`` (a rate or token bucket) or ``s limit lease_ms ttl_ms`` (slots: their
lease, and their zone's slot_ttl_s); last, optionally, the slots' owner's index
(scanner.limiter.keys.leases) as ``i keep_ms 0 0``: once every zone is admitted, each slot is
entered there (``<slots key> <slot id>`` -> now + ttl_ms) and the index lives ``keep_ms`` at
least, in the same atomic call (one Redis or Sentinel; in a Cluster the index has a hash slot
of its own: ``INDEX`` is sent first).

* Deadline: Redis runs a command it received even when its sender has given up (a Redis stopped
  with SIGSTOP runs its queue on SIGCONT). A call whose deadline has passed by Redis's ``TIME``
  writes nothing and answers ``{-1, now}``: a reservation the limiter already answered 503 for
  takes no slot and no token (scanner.limiter.store.Clock makes the deadline).
* Floor: a bucket last written before the floor (the Redis time the limiter reconnected after
  an outage, under ``on_unavailable: local``) is not refilled for the time before it: it holds
  what it held (at most its size) at the floor, and an absent one (expired, or a restarted Redis
  that lost it) is empty there; both refill from the floor. The proxies' local shares admitted
  the outage's refill already.
* Slots are leases: their score is now + ``lease_ms``, renewed by ``RENEW`` while the request
  runs and its proxy may be alive (scanner.limiter.store.renew, by any limiter: from the
  owner's index), so a slot nobody renews (its proxy gone, every limiter gone) comes back
  within the lease.

Nothing is written until the walk ends: all admitted, every zone takes; the first refusal at
zone ``f`` and only the rate zones before it take (NGINX's ``limit_req`` counted the request; a
request that will not run holds no slot and is charged no tokens); zones after ``f`` are not
evaluated. Answer: ``{f (0: all admitted, -1: past the deadline), Redis's TIME in µs, then per
evaluated zone: admitted, left (bucket: whole tokens after the take; slots: live with this one),
wait (bucket: µs, -1 never; slots: ms until the oldest expires)}``. All keys of one request share
one Redis Cluster hash slot (scanner.limiter.keys: the tag is the key, not the zone).

``RENEW`` (one slots key, ``ARGV[1]`` the lease in ms, then slot ids): each slot still held and
unexpired gets now + lease (``ZADD XX``: a released or expired slot is never brought back, even
before an acquire has swept it); answers the 1-based positions of the ids no longer held (the
limiter forgets them).

``INDEX`` (Redis Cluster only: one owner's index of slots, scanner.limiter.keys.leases;
``ARGV[1]`` how long the index must live at least, ms, then pairs ``<slots key> <slot id>``,
until in Redis ms): written BEFORE ``ACQUIRE`` (scanner.limiter.store.reserve), so that a slot
never exists without its entry: any limiter finds it there and renews it (a limiter killed
between the two leaves an entry whose slot was never taken, which RENEW reports gone).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from scanner.limiter.store import Client

BUCKET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local deadline = tonumber(ARGV[5] or '0')
if deadline > 0 and now > deadline then
  return {-1, 0, 0}
end
local h = redis.call('HMGET', KEYS[1], 't', 'v')
local v = cap
if h[1] then
  local dt = now - tonumber(h[1])
  if dt < 0 then dt = 0 end
  v = math.min(cap, tonumber(h[2]) + dt * rate / 1000000)
end
local ok, wait = 1, 0
if ARGV[4] == 'give' then
  v = math.min(cap, v + n)
elseif v >= n then
  v = v - n
elseif n > cap then
  ok, wait = 0, -1
else
  ok, wait = 0, math.ceil((n - v) * 1000000 / rate)
end
redis.call('HSET', KEYS[1], 't', now, 'v', v)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap * 1000 / rate) + 1000)
return {ok, math.floor(v), wait}
"""

SLOT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  if live >= limit then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, live, tonumber(first[2]) - now}
  end
  live = live + 1
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1)
return {1, live, 0}
"""

ACQUIRE_LUA = """
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ms = math.floor(us / 1000)
local slot = ARGV[1]
local deadline, since = tonumber(ARGV[2]), tonumber(ARGV[3])
if deadline > 0 and us > deadline then
  return {-1, us}
end
local out = {0, us}
local writes = {}
local refused = 0
for i = 1, #KEYS do
  local kind, a = ARGV[i * 4], tonumber(ARGV[i * 4 + 1])
  local b, n = tonumber(ARGV[i * 4 + 2]), tonumber(ARGV[i * 4 + 3])
  if kind == 'i' then
    -- the slots' owner's index: written below, once every zone is admitted
  elseif kind ~= 's' then
    local h = redis.call('HMGET', KEYS[i], 't', 'v')
    local t0, v0 = since, 0
    if h[1] then
      t0, v0 = tonumber(h[1]), math.min(b, tonumber(h[2]))
      if t0 < since then t0 = since end
    elseif since == 0 then
      t0, v0 = us, b
    end
    local dt = us - t0
    if dt < 0 then dt = 0 end
    local v = math.min(b, v0 + dt * a / 1000000)
    if v >= n then
      writes[i] = v - n
      out[#out + 1] = 1; out[#out + 1] = math.floor(v - n); out[#out + 1] = 0
    else
      local wait = -1
      if n <= b then wait = math.ceil((n - v) * 1000000 / a) end
      out[#out + 1] = 0; out[#out + 1] = math.floor(v); out[#out + 1] = wait
      refused = i
      break
    end
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ms)
    local live = redis.call('ZCARD', KEYS[i])
    if not redis.call('ZSCORE', KEYS[i], slot) then
      if live >= a then
        local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
        out[#out + 1] = 0; out[#out + 1] = live; out[#out + 1] = tonumber(first[2]) - ms
        refused = i
        break
      end
      live = live + 1
    end
    writes[i] = true
    out[#out + 1] = 1; out[#out + 1] = live; out[#out + 1] = 0
  end
end
out[1] = refused
for i = 1, #KEYS do
  local w = writes[i]
  local kind = ARGV[i * 4]
  if w ~= nil and (refused == 0 or (i < refused and kind == 'r')) then
    local a, b = tonumber(ARGV[i * 4 + 1]), tonumber(ARGV[i * 4 + 2])
    if kind ~= 's' then
      redis.call('HSET', KEYS[i], 't', us, 'v', w)
      redis.call('PEXPIRE', KEYS[i], math.ceil(b * 1000 / a) + 1000)
    else
      redis.call('ZADD', KEYS[i], ms + b, slot)
      local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
      redis.call('PEXPIREAT', KEYS[i], tonumber(last[2]) + 1)
    end
  elseif kind == 'i' and refused == 0 then
    for j = 1, #KEYS do
      if ARGV[j * 4] == 's' then
        redis.call('HSET', KEYS[i], KEYS[j] .. ' ' .. slot, ms + tonumber(ARGV[j * 4 + 3]))
      end
    end
    local keep = tonumber(ARGV[i * 4 + 1])
    if redis.call('PTTL', KEYS[i]) < keep then
      redis.call('PEXPIRE', KEYS[i], keep)
    end
  end
end
return out
"""

RENEW_LUA = """
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local gone = {}
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > ms then
    redis.call('ZADD', KEYS[1], 'XX', ms + lease, ARGV[i])
  else
    gone[#gone + 1] = i - 1
  end
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1)
end
return gone
"""


INDEX_LUA = """
local keep = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return {1}
"""


@dataclass(frozen=True)
class Script:
    source: str

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


BUCKET = Script(BUCKET_LUA)
SLOT = Script(SLOT_LUA)
ACQUIRE = Script(ACQUIRE_LUA)
RENEW = Script(RENEW_LUA)
INDEX = Script(INDEX_LUA)


async def run(redis: Client, script: Script, key: str, args: Sequence[str | int | float]) -> list[int]:
    """The script's answer (a list of integers); EVAL when Redis does not know the script."""
    return await run_keys(redis, script, (key,), args)


async def run_keys(redis: Client, script: Script, keys: Sequence[str],
                   args: Sequence[str | int | float]) -> list[int]:
    """``run`` over several keys (one round trip)."""
    try:
        answer = await redis.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        answer = await redis.eval(script.source, len(keys), *keys, *args)
    return [int(x) for x in answer]
