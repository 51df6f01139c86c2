"""The AMQP 0-9-1 codec, sans-IO: the specification (spec), methods, frames,
field tables, content properties and the hand-written hot-path codec. It imports
nothing else of Warren's but shards/build.py (which twin runs), so shards, storage
and tools may use it."""
