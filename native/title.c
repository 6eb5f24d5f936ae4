/*
 * title.c: a process's title, as ps shows it.
 *
 * The name (/proc/PID/comm, 15 bytes: top, `ps -e`, pgrep) is set with prctl(PR_SET_NAME).
 *
 * The command line (/proc/PID/cmdline: `ps -o args`, `ps aux`) is no copy the kernel keeps:
 * it reads it, at each look, from the memory exec laid the program's arguments in, the argv
 * area [arg_start, arg_end) of the process's stack (fields 48 and 49 of /proc/self/stat,
 * Linux 3.5+). Moving that area elsewhere takes CAP_SYS_RESOURCE (prctl PR_SET_MM), so the
 * title is written into it in place, and can be at most as long as the arguments were; a
 * longer one is cut. The rest of the area is zeroed and its last byte made non-zero: when
 * that byte is not NUL, the kernel takes the command line for one string rewritten by its
 * process and shows it up to its first NUL (fs/proc/base.c, get_mm_cmdline), so `ps` prints
 * the title alone, with no run of blanks after it.
 *
 * What else reads the area after start-up: Python has copied the arguments (sys.argv,
 * sys.orig_argv) before any of its code runs; glibc's program_invocation_name points at
 * argv[0], which then reads as the title. The environment, which follows the area, is left
 * as it is.
 */
#include "title.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* An argv area larger than this is not one exec made (ARG_MAX is 2 MiB by default). */
#define MAX_AREA ((size_t)64 << 20)

/* The argv area of this process from /proc/self/stat; 0, or -1 with errno set. */
static int argv_area(char **start, size_t *size) {
    char buf[2048];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int saved = errno;
    close(fd);
    if (n <= 0) {
        errno = n < 0 ? saved : EIO;
        return -1;
    }
    buf[n] = '\0';
    /* The name (field 2) is in parentheses and may hold spaces and ')': count from the last. */
    char *p = strrchr(buf, ')');
    if (p == NULL) {
        errno = EIO;
        return -1;
    }
    p++;
    unsigned long long arg_start = 0, arg_end = 0;
    for (int field = 3; field <= 49; field++) {
        while (*p == ' ') p++;
        if (*p == '\0') {
            errno = ENOSYS; /* a kernel older than 3.5: no such fields */
            return -1;
        }
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (field == 48) arg_start = v;
        if (field == 49) arg_end = v;
        p = end;
        while (*p != ' ' && *p != '\0') p++; /* the state field (3) is a letter */
    }
    if (arg_start == 0 || arg_end <= arg_start || arg_end - arg_start > MAX_AREA) {
        errno = EINVAL;
        return -1;
    }
    *start = (char *)(uintptr_t)arg_start;
    *size = (size_t)(arg_end - arg_start);
    return 0;
}

/* set_process_title(title, name) -> int: the process's name (prctl PR_SET_NAME: its first
 * 15 bytes) and its command line, the title cut to its argv area; returns the bytes of the
 * title the command line shows (0 when the area cannot be found). A NUL in either is a
 * ValueError, before anything changes. */
PyObject *py_set_process_title(PyObject *self, PyObject *args) {
    const char *title, *name;
    Py_ssize_t len, name_len;
    if (!PyArg_ParseTuple(args, "s#s#:set_process_title", &title, &len, &name, &name_len))
        return NULL;
    if (memchr(title, '\0', (size_t)len) != NULL || memchr(name, '\0', (size_t)name_len) != NULL) {
        PyErr_SetString(PyExc_ValueError, "a process title holds no NUL character");
        return NULL;
    }
    char comm[16];
    size_t cut = name_len < 15 ? (size_t)name_len : 15;
    memcpy(comm, name, cut);
    comm[cut] = '\0';
    if (prctl(PR_SET_NAME, (unsigned long)comm, 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    char *start;
    size_t size;
    if (argv_area(&start, &size) != 0 || size < 2) return PyLong_FromLong(0);
    /* The title, a NUL, zeros, and a last byte that is not NUL (see the top of the file). */
    size_t shown = (size_t)len < size - 1 ? (size_t)len : size - 1;
    memcpy(start, title, shown);
    memset(start + shown, 0, size - shown);
    if (shown < size - 1) start[size - 1] = ' ';
    return PyLong_FromSize_t(shown);
}
