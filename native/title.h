/*
 * title.h: the process's title as ps shows it: its command line (/proc/PID/cmdline, what
 * `ps -o args` and `ps aux` print) and its name (/proc/PID/comm: top, `ps -e`, pgrep).
 */
#ifndef TSFRONT_TITLE_H
#define TSFRONT_TITLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* set_process_title(title, name) -> int (see module.c for the contract). */
PyObject *py_set_process_title(PyObject *self, PyObject *args);

#endif
