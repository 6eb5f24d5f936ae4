/*
 * sse.c: a streamed token's bytes on the wire, in one pass (tsfront/serve/core/push.py's native
 * path): the table detokenizer's step (tsfront/text/detok.py, TableDetokenizer), the text as a
 * JSON string exactly as msgspec encodes it, the SSE event around it and, optionally, the
 * HTTP/1.1 chunk around the event exactly as uvicorn frames a body (lowercase hex length).
 *
 * The detokenizer's state stays where the Python step keeps it: the ``buffer`` attribute of
 * its incremental UTF-8 decoder (the bytes of a character not yet complete), read and written
 * here, so the Python step and this one can take turns on one stream. Bytes that are valid
 * UTF-8 up to an incomplete (but so far valid) last character are their own text; anything
 * else (an invalid sequence) is decoded by CPython's own stateful UTF-8 decoder with the
 * table's error handler, which is what the incremental decoder calls, so both paths give the
 * same text whatever the bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "sse.h"

static PyObject *BUFFER = NULL; /* "buffer", interned */

/* Length of the longest prefix of s[0..n) made of whole, valid UTF-8 characters (as strict as
 * CPython's decoder: no overlongs, no surrogates, nothing above U+10FFFF). *tail_ok is set when
 * the rest is a valid start of one character that more bytes could complete. */
static Py_ssize_t utf8_valid(const unsigned char *s, Py_ssize_t n, int *tail_ok) {
    Py_ssize_t i = 0;
    *tail_ok = 1;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int need;
        unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            *tail_ok = 0;
            return i;
        }
        Py_ssize_t have = n - i - 1;
        Py_ssize_t check = have < need ? have : need;
        for (Py_ssize_t k = 1; k <= check; k++) {
            unsigned char d = s[i + k];
            unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (d < l || d > h) {
                *tail_ok = 0;
                return i;
            }
        }
        if (have < need) return i; /* an incomplete last character, valid so far */
        i += need + 1;
    }
    return i;
}

/* Bytes msgspec writes for byte c of a JSON string's UTF-8 (1: as is). */
static inline int escaped_len(unsigned char c) {
    if (c >= 0x20) return (c == '"' || c == '\\') ? 2 : 1;
    return (c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r') ? 2 : 6;
}

static char *escape(char *out, const unsigned char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
            case '"': *out++ = '"'; break;
            case '\\': *out++ = '\\'; break;
            case '\b': *out++ = 'b'; break;
            case '\t': *out++ = 't'; break;
            case '\n': *out++ = 'n'; break;
            case '\f': *out++ = 'f'; break;
            case '\r': *out++ = 'r'; break;
            default:
                *out++ = 'u';
                *out++ = '0';
                *out++ = '0';
                *out++ = hex[c >> 4];
                *out++ = hex[c & 15];
        }
    }
    *out++ = '"';
    return out;
}

/* The event (or its chunk) for text s[0..n): head, the JSON string, tail. */
static PyObject *event_bytes(const unsigned char *s, Py_ssize_t n, PyObject *head, PyObject *tail,
                             int framed) {
    Py_ssize_t esc = 2;
    for (Py_ssize_t i = 0; i < n; i++) esc += escaped_len(s[i]);
    Py_ssize_t hn = PyBytes_GET_SIZE(head), tn = PyBytes_GET_SIZE(tail);
    Py_ssize_t body = hn + esc + tn;
    /* The chunk's size line, lowercase hex as uvicorn's b"%x\r\n" (snprintf showed in the
     * worker's profile). */
    char size[24];
    int sn = 0;
    if (framed) {
        char digits[16];
        int nd = 0;
        size_t v = (size_t)body;
        do {
            digits[nd++] = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v);
        while (nd) size[sn++] = digits[--nd];
        size[sn++] = '\r';
        size[sn++] = '\n';
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, sn + body + (framed ? 2 : 0));
    if (!result) return NULL;
    char *out = PyBytes_AS_STRING(result);
    memcpy(out, size, (size_t)sn);
    out += sn;
    memcpy(out, PyBytes_AS_STRING(head), (size_t)hn);
    out = escape(out + hn, s, n);
    memcpy(out, PyBytes_AS_STRING(tail), (size_t)tn);
    out += tn;
    if (framed) {
        *out++ = '\r';
        *out++ = '\n';
    }
    return result;
}

static int set_pending(PyObject *decoder, PyObject *old, const char *s, Py_ssize_t n) {
    if (n == 0 && PyBytes_GET_SIZE(old) == 0) return 0; /* b"" stays b"" */
    PyObject *pending = PyBytes_FromStringAndSize(s, n);
    if (!pending) return -1;
    int rc = PyObject_SetAttr(decoder, BUFFER, pending);
    Py_DECREF(pending);
    return rc;
}

PyObject *py_token_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "token_event(pieces, decoder, tokens, head, tail, errors, framed)");
        return NULL;
    }
    PyObject *pieces = args[0], *decoder = args[1], *tokens = args[2], *head = args[3],
             *tail = args[4], *errors = args[5];
    int framed = PyObject_IsTrue(args[6]);
    if (framed < 0) return NULL;
    if (!PyList_CheckExact(pieces) || !PyList_CheckExact(tokens) || !PyBytes_CheckExact(head) ||
        !PyBytes_CheckExact(tail) || !PyUnicode_Check(errors)) {
        PyErr_SetString(PyExc_TypeError,
                        "token_event: pieces and tokens must be lists, head and tail bytes, "
                        "errors a str");
        return NULL;
    }
    if (!BUFFER && !(BUFFER = PyUnicode_InternFromString("buffer"))) return NULL;
    PyObject *old = PyObject_GetAttr(decoder, BUFFER);
    if (!old) return NULL;
    if (!PyBytes_CheckExact(old)) {
        Py_DECREF(old);
        PyErr_SetString(PyExc_TypeError, "token_event: the decoder's buffer must be bytes");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t vocab = PyList_GET_SIZE(pieces), count = PyList_GET_SIZE(tokens);
    Py_ssize_t oldn = PyBytes_GET_SIZE(old);
    /* The bytes of the pending character and the tokens: in place for one token and nothing
     * pending (the common case), else gathered. */
    char stack[512];
    char *heap = NULL;
    const char *data = NULL;
    Py_ssize_t n = oldn;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(tokens, i);
        Py_ssize_t id = PyLong_AsSsize_t(t);
        if (id == -1 && PyErr_Occurred()) {
            /* Not a machine-sized int: no token (as the Python step's range check). */
            PyErr_Clear();
            continue;
        }
        if (id < 0 || id >= vocab) continue;
        PyObject *piece = PyList_GET_ITEM(pieces, id);
        if (!PyBytes_CheckExact(piece)) {
            PyErr_SetString(PyExc_TypeError, "token_event: pieces must hold bytes");
            goto done;
        }
        n += PyBytes_GET_SIZE(piece);
    }
    if (count == 1 && oldn == 0) {
        PyObject *t = PyList_GET_ITEM(tokens, 0);
        Py_ssize_t id = PyLong_AsSsize_t(t);
        if (id == -1 && PyErr_Occurred()) PyErr_Clear();
        data = (id >= 0 && id < vocab) ? PyBytes_AS_STRING(PyList_GET_ITEM(pieces, id)) : "";
    } else {
        char *buf = stack;
        if (n > (Py_ssize_t)sizeof stack) {
            buf = heap = PyMem_Malloc((size_t)n);
            if (!heap) {
                PyErr_NoMemory();
                goto done;
            }
        }
        char *at = buf;
        memcpy(at, PyBytes_AS_STRING(old), (size_t)oldn);
        at += oldn;
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t id = PyLong_AsSsize_t(PyList_GET_ITEM(tokens, i));
            if (id == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                continue;
            }
            if (id < 0 || id >= vocab) continue;
            PyObject *piece = PyList_GET_ITEM(pieces, id);
            memcpy(at, PyBytes_AS_STRING(piece), (size_t)PyBytes_GET_SIZE(piece));
            at += PyBytes_GET_SIZE(piece);
        }
        data = buf;
    }
    int tail_ok;
    Py_ssize_t valid = utf8_valid((const unsigned char *)data, n, &tail_ok);
    /* The event first, then the pending bytes: a call that fails leaves the stream as it was
     * (the Python path can take the same tokens). */
    if (tail_ok) {
        result = valid == 0 ? Py_NewRef(Py_None)
                            : event_bytes((const unsigned char *)data, valid, head, tail, framed);
        if (result && set_pending(decoder, old, data + valid, n - valid) < 0) Py_CLEAR(result);
        goto done;
    }
    /* An invalid sequence: CPython's decoder and the table's error handler decide the text. */
    const char *errs = PyUnicode_AsUTF8(errors);
    if (!errs) goto done;
    Py_ssize_t consumed = 0;
    PyObject *text = PyUnicode_DecodeUTF8Stateful(data, n, errs, &consumed);
    if (!text) goto done;
    Py_ssize_t tn;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &tn);
    if (utf8)
        result = tn == 0 ? Py_NewRef(Py_None)
                         : event_bytes((const unsigned char *)utf8, tn, head, tail, framed);
    Py_DECREF(text);
    if (result && set_pending(decoder, old, data + consumed, n - consumed) < 0) Py_CLEAR(result);
done:
    if (heap) PyMem_Free(heap);
    Py_DECREF(old);
    return result;
}
