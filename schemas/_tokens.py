"""Lua for Redis keys that hold an owner's token (a lease, a lock): extend or delete the key only
while it still holds that token, in one atomic step (a GET then PEXPIRE/DEL from the client could
act on a key another owner took in between)."""

from __future__ import annotations

__all__ = ["TOKEN_EXTEND", "TOKEN_RELEASE"]

TOKEN_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1
end
return 0
"""
"""KEYS[1] the key, ARGV[1] the token, ARGV[2] the new TTL (ms); returns 1 extended, 0 not ours."""

TOKEN_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
"""KEYS[1] the key, ARGV[1] the token; returns 1 deleted, 0 not ours."""
