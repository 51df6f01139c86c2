"""Load-testing tools for Warren: `warren bench` (loadtest.bench), a fast client on the
project's codec (loadtest.fastclient) and Locust users that speak AMQP
(loadtest/locustfile.py)."""
