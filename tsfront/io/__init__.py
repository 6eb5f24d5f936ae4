"""The I/O process: the one process that terminates every engine socket.

`IOProcess` (in `tsfront.process.ioproc`, which runs in the master) starts and stops it; what runs
inside it is the state machine `tsfront.io.core` (no sockets) and the shell around it,
`tsfront.io.loop`.
"""
