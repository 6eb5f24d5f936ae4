"""The HTTP edge of a worker: the connection (`protocol`, `cycle`, `transport`), keys, request
ids, CORS and the access log (`gate`), the edge's flags (`settings`), the raw ASGI app that
routes each request to its dialect (`asgi`), and the ``/metrics`` page (`metrics_page`).
"""
