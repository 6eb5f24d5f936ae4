"""What the processes of one machine agree on: no sockets, no loops, nothing that runs.

The I/O process (`tsfront.io`) and the worker side (`tsfront.attachment`, `tsfront.slots`,
`tsfront.stream`, `tsfront.client`) both import this package and nothing of each other:

* `tsfront.ipc.submit`: the frames of a submission on the submit socket (the header, the
  abort entries), the workers' ZMQ identities and the ticket ranges of their attaches;
* `tsfront.ipc.control`: the messages of the control channel, as msgspec tagged Structs, and
  their length-prefixed framing (the socket side is `tsfront.control`);
* `tsfront.ipc.codes`: the numbers of the shared region the C extension also knows (the local
  end codes, the engine table's word indices and published engine states), checked against
  `tsfront._native` when this package is imported.

It may import `tsfront._native`, `tsfront.errors` and msgspec, nothing else of tsfront.
"""
