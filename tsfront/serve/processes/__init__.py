"""The processes of ``tsfront serve``: one HTTP worker (`worker`), the responses store
(`store`, ``python -m tsfront.serve.processes.store``), and the master's parts: its
supervision policy (`supervisor`), its shared words (`counters`) and its listening sockets
(`ports`).
"""
