"""Lua scripts: each is one atomic step. Return values are short status strings."""

# Ingest one chunk. KEYS: seq, inbox. ARGV: seq, rows(bytes), n_rows, digest.
# Returns {"ok", id} | {"dup", stored_digest} | {"gap", expected}
INGEST = """
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
local s = tonumber(ARGV[1])
if s <= last then
  local e = redis.call('XRANGE', KEYS[2], (s + 1) .. '-0', (s + 1) .. '-0')
  local d = ''
  if e[1] then
    local f = e[1][2]
    for i = 1, #f, 2 do if f[i] == 'digest' then d = f[i + 1] end end
  end
  return {'dup', d}
end
if s ~= last + 1 then return {'gap', tostring(last + 1)} end
local id = redis.call('XADD', KEYS[2], (s + 1) .. '-0', 'rows', ARGV[2], 'n', ARGV[3], 'digest', ARGV[4])
redis.call('SET', KEYS[1], s)
return {'ok', id}
"""

# Apply one processed chunk. KEYS: state, reservoir, fence, out, attempts.
# ARGV: fence_token, seq, state_bytes, n, log_evidence, chunks, detector_bytes, row_bytes,
#       out_maxlen, n_out, [model, kind, data] * n_out, then (slot, bytes) pairs.
# Returns 'ok' | 'fenced' | 'stale'
APPLY = """
local token = redis.call('GET', KEYS[3])
if token ~= ARGV[1] then return 'fenced' end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '-1')
if last + 1 ~= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'last_seq', ARGV[2], 'n', ARGV[4], 'log_evidence', ARGV[5],
           'chunks', ARGV[6], 'detector', ARGV[7], 'error', '')
local rb = tonumber(ARGV[8])
local n_out = tonumber(ARGV[10])
local i = 11
for _ = 1, n_out do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'model', ARGV[i], 'kind', ARGV[i + 1], 'data', ARGV[i + 2])
  i = i + 3
end
while i <= #ARGV do
  redis.call('SETRANGE', KEYS[2], tonumber(ARGV[i]) * rb, ARGV[i + 1])
  i = i + 2
end
redis.call('HDEL', KEYS[5], ARGV[2])
return 'ok'
"""

# Park a chunk that keeps failing. KEYS: state, fence, out, dead, attempts.
# ARGV: fence_token, seq, model, error, out_maxlen, data_json
DEAD_LETTER = """
local token = redis.call('GET', KEYS[2])
if token ~= ARGV[1] then return 'fenced' end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '-1')
if last + 1 ~= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'last_seq', ARGV[2], 'error', ARGV[4])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'model', ARGV[3], 'seq', ARGV[2], 'error', ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'model', ARGV[3], 'kind', 'dead_letter', 'data', ARGV[6])
redis.call('HDEL', KEYS[5], ARGV[2])
return 'ok'
"""

# Acquire a lease (or retake one this worker still holds, e.g. after Redis restarted and the
# worker dropped its in-memory pairs). KEYS: lease, fence. ARGV: worker_id, ttl_ms.
# Returns the new fence token or false.
ACQUIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return redis.call('INCR', KEYS[2])
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
"""

# Renew a lease we hold. KEYS: lease, fence. ARGV: worker_id, ttl_ms, token. Returns 1 or 0.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Release a lease we hold. KEYS: lease. ARGV: worker_id.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Create a stream if it does not exist. KEYS: streams set, config, then per model: state.
# ARGV: name, config_json, then per model: state bytes. Returns 1 (created) or 0 (exists).
CREATE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[1], ARGV[1])
for i = 3, #KEYS do
  redis.call('HSET', KEYS[i], 'state', ARGV[i], 'last_seq', '-1', 'n', '0', 'log_evidence', '0', 'chunks', '0',
             'detector', '', 'error', '')
end
return 1
"""
