"""Load-testing tools for Warren.

`warren bench` (loadtest.bench: its command line and run) measures scenarios
(loadtest.scenarios) in phases of client processes (loadtest.phases) against brokers
(loadtest.targets), reads a broker's CPU and memory from /proc (loadtest.procs), prints
rows and tables (loadtest.output) and can have an external load generator measure a
scenario (loadtest.external). loadtest.fastclient is a fast client on the project's
codec; loadtest/locustfile.py has Locust users that speak AMQP. The white-box probes
(loadtest/probes: shardcost, gatewaycost, bodycost, wakecost, floor, clientwakes,
instructions) are not installed: they run from a checkout, as
`python3 -m warren.loadtest.probes.shardcost`."""
