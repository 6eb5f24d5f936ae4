"""The I/O process: the one process that terminates every engine socket.

`IOProcess` (in `tsfront.io.process`) starts and stops it; `tsfront.io.loop` is what runs
inside it.
"""
