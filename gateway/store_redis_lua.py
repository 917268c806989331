"""The Redis store's Lua scripts: policies/tenancy/ledger.py, line for line, atomic.

Each operation is ONE script (EVALSHA), so a check-and-reserve or a settle is atomic
across every gateway replica, and costs one round trip. Keys, all in one pool's hash slot
(`{pool}` is the Redis Cluster hash tag), declared in KEYS in this order:

    fg:{P}:state      hash   "pool" → the pool's record; "e:<name>" → an entitlement's record
    fg:{P}:holds      hash   hold id → the hold's record
    fg:{P}:admitted   zset   hold id → priority at admission (threshold = its minimum)
    fg:{P}:evictable  zset   hold id → priority (preemptible holds not yet named for eviction)
    fg:{P}:expiry     zset   hold id → expiry (µs)
    fg:{P}:owners     zset   "<replica>|<hold id>", score 0 (a replica's holds, by prefix)
    fg:{P}:replicas   zset   replica → alive until (µs)
    fg:{P}:notices    zset   "<replica>|<hold id>", score 0: a replica's holds another
                             replica's grant named for eviction, until it collects them
    fg:{P}:gone       zset   hold id → until (µs): holds released (or cancelled) before
                             Redis saw them — a reserve or a re-registration arriving late
                             under such an id does nothing

The state hash also keeps "act": the last reserve, heartbeat, expiry or registration (µs),
so that time in which nobody reached Redis (a stall) does not count against heartbeats
(`touch`, ledger.py's `_touch`).

Records are MessagePack maps (cmsgpack: integers and doubles round-trip exactly). Time is
the Redis server's (TIME) in µs — one clock for all replicas — unless the caller passes
one (ARGV[1] non-empty: the tests' manual clock). Numbers go back to Python as strings
formatted %.17g (exact for doubles; Redis would truncate a Lua number to an integer).

A refusal's detail text is shorter than the ledger's; the check, Retry-After and every
counter are the same (tests/unit/policies/tenancy/test_store_contract.py).
"""

from __future__ import annotations

PRELUDE = r"""
local K_STATE, K_HOLDS, K_ADM, K_EVI, K_EXP, K_OWN, K_REP, K_NOTE, K_GONE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
-- classes.py's RULES: reserved, burst, has baseline, holds idle, evictable
local RULES = {
  dedicated   = {res = true,  burst = true,  base = true,  idle = true,  evict = false},
  guaranteed  = {res = true,  burst = false, base = true,  idle = false, evict = false},
  elastic     = {res = false, burst = true,  base = true,  idle = false, evict = false},
  spot        = {res = false, burst = true,  base = false, idle = false, evict = false},
  preemptible = {res = false, burst = true,  base = false, idle = false, evict = true},
}
local function fmt(x) return string.format('%.17g', x) end
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function get(field)
  local v = redis.call('HGET', K_STATE, field)
  if not v then return nil end
  return cmsgpack.unpack(v)
end
local function put(field, rec) redis.call('HSET', K_STATE, field, cmsgpack.pack(rec)) end
-- bucket.py: refill, wait_s, take, give (records with rate, depth, lvl, t)
local function refill(b, now)
  local dt = now - b.t
  if dt <= 0 then return end
  if b.lvl >= b.depth or b.rate <= 0 then
    b.lvl = math.min(b.lvl, b.depth); b.t = now; return
  end
  local added = math.floor(b.rate * dt / 1000)
  if b.lvl + added >= b.depth then
    b.lvl = b.depth; b.t = now
  elseif added > 0 then
    b.lvl = b.lvl + added
    b.t = b.t + math.min(dt, math.floor(added * 1000 / b.rate))
  end
end
local function wait_s(b, need)
  if need <= b.lvl then return 0 end
  if b.rate <= 0 then return math.huge end
  return (need - b.lvl) / (b.rate * 1000)
end
local function take(b, amount) local t = math.min(amount, b.lvl); b.lvl = b.lvl - t; return t end
local function give(b, amount) b.lvl = math.min(b.depth, b.lvl + amount) end
local function idle_slots(e)
  if RULES[e.class].idle then return math.max(0, e.r - e.inf) end
  return 0
end
local function idle_kv(e)
  if RULES[e.class].idle then return math.max(0, e.kvb - e.kv) end
  return 0
end
local function full(rate, window, now)
  local depth = math.floor(rate * window * 1000)
  return depth
end
-- ledger.py: release_hold
local function release_hold(pool, hid)
  local raw = redis.call('HGET', K_HOLDS, hid)
  if not raw then return false end
  local h = cmsgpack.unpack(raw)
  local slots = h.slots or 1
  redis.call('HDEL', K_HOLDS, hid)
  redis.call('ZREM', K_ADM, hid)
  redis.call('ZREM', K_EVI, hid)
  redis.call('ZREM', K_EXP, hid)
  if h.rep ~= '' then redis.call('ZREM', K_OWN, h.rep .. '|' .. hid) end
  if h.named then
    pool.nslots = (pool.nslots or 0) - slots; pool.nkv = (pool.nkv or 0) - h.kv
  end
  local e = get('e:' .. h.ent)
  pool.islots = pool.islots - idle_slots(e); pool.ikv = pool.ikv - idle_kv(e)
  e.inf = e.inf - slots; e.kv = e.kv - h.kv
  pool.islots = pool.islots + idle_slots(e); pool.ikv = pool.ikv + idle_kv(e)
  pool.inf = pool.inf - slots; pool.kv = pool.kv - h.kv
  put('e:' .. h.ent, e)
  return true
end
-- ledger.py: _touch — a gap longer than `grace` (half the heartbeat TTL: replicas beat
-- every third) means nobody reached Redis: every replica's deadline moves on by the gap
local function touch(now, grace)
  local last = tonumber(redis.call('HGET', K_STATE, 'act') or '')
  if last and now - last > grace then
    local gap = now - last
    local reps = redis.call('ZRANGE', K_REP, 0, -1, 'WITHSCORES')
    for i = 1, #reps, 2 do
      redis.call('ZADD', K_REP, fmt(tonumber(reps[i + 1]) + gap), reps[i])
    end
  end
  redis.call('HSET', K_STATE, 'act', fmt(now))
end
-- ledger.py: _take (admitted = false: a re-registration, not an admission)
local function take_hold(pool, e, name, hid, request, tokens, slots, replica, now, ttl, admitted)
  local rules = RULES[e.class]
  local cost, kv = tokens * 1000, tokens * pool.c
  pool.islots = pool.islots - idle_slots(e); pool.ikv = pool.ikv - idle_kv(e)
  e.inf = e.inf + slots; e.kv = e.kv + kv
  pool.islots = pool.islots + idle_slots(e); pool.ikv = pool.ikv + idle_kv(e)
  pool.inf = pool.inf + slots; pool.kv = pool.kv + kv
  local own = take(e, cost)
  local pooled = take(pool, cost)
  e.ch = e.ch + cost
  if admitted then
    e.adm = e.adm + 1
    pool.seq = pool.seq + 1
  end
  if hid == '' then hid = replica .. '#' .. pool.seq end
  local h = {req = request, ent = name, kv = kv, cost = cost, own = own, pooled = pooled,
             prio = e.prio, evi = rules.evict, rep = replica, exp = now + ttl, settled = false,
             slots = slots}
  redis.call('HSET', K_HOLDS, hid, cmsgpack.pack(h))
  redis.call('ZADD', K_ADM, fmt(e.prio), hid)
  if rules.evict then redis.call('ZADD', K_EVI, fmt(e.prio), hid) end
  redis.call('ZADD', K_EXP, now + ttl, hid)
  if replica ~= '' then redis.call('ZADD', K_OWN, 0, replica .. '|' .. hid) end
  put('e:' .. name, e)
  return hid
end
-- ledger.py: _sweep
local function sweep(pool, now, budget)
  redis.call('ZREMRANGEBYSCORE', K_GONE, '-inf', now)
  local gone = 0
  local expired = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now, 'LIMIT', 0, budget)
  for _, hid in ipairs(expired) do release_hold(pool, hid); gone = gone + 1 end
  local dead = redis.call('ZRANGEBYSCORE', K_REP, '-inf', now)
  for _, rep in ipairs(dead) do
    local theirs = redis.call('ZRANGEBYLEX', K_OWN, '[' .. rep .. '|', '(' .. rep .. '}')
    local room = budget - gone
    for i = 1, math.min(math.max(0, room), #theirs) do
      release_hold(pool, string.sub(theirs[i], #rep + 2)); gone = gone + 1
    end
    if #theirs <= room then
      redis.call('ZREM', K_REP, rep)
      redis.call('ZREMRANGEBYLEX', K_NOTE, '[' .. rep .. '|', '(' .. rep .. '}')
    end
  end
  return gone
end
-- ledger.py: notices — the replica's holds named for eviction by others, popped
local function notices(rep, out)
  if rep == '' then return out end
  local lo, hi = '[' .. rep .. '|', '(' .. rep .. '}'
  local named = redis.call('ZRANGEBYLEX', K_NOTE, lo, hi)
  if #named == 0 then return out end
  redis.call('ZREMRANGEBYLEX', K_NOTE, lo, hi)
  for _, m in ipairs(named) do out[#out + 1] = string.sub(m, #rep + 2) end
  return out
end
"""

# ARGV: now_us|'', entitlement, request, tokens, replica, hold_ttl_us, state_retry_s, sweep_max,
#       hold id|'' (the caller's; '': numbered here), slots, grace_us (half the heartbeat TTL),
#       requests the replica has in flight (0: not said)
# → {'ok', hold, priority, bursting, n, n hold ids to evict, notices...}
#   | {'no', check, retry_after, detail, notices...}
# A replica with requests in flight that Redis does not know as alive (restarted empty,
# lapsed) is answered {'no', 'replica_unknown', …}: it registers them, then asks again —
# Redis never grants before it counts what is running.
# A hold id held already answers its grant again (a retry whose first answer was lost); one
# released or cancelled already ("gone") is refused: the caller has given up on it.
RESERVE = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local name, request, tokens, replica = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local ttl, state_retry, sweep_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local given, slots, grace = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])
local pool = get('pool')
if not pool then
  return notices(replica, {'no', 'unknown_entitlement', fmt(state_retry), 'no such pool'})
end
if given ~= '' then
  local raw = redis.call('HGET', K_HOLDS, given)
  if raw then
    return notices(replica, {'ok', given, fmt(cmsgpack.unpack(raw).prio), '0', '0'})
  end
  if redis.call('ZSCORE', K_GONE, given) then
    return notices(replica, {'no', 'store_unavailable', fmt(state_retry),
                             'hold ' .. given .. ' was cancelled'})
  end
end
touch(now, grace)
if replica ~= '' and tonumber(ARGV[12] or '0') > 0 then
  local alive = redis.call('ZSCORE', K_REP, replica)
  if not alive or tonumber(alive) <= now then
    return notices(replica, {'no', 'replica_unknown', fmt(state_retry),
                             'replica ' .. replica .. ' is not known alive: register first'})
  end
end
sweep(pool, now, sweep_max)
local e = get('e:' .. name)
if not e then
  put('pool', pool)
  return notices(replica, {'no', 'unknown_entitlement', fmt(state_retry),
                           'no entitlement ' .. name .. ' in this pool'})
end
local rules = RULES[e.class]
local cost = tokens * 1000
local kv = tokens * pool.c
local function deny(check, retry, detail)
  e.rf = e.rf + cost
  e['n_' .. check] = (e['n_' .. check] or 0) + 1
  put('e:' .. name, e); put('pool', pool)
  return notices(replica, {'no', check, fmt(retry), detail})
end
-- checks 1, 3, 4 (ledger.py: _own_checks)
if e.state ~= 'bound' then
  return deny('entitlement_state', state_retry, 'entitlement ' .. name .. ' is ' .. e.state .. ', not bound')
end
local bursting = not rules.base
if e.inf + slots > e.r and rules.base then
  if not rules.burst then
    return deny('concurrency', pool.typ, 'entitlement ' .. name .. ' is at its limit r_e = ' .. e.r)
  end
  bursting = true
end
refill(e, now)
if cost > e.lvl and rules.base then
  if not rules.burst then
    if cost > e.depth then
      return deny('token_budget', e.win, 'prompt + max_tokens exceed the whole budget of ' .. name)
    end
    return deny('token_budget', wait_s(e, cost), 'prompt + max_tokens above the remaining budget of ' .. name)
  end
  bursting = true
end
if e.kv + kv > e.kvb and rules.base then
  if not rules.burst then
    return deny('kv_bytes', pool.typ, 'KV bytes above chi_e of ' .. name)
  end
  bursting = true
end
-- check 5 (ledger.py: _room, _victims, _pool_wait)
refill(pool, now)
local room = pool.inf + pool.islots + slots <= pool.slots and pool.kv + pool.ikv + kv <= pool.kvcap
  and cost <= pool.lvl
local evict = {}
if not room then
  local low = redis.call('ZRANGE', K_ADM, 0, 0, 'WITHSCORES')
  local threshold = nil
  if #low > 0 then threshold = tonumber(low[2]) end
  if rules.res and not bursting then
    pool.nslots, pool.nkv = pool.nslots or 0, pool.nkv or 0
    local slots_short = pool.inf - pool.nslots + pool.islots + slots - pool.slots
    local kv_short = pool.kv - pool.nkv + pool.ikv + kv - pool.kvcap
    for _, hid in ipairs(redis.call('ZRANGE', K_EVI, 0, -1)) do
      if slots_short <= 0 and kv_short <= 0 then break end
      local h = cmsgpack.unpack(redis.call('HGET', K_HOLDS, hid))
      redis.call('ZREM', K_EVI, hid)
      h.named = true
      redis.call('HSET', K_HOLDS, hid, cmsgpack.pack(h))
      pool.nslots = pool.nslots + (h.slots or 1); pool.nkv = pool.nkv + h.kv
      if h.rep == replica then
        evict[#evict + 1] = hid
      else
        redis.call('ZADD', K_NOTE, 0, h.rep .. '|' .. hid)
      end
      slots_short = slots_short - (h.slots or 1); kv_short = kv_short - h.kv
    end
  elseif bursting or (threshold ~= nil and not (e.prio > threshold)) then
    local short = pool.inf + pool.islots + slots > pool.slots or pool.kv + pool.ikv + kv > pool.kvcap
    local wait = wait_s(pool, cost)
    if wait == math.huge or cost > pool.depth then wait = pool.win end
    local retry = wait
    if short and pool.typ > retry then retry = pool.typ end
    local why = 'above its baseline, and bursts take only idle pool capacity'
    if not bursting then why = 'priority not above the admission threshold' end
    return deny('pool_contention', retry, 'the pool is full; ' .. name .. ': ' .. why)
  end
end
-- the hold (ledger.py: _take)
local hid = take_hold(pool, e, name, given, request, tokens, slots, replica, now, ttl, true)
put('pool', pool)
local out = {'ok', hid, fmt(e.prio), bursting and '1' or '0', tostring(#evict)}
for _, r in ipairs(evict) do out[#out + 1] = r end
return notices(replica, out)
"""
)

# ARGV: now_us|'', hold id, used tokens|'' (no settle), latency|'', release 0|1, gone_us
# → {settled, released, notices of the hold's replica...}
# Releasing a hold Redis does not have marks its id gone for gone_us (the hold TTL): a
# reserve of it still on its way (its caller timed out) or a re-registration then does
# nothing.
FINISH = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local hid, used, lat, rel = ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
local rep = string.match(hid, '^(.*)#%d+$') or ''
local pool = get('pool')
if not pool then return {0, 0} end
local settled = 0
if used ~= '' then
  local raw = redis.call('HGET', K_HOLDS, hid)
  if raw then
    local h = cmsgpack.unpack(raw)
    if not h.settled then
      h.settled = true
      redis.call('HSET', K_HOLDS, hid, cmsgpack.pack(h))
      local e = get('e:' .. h.ent)
      refill(e, now); refill(pool, now)
      local diff = h.cost - tonumber(used) * 1000
      if diff > 0 then
        give(e, math.min(diff, h.own)); give(pool, math.min(diff, h.pooled))
      elseif diff < 0 then
        take(e, -diff); take(pool, -diff)
      end
      e.ch = e.ch - diff
      if lat ~= '' and tonumber(lat) > 0 then
        pool.typ = 0.8 * pool.typ + (1 - 0.8) * tonumber(lat)
      end
      put('e:' .. h.ent, e)
      settled = 1
    end
  end
end
local released = 0
if rel then
  if release_hold(pool, hid) then
    released = 1
  elseif ARGV[6] and ARGV[6] ~= '' then
    redis.call('ZADD', K_GONE, now + tonumber(ARGV[6]), hid)
  end
end
put('pool', pool)
return notices(rep, {settled, released})
"""
)

# ARGV: now_us|'', limit, grace_us
EXPIRE = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local pool = get('pool')
if not pool then return 0 end
touch(now, tonumber(ARGV[3]))
local gone = sweep(pool, now, tonumber(ARGV[2]))
put('pool', pool)
return gone
"""
)

# ARGV: now_us|'', replica, heartbeat_ttl_us, grace_us
# → {replicas alive (this one included), lapsed 0|1, notices...}; lapsed: Redis did not
# know the replica as alive (restarted, or its heartbeat lapsed): it re-registers its holds
HEARTBEAT = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
if redis.call('HEXISTS', K_STATE, 'pool') == 1 then touch(now, tonumber(ARGV[4])) end
local prev = redis.call('ZSCORE', K_REP, ARGV[2])
local lapsed = 0
if not prev or tonumber(prev) <= now then lapsed = 1 end
redis.call('ZADD', K_REP, now + tonumber(ARGV[3]), ARGV[2])
return notices(ARGV[2], {redis.call('ZCOUNT', K_REP, '(' .. now, '+inf'), lapsed})
"""
)

# ARGV: now_us|'', replica, hold_ttl_us, grace_us, then per hold: id, entitlement, request,
# tokens, slots → holds made (-1: no such pool, or no such entitlement — nothing made: a
# Redis that lost its state, being published again, must not answer "held" for holds it
# skipped). A replica's requests in flight that Redis does not hold (it restarted empty,
# reaped them, or never saw them: granted by the replica's fallback): held again without
# the checks — they are running — unless held already or gone (released meanwhile). Not
# admissions: `adm` is kept.
REGISTER = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local pool = get('pool')
if not pool then return -1 end
for i = 5, #ARGV, 5 do
  if redis.call('HEXISTS', K_STATE, 'e:' .. ARGV[i + 1]) == 0 then return -1 end
end
touch(now, tonumber(ARGV[4]))
refill(pool, now)
local replica, ttl, made = ARGV[2], tonumber(ARGV[3]), 0
for i = 5, #ARGV, 5 do
  local hid, name = ARGV[i], ARGV[i + 1]
  local e = get('e:' .. name)
  if e and redis.call('HEXISTS', K_HOLDS, hid) == 0 and not redis.call('ZSCORE', K_GONE, hid) then
    refill(e, now)
    take_hold(pool, e, name, hid, ARGV[i + 2], tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]),
              replica, now, ttl, false)
    made = made + 1
  end
end
put('pool', pool)
return made
"""
)

# ARGV: now_us|'', slots, tokens_per_s, kv_bytes, bytes_per_token, window_s, typical_s
DEFINE_POOL = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local rate, window = tonumber(ARGV[3]), tonumber(ARGV[6])
local depth = full(rate, window, now)
local pool = get('pool')
if not pool then
  pool = {inf = 0, kv = 0, islots = 0, ikv = 0, seq = 0, step = -1, typ = tonumber(ARGV[7]), lvl = depth}
else
  refill(pool, now)
  pool.lvl = math.min(depth, pool.lvl)
end
pool.slots, pool.rate, pool.kvcap, pool.c = tonumber(ARGV[2]), rate, tonumber(ARGV[4]), tonumber(ARGV[5])
pool.win, pool.depth, pool.t = window, depth, now
put('pool', pool)
return 1
"""
)

# ARGV: now_us|'', name, class, state, tokens_per_s, kv_bytes, concurrency, window_s, priority
PUT_ENTITLEMENT = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local pool = get('pool')
if not pool then return redis.error_reply('no such pool; define it first') end
local name = ARGV[2]
local rate, window = tonumber(ARGV[5]), tonumber(ARGV[8])
local depth = full(rate, window, now)
local e = get('e:' .. name)
if not e then
  e = {inf = 0, kv = 0, debt = 0, burst = 0, ch = 0, rf = 0, chm = 0, rfm = 0, adm = 0, lvl = depth}
else
  pool.islots = pool.islots - idle_slots(e); pool.ikv = pool.ikv - idle_kv(e)
  refill(e, now)
  e.lvl = math.min(depth, e.lvl)
end
e.class, e.state, e.rate, e.kvb, e.r = ARGV[3], ARGV[4], rate, tonumber(ARGV[6]), tonumber(ARGV[7])
e.win, e.depth, e.t, e.prio = window, depth, now, tonumber(ARGV[9])
pool.islots = pool.islots + idle_slots(e); pool.ikv = pool.ikv + idle_kv(e)
put('e:' .. name, e); put('pool', pool)
return 1
"""
)

# ARGV: now_us|'' → {now, pool fields..., threshold, holds, then per entitlement: name, fields}
VIEW = (
    PRELUDE
    + r"""
local now = clock(ARGV[1])
local pool = get('pool')
if not pool then return redis.error_reply('no such pool') end
local low = redis.call('ZRANGE', K_ADM, 0, 0, 'WITHSCORES')
local out = {fmt(now), fmt(pool.step), fmt(pool.inf), fmt(pool.kv), fmt(pool.typ),
             #low > 0 and low[2] or '', fmt(redis.call('HLEN', K_HOLDS))}
local all = redis.call('HGETALL', K_STATE)
local FIELDS = {'class', 'state', 'rate', 'kvb', 'r', 'win', 'inf', 'kv', 'ch', 'rf', 'chm', 'rfm',
                'debt', 'burst', 'prio', 'adm'}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'e:' then
    local e = cmsgpack.unpack(all[i + 1])
    out[#out + 1] = string.sub(all[i], 3)
    for _, f in ipairs(FIELDS) do
      local v = e[f]
      if type(v) == 'number' then v = fmt(v) end
      out[#out + 1] = v
    end
    local refusals = {}
    for k, v in pairs(e) do
      if string.sub(k, 1, 2) == 'n_' then refusals[#refusals + 1] = string.sub(k, 3) .. '=' .. fmt(v) end
    end
    out[#out + 1] = table.concat(refusals, ',')
  end
end
return out
"""
)

# ARGV: now_us|'' (unused), step_us seen by the view, the view's now_us, then per entitlement:
# name, debt, burst, priority, charged mark, refused mark
APPLY_STEP = (
    PRELUDE
    + r"""
local pool = get('pool')
if not pool or fmt(pool.step) ~= ARGV[2] then return 0 end
pool.step = tonumber(ARGV[3])
for i = 4, #ARGV, 6 do
  local e = get('e:' .. ARGV[i])
  if e then
    e.debt, e.burst, e.prio = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    e.chm, e.rfm = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
    put('e:' .. ARGV[i], e)
  end
end
put('pool', pool)
return 1
"""
)
