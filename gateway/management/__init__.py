"""The management listener: RabbitMQ-compatible HTTP API, Prometheus metrics and a
small dashboard, served from the root gateway process. listener.start() starts
it; api.Management dispatches each request to its handler (routes.py names it)."""
