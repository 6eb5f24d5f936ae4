/* reader.h: one worker's side of the slot region (see reader.c). */
#ifndef TSFRONT_READER_H
#define TSFRONT_READER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject ReaderType;

#endif
