"""Load-testing tools for Warren.

`warren bench` (loadtest.bench: its command line and run) measures scenarios
(loadtest.scenarios) in phases of client processes (loadtest.phases) against brokers
(loadtest.targets), reads a broker's CPU and memory from /proc (loadtest.procs), prints
rows and tables (loadtest.output) and can have an external load generator measure a
scenario (loadtest.external). loadtest.shardcost measures one shard's CPU and fsyncs per
durable message by playing the gateway over its rings. loadtest.fastclient is a fast
client on the project's codec; loadtest/locustfile.py has Locust users that speak AMQP."""
