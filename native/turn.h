/* turn.h: the I/O process's hot turn in native code (tsfront._native.Turn; see turn.c). */
#ifndef TSFRONT_TURN_H
#define TSFRONT_TURN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject TurnType;
/* Interns the attribute names the turn reads (module init); 0, or -1 with an exception. */
int turn_module_init(void);

#endif
