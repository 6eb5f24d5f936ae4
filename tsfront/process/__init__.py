"""How tsfront's processes are started and live, for every process that starts one.

* `tsfront.process.ioproc`: `IOProcess`, the master's handle on the I/O process (start it,
  know its address, stop it);
* `tsfront.process.child`: the command line of every child started with `subprocess`
  (``python -P -m ...``);
* `tsfront.process.heap`: garbage-collector settings of long-running processes;
* `tsfront.process.sigint`: Ctrl-C while a child is being started.

Leaves: they import `tsfront.config` and `tsfront.errors` at most, nothing of the processes'
own code.
"""
