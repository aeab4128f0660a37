-- A region's allocation table (src/store/redis/saved_table.rs): written by
-- each pod that applies an epoch, before it acknowledges the epoch, so the
-- table kept is never older than what the region acknowledged.
--
-- KEYS[1]  mr:allocation:{<region>}, a hash: cluster, epoch, table.
-- ARGV[1]  the coordinator cluster's id ('' when it names none).
-- ARGV[2]  the table's epoch.
-- ARGV[3]  the table (JSON; '' when it was too large to keep: then nothing
--          older may be restored either).
-- ARGV[4]  when the key expires, Unix ms: the table's lease end plus its
--          longest fallback hold, after which it admits nothing anyway.
-- Returns  the epoch the key holds afterwards: ARGV[2] when written, the
--          newer epoch already kept when not.
--
-- Compare-and-set by epoch: a pod that applies an epoch late never puts an
-- older table over a newer one. A table of another cluster is replaced (its
-- epochs say nothing about this one's).
local held = redis.call('HMGET', KEYS[1], 'cluster', 'epoch')
local epoch = tonumber(ARGV[2])
if held[1] == ARGV[1] then
  local kept = tonumber(held[2])
  if kept and kept >= epoch then
    return kept
  end
end
redis.call('HSET', KEYS[1], 'cluster', ARGV[1], 'epoch', ARGV[2], 'table', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return epoch
