"""Lua scripts: each is one atomic step. Return values are short status strings.

Every script's KEYS lie in one hash slot, so each runs on one Redis Cluster shard: either one
stream's keys (all tagged ``{stream}``) or one global key; never both (see keys.py)."""

# Ingest one chunk. KEYS: seq, inbox, seen, config, uid, clock, then every model's state hash. ARGV:
# seq, rows(bytes), n_rows, digest, seen_window, uid, max_backlog, times(bytes, '' when the chunk
# gave none), first time, last time, now (epoch seconds as decimal strings), then (optional) the
# number of columns C and per column its zeros, whether all its values are whole numbers >= 0
# ('1'/'0') and its largest value (C values each): the clock hash counts them over the rows taken
# since ('w' rows, 'z<c>', 'f<c>' once a value was not a whole number >= 0, 'm<c>'), for the
# sparse-counts note of GET /v1/streams/{s} (service.detect.answer.counts_note). Nothing is written
# unless the stream exists and is the incarnation ``uid`` (returns {'gone'}): a chunk sent to a
# deleted stream cannot leave keys behind or become a chunk of the next stream of that name.
# Backpressure: with max_backlog > 0, a new chunk is refused ({'busy', backlog}) while the slowest
# model (lowest last_seq in the state hashes) has max_backlog or more accepted chunks to apply;
# checked in the same step as the append, so concurrent writers cannot pass it together.
# Time: the clock hash holds the stream's first and last time and its row count. A chunk with its
# rows' times (field ``t``) must start after the last ({'late', last time}); one without gets its
# arrival time (field ``t0``): ``now``, or the stream's last time if that is later (a clock
# behind, or times given in the future), so that a stream's times never go back. Field ``i0``:
# the stream's rows before this chunk (the index of its first row). Times travel as decimal strings and are compared with
# tonumber (exact for doubles); Lua's tostring would round them to 14 digits, so none is made here.
# Publishes the stream's seq key name (``cusp:{s}:seq``, so the stream's name) on ``cusp:wake``
# (keys.WAKE): idle workers wake at once and look at that stream only, not at every stream.
# The digest goes to the ``seen`` stream (capped at about seen_window entries), not into the
# input entry, so that a resend is still recognised after the input entry was trimmed.
# Returns {"ok", id} | {"dup", stored_digest} | {"old", expected} (a seq older than the kept
# digests) | {"gap", expected} | {"busy", backlog} | {"late", last time} | {"gone", ""}
INGEST = """
if redis.call('EXISTS', KEYS[4]) == 0 or (redis.call('GET', KEYS[5]) or '') ~= ARGV[6] then return {'gone', ''} end
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
local s = tonumber(ARGV[1])
if s <= last then
  local e = redis.call('XRANGE', KEYS[3], (s + 1) .. '-0', (s + 1) .. '-0')
  if e[1] then return {'dup', e[1][2][2]} end
  return {'old', tostring(last + 1)}
end
if s ~= last + 1 then return {'gap', tostring(last + 1)} end
local limit = tonumber(ARGV[7] or '0')
if limit > 0 and #KEYS > 6 then
  local low = last
  for i = 7, #KEYS do
    local applied = tonumber(redis.call('HGET', KEYS[i], 'last_seq') or '-1')
    if applied < low then low = applied end
  end
  if last - low >= limit then return {'busy', tostring(last - low)} end
end
local last_t = redis.call('HGET', KEYS[6], 'last')
local i0 = redis.call('HGET', KEYS[6], 'rows') or '0'
local id, first_t, end_t
if ARGV[8] ~= '' then
  if last_t and tonumber(ARGV[9]) <= tonumber(last_t) then return {'late', last_t} end
  id = redis.call('XADD', KEYS[2], (s + 1) .. '-0', 'rows', ARGV[2], 'n', ARGV[3], 'i0', i0, 't', ARGV[8])
  first_t, end_t = ARGV[9], ARGV[10]
else
  local t0 = ARGV[11]
  if last_t and tonumber(last_t) > tonumber(t0) then t0 = last_t end
  id = redis.call('XADD', KEYS[2], (s + 1) .. '-0', 'rows', ARGV[2], 'n', ARGV[3], 'i0', i0, 't0', t0)
  first_t, end_t = t0, t0
end
redis.call('HSETNX', KEYS[6], 'first', first_t)
redis.call('HSET', KEYS[6], 'last', end_t)
redis.call('HINCRBY', KEYS[6], 'rows', ARGV[3])
local nc = tonumber(ARGV[12] or '0')
if nc > 0 then
  redis.call('HINCRBY', KEYS[6], 'w', ARGV[3])
  local names = {}
  for c = 1, nc do names[c] = 'm' .. (c - 1) end
  local tops, set = redis.call('HMGET', KEYS[6], unpack(names)), {}
  for c = 1, nc do
    local k = tostring(c - 1)
    if ARGV[12 + c] ~= '0' then redis.call('HINCRBY', KEYS[6], 'z' .. k, ARGV[12 + c]) end
    if ARGV[12 + nc + c] == '0' then set[#set + 1] = 'f' .. k; set[#set + 1] = '1' end
    local top = ARGV[12 + 2 * nc + c]
    if not tops[c] or tonumber(top) > tonumber(tops[c]) then set[#set + 1] = 'm' .. k; set[#set + 1] = top end
  end
  if #set > 0 then redis.call('HSET', KEYS[6], unpack(set)) end
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], (s + 1) .. '-0', 'd', ARGV[4])
redis.call('SET', KEYS[1], s)
redis.call('PUBLISH', 'cusp:wake', KEYS[1])
return {'ok', id}
"""

# Apply one processed chunk. KEYS: state, reservoir, fence, out, attempts, tally, changes.
# ARGV: fence_token, seq, state_bytes, n, log_evidence, chunks, detector_bytes, keep_from, row_bytes,
#       out_maxlen, n_out, tally_field, tally_record, changes_maxlen, [model, kind, data] * n_out,
#       then (slot, bytes) pairs.
# keep_from: the first input seq this model may still read (its next chunk, or the oldest chunk its
# detector must re-read on restore); TRIM_INBOX drops what no model of the stream needs.
# The tally record is this chunk's contribution to the stream's answer (ANSWER takes it); the
# model's change points go to the change-point store too, which result trimming does not touch.
# Returns 'ok' | 'fenced' | 'stale'
APPLY = """
local token = redis.call('GET', KEYS[3])
if token ~= ARGV[1] then return 'fenced' end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '-1')
if last + 1 ~= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'last_seq', ARGV[2], 'n', ARGV[4], 'log_evidence', ARGV[5],
           'chunks', ARGV[6], 'detector', ARGV[7], 'keep_from', ARGV[8], 'error', '')
redis.call('HSET', KEYS[6], ARGV[12], ARGV[13])
local rb = tonumber(ARGV[9])
local n_out = tonumber(ARGV[11])
local i = 15
for _ = 1, n_out do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[10], '*', 'model', ARGV[i], 'kind', ARGV[i + 1], 'data', ARGV[i + 2])
  if ARGV[i + 1] == 'changepoint' then
    redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[14], '*', 'model', ARGV[i], 'kind', ARGV[i + 1], 'data', ARGV[i + 2])
  end
  i = i + 3
end
while i <= #ARGV do
  redis.call('SETRANGE', KEYS[2], tonumber(ARGV[i]) * rb, ARGV[i + 1])
  i = i + 2
end
redis.call('HDEL', KEYS[5], ARGV[2])
return 'ok'
"""

# Park a chunk that keeps failing. KEYS: state, fence, out, dead, attempts, tally.
# ARGV: fence_token, seq, model, error, out_maxlen, data_json, keep_from, tally_field, tally_record
DEAD_LETTER = """
local token = redis.call('GET', KEYS[2])
if token ~= ARGV[1] then return 'fenced' end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '-1')
if last + 1 ~= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'last_seq', ARGV[2], 'error', ARGV[4], 'keep_from', ARGV[7])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'model', ARGV[3], 'seq', ARGV[2], 'error', ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'model', ARGV[3], 'kind', 'dead_letter', 'data', ARGV[6])
redis.call('HSET', KEYS[6], ARGV[8], ARGV[9])
redis.call('HDEL', KEYS[5], ARGV[2])
return 'ok'
"""

# Take chunks into the stream's answer (service.detect.StreamAnswer), once per chunk however many
# workers try: the answer's cursor must still be the one the caller read (compare-and-set), and the
# stream must still be the incarnation it read (a stream deleted and created again meanwhile gets
# nothing). KEYS: answer, tally, changes, out, config, uid.
# ARGV: uid, expected_cursor ('' when the answer has none yet), new_cursor, state_json,
#       changes_maxlen, out_maxlen, probabilities_json ('' for none), n_fields, tally fields taken
#       * n_fields, then (kind, JSON) pairs: stream changes ('stream_changepoint') and withdrawals
#       ('stream_changepoint_withdrawn'), in the order they were made.
# The probabilities (JSON {"n": observations compared, "p": {model: posterior probability}, "last":
# [location, confidence] of the last change standing or null}, small, for GET /v1/streams and the
# API's last-change gauges) are the answer's at its last compared chunk, kept beside its state.
# Returns 'ok' | 'stale' (another worker took them) | 'gone'
ANSWER = """
if redis.call('EXISTS', KEYS[5]) == 0 or (redis.call('GET', KEYS[6]) or '') ~= ARGV[1] then return 'gone' end
if (redis.call('HGET', KEYS[1], 'cursor') or '') ~= ARGV[2] then return 'stale' end
redis.call('HSET', KEYS[1], 'cursor', ARGV[3], 'state', ARGV[4])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'probabilities', ARGV[7]) end
local nf = tonumber(ARGV[8])
for i = 9, 8 + nf do redis.call('HDEL', KEYS[2], ARGV[i]) end
for i = 9 + nf, #ARGV - 1, 2 do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'model', '*', 'kind', ARGV[i], 'data', ARGV[i + 1])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'model', '*', 'kind', ARGV[i], 'data', ARGV[i + 1])
end
return 'ok'
"""

# Record how far a worker has taken a pair's chunks into its current batch, so that the next owner
# can tell chunks it processes again (cusp_redeliveries_total). Nothing is written for a deleted
# pair. KEYS: state, fence. ARGV: fence_token, seq. Returns 1 (recorded) or 0.
MARK_TAKEN = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'taken_through', ARGV[2])
return 1
"""

# Take a pair: free, already ours (e.g. after Redis restarted and the worker dropped its
# in-memory pairs), or held by ARGV[2], a worker the caller found dead (its life key gone; checked
# before, in its own slot). KEYS: lease, fence, state. ARGV: worker_id, dead owner ('' if none).
# Returns the new fence token (which fences off any earlier owner's writes) or false (held by
# another worker, or the pair's state is gone: a deleted stream).
ACQUIRE = """
if redis.call('EXISTS', KEYS[3]) == 0 then return false end
local owner = redis.call('GET', KEYS[1])
if owner == false or owner == ARGV[1] or (ARGV[2] ~= '' and owner == ARGV[2]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return redis.call('INCR', KEYS[2])
end
return false
"""

# Release a lease we hold. KEYS: lease. ARGV: worker_id.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Create a stream if it does not exist. KEYS: config, uid, answer, then per model: state (one stream's
# keys: one hash slot). ARGV: config_json, uid, then per model: state bytes. Returns 1 (created) or 0 (exists).
# The stream set (keys.STREAMS, another slot) is not touched here: RESERVE adds the name before and
# the store adds it again after (ApiStore.create), so "config exists => name in the set" holds.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], 'cursor', '-1', 'state', '')
for i = 4, #KEYS do
  redis.call('HSET', KEYS[i], 'state', ARGV[i - 1], 'last_seq', '-1', 'n', '0', 'log_evidence', '0', 'chunks', '0',
             'detector', '', 'keep_from', '0', 'error', '')
end
return 1
"""

# Delete one incarnation of a stream: its keys, only if its uid is the one given (a DELETE that read
# the config of a stream deleted and created again meanwhile would otherwise remove the new stream's
# config, uid and input by name and leave its new models' keys behind, listed nowhere: a new user's
# trial, 1 race in 20). KEYS: uid, then every key of the stream (keys.stream_keys; one hash slot).
# ARGV: uid ('' for a stream created before uids). Returns 1 (deleted) or 0 (another incarnation, or none).
DELETE = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
"""

# Count one more failed attempt at a chunk, unless the pair is gone (a stream deleted meanwhile:
# nothing is written back). KEYS: attempts, state. ARGV: seq. Returns the attempts so far (0: gone).
COUNT_FAILURE = """
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
"""

# Reserve a place in the stream set under the stream limit and the deployment's memory cap, before
# the stream's keys are written. KEYS: the stream set (keys.STREAMS), the bytes per stream
# (keys.STREAM_BYTES; the same slot). ARGV: name, limit, bytes this stream needs, total cap (0: none).
# Returns 1 (added), 2 (already a member: the stream exists, or is being created), 0 (the stream
# limit is reached) or 3 (the streams' bytes would pass the cap). Checked and taken in one step, so
# concurrent creates can pass neither.
RESERVE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 2 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
local cap = tonumber(ARGV[4])
if cap > 0 then
  local used = tonumber(ARGV[3])
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(v) end
  if used > cap then return 3 end
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# Trim a stream's input below the first seq any of its models may still read. KEYS: inbox,
# then every model's state hash. Returns the number of entries removed.
TRIM_INBOX = """
local keep = nil
for i = 2, #KEYS do
  local k = tonumber(redis.call('HGET', KEYS[i], 'keep_from') or '0')
  if keep == nil or k < keep then keep = k end
end
if keep == nil or keep <= 0 then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', (keep + 1) .. '-0')
"""
