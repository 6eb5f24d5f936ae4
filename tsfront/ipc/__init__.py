"""What the I/O process and its workers share: the protocol they agree on, the shared region,
the control channel's socket side; no loops, nothing that runs by itself.

The I/O process (`tsfront.io`) and the worker side (`tsfront.client`) both import this package
and nothing of each other:

* `tsfront.ipc.submit`: the frames of a submission on the submit socket (the header, the
  abort entries), the workers' ZMQ identities and the ticket ranges of their attaches;
* `tsfront.ipc.control`: the messages of the control channel, as msgspec tagged Structs, and
  their length-prefixed framing (the socket side is `tsfront.ipc.channel`);
* `tsfront.ipc.codes`: the numbers of the shared region the C extension also knows (the local
  end codes, the engine table's word indices and published engine states), checked against
  `tsfront._native` when this package is imported;
* `tsfront.ipc.hashes`: the prompt block hashes a worker sends with an ADD (prefix affinity);
* `tsfront.ipc.region`: the shared region (header, engine table, slot rings, notify rings,
  metrics area): created by the I/O process, mapped by every worker;
* `tsfront.ipc.channel`: the control channel's socket side (fds, non-blocking reads);
* `tsfront.ipc.aborts`: `RecentAborts`, the rids aborted lately, kept by both sides.

It may import `tsfront._native`, `tsfront.errors`, `tsfront.metrics.layout` (where the region
puts the figures) and msgspec, nothing else of tsfront.
"""
