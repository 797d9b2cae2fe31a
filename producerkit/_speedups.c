/* producerkit._speedups: the core's hot path in C.
 *
 * The core (WindowCore, Router, Admission, pop_run, tell_run, SlotsMaker as new_delivery,
 * ProducerCore, ProduceDoor) is the C implementation of producerkit/_core_py.py: the same
 * names and signatures, and that module says what each does. producerkit/_core.py chooses one
 * implementation for the whole core at import. No function here looks up an attribute of a
 * producerkit object by name: what the C code calls is handed to it by its constructor.
 *
 * The Kafka wire (record batches, CRC-32C) is the Kafka backend's own extension:
 * producerkit/backends/kafka/_cwire.c.
 *
 * The module is optional: producerkit/_fast.py loads it, unless it did not compile (no
 * compiler or Python headers at install time) or PRODUCERKIT_NO_SPEEDUPS is set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

/* Positions in producerkit._record.Record (checked against the Python constants at import, by
 * producerkit._fast). */
#define R_SEQ 0
#define R_VALUE 1
#define R_KEY 2
#define R_TOPIC 3
#define R_PARTITION 4
#define R_HEADERS 5
#define R_MSG_ID 6
#define R_DEADLINE 7
#define R_CONNECTION 8
#define R_FUTURE 9
#define R_TIMESTAMP 10
#define R_CONTEXT 11
#define R_FIELDS 12

/* ------------------------------------------------------------------------------ settling */

/* dict.pop(key, None) for a dict whose values are never None: the value (a new reference), or
 * NULL, with an exception set on error and without one if key was not there. */
static PyObject *dict_take(PyObject *dict, PyObject *key) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *value;
    return PyDict_Pop(dict, key, &value) < 0 ? NULL : value;
#else
    PyObject *value = _PyDict_Pop(dict, key, Py_None);
    if (value == Py_None) {
        Py_DECREF(value);
        return NULL;
    }
    return value;
#endif
}

/* The exception being raised, now cleared. New reference. */
static PyObject *raised_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
#endif
}

/* ------------------------------------------------------------------------------ the ledger */

PyDoc_STRVAR(Ledger_doc,
"The window's ledger in C: sequence number -> record, for the records in flight, in the order\n"
"they were admitted. A mapping as the Python core's dict is used: len, in, [seq], del, pop,\n"
"get, keys(), values(), items() (lists, in admission order) and iteration over the seqs.\n"
"Only admission puts records in, each with a higher seq than any before. A record sits in a\n"
"ring indexed by its seq; one still in flight when the ring comes round to its slot again\n"
"moves to a dict behind it (older than every record in the ring), so order is kept.");

#define LEDGER_FIRST_SLOTS 64
#define LEDGER_MAX_SLOTS (1 << 20)

typedef struct {
    PyObject_HEAD
    PyObject **records; /* slot seq & mask -> its record (a reference), or NULL */
    long long *seqs;    /* the seq of each slot's record */
    Py_ssize_t mask;    /* slots - 1 (a power of two) */
    Py_ssize_t in_ring; /* records in the ring */
    long long head;     /* no record in the ring has a lower seq */
    long long next;     /* one above the highest seq put */
    PyObject *overflow; /* dict seq -> record: records the ring came round to, oldest first */
} Ledger;

static PyTypeObject LedgerType;

static PyObject *Ledger_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Ledger() takes no arguments");
        return NULL;
    }
    Ledger *self = (Ledger *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->records = PyMem_Calloc(LEDGER_FIRST_SLOTS, sizeof(PyObject *));
    self->seqs = PyMem_Calloc(LEDGER_FIRST_SLOTS, sizeof(long long));
    self->overflow = PyDict_New();
    if (self->records == NULL || self->seqs == NULL || self->overflow == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->mask = LEDGER_FIRST_SLOTS - 1;
    self->head = self->next = 1;
    return (PyObject *)self;
}

static inline Py_ssize_t ledger_len(Ledger *self) {
    return self->in_ring + PyDict_GET_SIZE(self->overflow);
}

static int Ledger_traverse(Ledger *self, visitproc visit, void *arg) {
    if (self->records != NULL && self->in_ring > 0)
        for (Py_ssize_t i = 0; i <= self->mask; i++) Py_VISIT(self->records[i]);
    Py_VISIT(self->overflow);
    return 0;
}

/* Empty (the collector breaking a cycle through a record): usable after, and empty. */
static int Ledger_clear(Ledger *self) {
    if (self->records != NULL)
        for (Py_ssize_t i = 0; i <= self->mask; i++) Py_CLEAR(self->records[i]);
    self->in_ring = 0;
    if (self->overflow != NULL) PyDict_Clear(self->overflow);
    return 0;
}

static void Ledger_dealloc(Ledger *self) {
    PyObject_GC_UnTrack(self);
    Ledger_clear(self);
    Py_CLEAR(self->overflow);
    PyMem_Free(self->records);
    PyMem_Free(self->seqs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Twice the slots, each record moved to its slot there (the ring's seqs lie within one round
 * of the old size, so no two meet). 0, or -1 with MemoryError set. */
static int ledger_grow(Ledger *self) {
    Py_ssize_t slots = (self->mask + 1) * 2;
    PyObject **records = PyMem_Calloc(slots, sizeof(PyObject *));
    long long *seqs = PyMem_Calloc(slots, sizeof(long long));
    if (records == NULL || seqs == NULL) {
        PyMem_Free(records);
        PyMem_Free(seqs);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i <= self->mask; i++) {
        if (self->records[i] == NULL) continue;
        long long seq = self->seqs[i];
        records[seq & (slots - 1)] = self->records[i];
        seqs[seq & (slots - 1)] = seq;
    }
    PyMem_Free(self->records);
    PyMem_Free(self->seqs);
    self->records = records;
    self->seqs = seqs;
    self->mask = slots - 1;
    return 0;
}

/* Put ``record`` (a Record whose seq, ``seq``, is above every seq put before) in the ledger,
 * taking a new reference. 0, or -1 with an exception set. */
static int ledger_put(Ledger *self, long long seq, PyObject *record) {
    if (seq < self->next) {
        PyErr_SetString(PyExc_ValueError, "the ledger takes each record with a higher seq");
        return -1;
    }
    if (self->in_ring + 1 > (self->mask + 1) / 2 && self->mask + 1 < LEDGER_MAX_SLOTS &&
        ledger_grow(self) < 0)
        return -1;
    Py_ssize_t slot = (Py_ssize_t)(seq & self->mask);
    PyObject *there = self->records[slot];
    if (there != NULL) { /* still in flight a round later: behind the ring, in seq order */
        if (PyDict_SetItem(self->overflow, PyTuple_GET_ITEM(there, R_SEQ), there) < 0) return -1;
        Py_DECREF(there);
        self->in_ring--;
    }
    self->records[slot] = Py_NewRef(record);
    self->seqs[slot] = seq;
    self->in_ring++;
    self->next = seq + 1;
    return 0;
}

/* The slot holding ``seq`` in the ring, or -1. */
static inline Py_ssize_t ledger_slot(Ledger *self, long long seq) {
    Py_ssize_t slot = (Py_ssize_t)(seq & self->mask);
    return self->records[slot] != NULL && self->seqs[slot] == seq ? slot : -1;
}

/* ``key`` as a seq: 1, 0 if it is not an int or out of range (no record has it), -1 on error. */
static int ledger_seq_of(PyObject *key, long long *seq) {
    if (!PyLong_Check(key)) return 0;
    int overflowed;
    *seq = PyLong_AsLongLongAndOverflow(key, &overflowed);
    if (*seq == -1 && PyErr_Occurred()) return -1;
    return !overflowed;
}

/* Remove ``key``'s record: a new reference to it, or NULL: with an exception set on error,
 * without one if it is not there. */
static PyObject *ledger_pop(Ledger *self, PyObject *key) {
    long long seq;
    int is_seq = ledger_seq_of(key, &seq);
    if (is_seq < 0) return NULL;
    if (is_seq) {
        Py_ssize_t slot = ledger_slot(self, seq);
        if (slot >= 0) {
            PyObject *record = self->records[slot];
            self->records[slot] = NULL;
            self->in_ring--;
            return record;
        }
    }
    return PyDict_GET_SIZE(self->overflow) == 0 ? NULL : dict_take(self->overflow, key);
}

/* ``key``'s record (borrowed), or NULL: with an exception set on error, without if absent. */
static PyObject *ledger_get(Ledger *self, PyObject *key) {
    long long seq;
    int is_seq = ledger_seq_of(key, &seq);
    if (is_seq < 0) return NULL;
    if (is_seq) {
        Py_ssize_t slot = ledger_slot(self, seq);
        if (slot >= 0) return self->records[slot];
    }
    if (PyDict_GET_SIZE(self->overflow) == 0) return NULL;
    return PyDict_GetItemWithError(self->overflow, key);
}

/* pending.pop(key, None) is not None for the window's ledger (a Ledger, or the Python core's
 * dict): 1/0, -1 with an exception set. */
static int ledger_discard(PyObject *pending, PyObject *key) {
    PyObject *record = Py_IS_TYPE(pending, &LedgerType) ? ledger_pop((Ledger *)pending, key)
                                                        : dict_take(pending, key);
    if (record == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(record);
    return 1;
}

/* Append to ``listed`` what ``what`` asks of one entry: 0 its seq, 1 its record, 2 both as a
 * pair. 0, or -1 with an exception set. */
static int ledger_append(PyObject *listed, int what, PyObject *seq, PyObject *record) {
    PyObject *item = what == 0 ? Py_NewRef(seq)
                     : what == 1 ? Py_NewRef(record)
                                 : PyTuple_Pack(2, seq, record);
    if (item == NULL) return -1;
    int appended = PyList_Append(listed, item);
    Py_DECREF(item);
    return appended;
}

/* What iteration yields, in admission order: 0 keys, 1 values, 2 (key, value) pairs. A new
 * list, or NULL with an exception set. */
static PyObject *ledger_list(Ledger *self, int what) {
    PyObject *listed = PyList_New(0);
    if (listed == NULL) return NULL;
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(self->overflow, &position, &key, &value)) {
        if (ledger_append(listed, what, key, value) < 0) {
            Py_DECREF(listed);
            return NULL;
        }
    }
    long long slots = self->mask + 1;
    if (self->head < self->next - slots) self->head = self->next - slots;
    int found = 0;
    for (long long seq = self->head; seq < self->next; seq++) {
        Py_ssize_t slot = ledger_slot(self, seq);
        if (slot < 0) {
            if (!found) self->head = seq + 1; /* gone, and never put again */
            continue;
        }
        found = 1;
        PyObject *record = self->records[slot];
        if (ledger_append(listed, what, PyTuple_GET_ITEM(record, R_SEQ), record) < 0) {
            Py_DECREF(listed);
            return NULL;
        }
    }
    return listed;
}

static Py_ssize_t Ledger_length(Ledger *self) { return ledger_len(self); }

static PyObject *Ledger_subscript(Ledger *self, PyObject *key) {
    PyObject *record = ledger_get(self, key);
    if (record == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return Py_NewRef(record);
}

static int Ledger_ass_subscript(Ledger *self, PyObject *key, PyObject *value) {
    if (value != NULL) {
        PyErr_SetString(PyExc_TypeError, "records enter the ledger by admission only");
        return -1;
    }
    PyObject *record = ledger_pop(self, key);
    if (record == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    Py_DECREF(record);
    return 0;
}

static int Ledger_contains(Ledger *self, PyObject *key) {
    PyObject *record = ledger_get(self, key);
    return record != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

static PyObject *Ledger_pop(Ledger *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(seq[, default])");
        return NULL;
    }
    PyObject *record = ledger_pop(self, args[0]);
    if (record != NULL || PyErr_Occurred()) return record;
    if (nargs == 2) return Py_NewRef(args[1]);
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

static PyObject *Ledger_get(Ledger *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(seq[, default])");
        return NULL;
    }
    PyObject *record = ledger_get(self, args[0]);
    if (record != NULL) return Py_NewRef(record);
    if (PyErr_Occurred()) return NULL;
    return Py_NewRef(nargs == 2 ? args[1] : Py_None);
}

static PyObject *Ledger_keys(Ledger *self, PyObject *unused) { return ledger_list(self, 0); }
static PyObject *Ledger_values(Ledger *self, PyObject *unused) { return ledger_list(self, 1); }
static PyObject *Ledger_items(Ledger *self, PyObject *unused) { return ledger_list(self, 2); }

static PyObject *Ledger_iter(Ledger *self) {
    PyObject *keys = ledger_list(self, 0);
    if (keys == NULL) return NULL;
    PyObject *iterator = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return iterator;
}

static PyObject *Ledger_repr(Ledger *self) {
    return PyUnicode_FromFormat("<producerkit Ledger of %zd records>", ledger_len(self));
}

static PyMappingMethods Ledger_as_mapping = {
    .mp_length = (lenfunc)Ledger_length,
    .mp_subscript = (binaryfunc)Ledger_subscript,
    .mp_ass_subscript = (objobjargproc)Ledger_ass_subscript,
};

static PySequenceMethods Ledger_as_sequence = {
    .sq_contains = (objobjproc)Ledger_contains,
};

static PyMethodDef Ledger_methods[] = {
    {"pop", (PyCFunction)(void (*)(void))Ledger_pop, METH_FASTCALL,
     "pop(seq[, default]) -> the record, removed"},
    {"get", (PyCFunction)(void (*)(void))Ledger_get, METH_FASTCALL,
     "get(seq[, default]) -> the record, or default"},
    {"keys", (PyCFunction)Ledger_keys, METH_NOARGS, "the seqs in admission order (a list)"},
    {"values", (PyCFunction)Ledger_values, METH_NOARGS,
     "the records in admission order (a list)"},
    {"items", (PyCFunction)Ledger_items, METH_NOARGS,
     "(seq, record) pairs in admission order (a list)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.Ledger",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Ledger_doc,
    .tp_new = Ledger_new,
    .tp_dealloc = (destructor)Ledger_dealloc,
    .tp_traverse = (traverseproc)Ledger_traverse,
    .tp_clear = (inquiry)Ledger_clear,
    .tp_as_mapping = &Ledger_as_mapping,
    .tp_as_sequence = &Ledger_as_sequence,
    .tp_iter = (getiterfunc)Ledger_iter,
    .tp_methods = Ledger_methods,
    .tp_repr = (reprfunc)Ledger_repr,
};

/* A hint to load the cache line at p, to be written (a no-op where the compiler has none). */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH_TO_WRITE(p) __builtin_prefetch((p), 1)
#else
#define PREFETCH_TO_WRITE(p) ((void)(p))
#endif

/* An acked run's records are dropped soon after it is settled (their list goes with the Kafka
 * batch), and each drop decrefs the record's value and key: objects admitted long before, out
 * of cache, each a miss in turn. Settling asks for their headers first, a run at a time. */
static inline void prefetch_release(PyObject *record) {
    PREFETCH_TO_WRITE(PyTuple_GET_ITEM(record, R_VALUE));
    PREFETCH_TO_WRITE(PyTuple_GET_ITEM(record, R_KEY));
}

PyDoc_STRVAR(pop_run_doc,
"pop_run(pending, records) -> (count, waiting)\n\n"
"Remove each record from pending (the window's ledger by sequence number: a Ledger, or the\n"
"Python core's dict) and count those that were there;\n"
"waiting lists the positions, in records, of removed records with a future (None if none).\n"
"InFlightWindow.acked_run's loop, for a whole Kafka batch at once.");

static PyObject *pop_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !(PyDict_Check(args[0]) || Py_IS_TYPE(args[0], &LedgerType)) ||
        !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pop_run(pending: Ledger | dict, records: list)");
        return NULL;
    }
    PyObject *pending = args[0], *records = args[1], *waiting = NULL;
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) <= R_FUTURE) {
            PyErr_SetString(PyExc_TypeError, "pop_run: a record is not a producerkit Record");
            goto error;
        }
        prefetch_release(record);
        int found = ledger_discard(pending, PyTuple_GET_ITEM(record, R_SEQ));
        if (found < 0) goto error;
        if (!found) continue; /* already failed (timed out) or reported twice */
        count++;
        if (PyTuple_GET_ITEM(record, R_FUTURE) != Py_None) {
            if (waiting == NULL && (waiting = PyList_New(0)) == NULL) goto error;
            PyObject *position = PyLong_FromSsize_t(i);
            if (position == NULL || PyList_Append(waiting, position) < 0) {
                Py_XDECREF(position);
                goto error;
            }
            Py_DECREF(position);
        }
    }
    if (waiting == NULL) return Py_BuildValue("(nO)", count, Py_None);
    PyObject *result = Py_BuildValue("(nN)", count, waiting);
    return result;
error:
    Py_XDECREF(waiting);
    return NULL;
}

/* ------------------------------------------------------------------------------ deliveries */

PyDoc_STRVAR(SlotsMaker_doc,
"SlotsMaker(cls, slots)\n\n"
"A constructor of cls, a class whose fields are plain object slots (an attrs frozen slots\n"
"class): maker(*values) is an instance whose slot slots[i] (a slot's member descriptor, as\n"
"vars(cls) holds it) holds values[i], made without running cls.__init__ (no checks, no\n"
"conversions: the caller passes what __init__ would store). At most 8.");

#define MAKER_MAX 8

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t count;
    Py_ssize_t offsets[MAKER_MAX];
} SlotsMaker;

static PyObject *SlotsMaker_vectorcall(SlotsMaker *self, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != self->count || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd positional arguments",
                     self->cls->tp_name, self->count);
        return NULL;
    }
    PyObject *made = self->cls->tp_alloc(self->cls, 0);
    if (made == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        *(PyObject **)((char *)made + self->offsets[i]) = Py_NewRef(args[i]);
    return made;
}

static int SlotsMaker_init(SlotsMaker *self, PyObject *args, PyObject *kwargs) {
    PyObject *cls, *slots;
    static char *keywords[] = {"cls", "slots", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!:SlotsMaker", keywords, &PyType_Type,
                                     &cls, &PyTuple_Type, &slots))
        return -1;
    Py_ssize_t count = PyTuple_GET_SIZE(slots);
    if (count > MAKER_MAX) {
        PyErr_SetString(PyExc_ValueError, "SlotsMaker: at most 8 slots");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *descr = PyTuple_GET_ITEM(slots, i);
        int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                   ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
                   PyType_IsSubtype((PyTypeObject *)cls,
                                    ((PyMemberDescrObject *)descr)->d_common.d_type);
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "SlotsMaker: %R is no object slot of %R", descr, cls);
            return -1;
        }
        self->offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_XSETREF(self->cls, (PyTypeObject *)Py_NewRef(cls));
    self->count = count;
    self->vectorcall = (vectorcallfunc)SlotsMaker_vectorcall;
    return 0;
}

static void SlotsMaker_dealloc(SlotsMaker *self) {
    Py_XDECREF(self->cls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SlotsMakerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.SlotsMaker",
    .tp_basicsize = sizeof(SlotsMaker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = SlotsMaker_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SlotsMaker_init,
    .tp_dealloc = (destructor)SlotsMaker_dealloc,
    .tp_vectorcall_offset = offsetof(SlotsMaker, vectorcall),
    .tp_call = PyVectorcall_Call,
};

PyDoc_STRVAR(ExactBytes_doc,
"ExactBytes(function)\n\n"
"A callable: ExactBytes(function)(obj) returns function(obj), except that a bytes result is\n"
"returned as a new bytes object of exactly its length, the function's own released at once.\n"
"For a function that builds its bytes in an oversized buffer and shrinks it in place\n"
"(orjson.dumps): many such results kept alive together (until their acks) leave the heap\n"
"fragmented, which costs more than the copy. Anything else function returns or raises\n"
"passes through unchanged.");

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function;
} ExactBytes;

static PyObject *ExactBytes_vectorcall(ExactBytes *self, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames) {
    PyObject *result = PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    if (result == NULL || !PyBytes_CheckExact(result)) return result;
    Py_SETREF(result, PyBytes_FromStringAndSize(PyBytes_AS_STRING(result),
                                                PyBytes_GET_SIZE(result)));
    return result;
}

static int ExactBytes_init(ExactBytes *self, PyObject *args, PyObject *kwargs) {
    PyObject *function;
    static char *keywords[] = {"function", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:ExactBytes", keywords, &function))
        return -1;
    if (!PyCallable_Check(function)) {
        PyErr_Format(PyExc_TypeError, "ExactBytes: %R is not callable", function);
        return -1;
    }
    Py_XSETREF(self->function, Py_NewRef(function));
    self->vectorcall = (vectorcallfunc)ExactBytes_vectorcall;
    return 0;
}

static int ExactBytes_traverse(ExactBytes *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    return 0;
}

static int ExactBytes_clear(ExactBytes *self) {
    Py_CLEAR(self->function);
    return 0;
}

static void ExactBytes_dealloc(ExactBytes *self) {
    PyObject_GC_UnTrack(self);
    ExactBytes_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ExactBytes_repr(ExactBytes *self) {
    return PyUnicode_FromFormat("ExactBytes(%R)", self->function);
}

static PyMemberDef ExactBytes_members[] = {
    {"function", T_OBJECT_EX, offsetof(ExactBytes, function), READONLY,
     "the function whose bytes are copied"},
    {NULL},
};

static PyTypeObject ExactBytesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.ExactBytes",
    .tp_basicsize = sizeof(ExactBytes),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = ExactBytes_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ExactBytes_init,
    .tp_dealloc = (destructor)ExactBytes_dealloc,
    .tp_traverse = (traverseproc)ExactBytes_traverse,
    .tp_clear = (inquiry)ExactBytes_clear,
    .tp_repr = (reprfunc)ExactBytes_repr,
    .tp_members = ExactBytes_members,
    .tp_vectorcall_offset = offsetof(ExactBytes, vectorcall),
    .tp_call = PyVectorcall_Call,
};

PyDoc_STRVAR(tell_run_doc,
"tell_run(pending, records, first_offset, stored_at, make_delivery, on_delivery, report,\n"
"         answer) -> count\n\n"
"pop_run's settling with on_delivery (InFlightWindow.acked_run's loop): each record still in\n"
"pending is removed and its make_delivery(topic, partition, offset, False, timestamp) told to\n"
"on_delivery(delivery, record.context), then answer(slot, delivery) where it has a slot. Offsets run from first_offset by position (all None if it is None); timestamp is\n"
"stored_at, else the record's CreateTime, in epoch seconds (None if neither). An Exception\n"
"on_delivery raises goes to report(exc), and the run goes on. Returns how many were removed.");

static PyObject *tell_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !(PyDict_Check(args[0]) || Py_IS_TYPE(args[0], &LedgerType)) ||
        !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "tell_run(pending: Ledger | dict, records: list, "
                                         "first_offset, stored_at, make_delivery, on_delivery, "
                                         "report, answer)");
        return NULL;
    }
    PyObject *pending = args[0], *records = args[1], *make = args[4], *tell = args[5];
    long long first = 0;
    int offsets = args[2] != Py_None;
    if (offsets && (first = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred()) return NULL;
    PyObject *stored = NULL; /* stored_at in seconds, the same for the whole run */
    if (args[3] != Py_None) {
        double ms = PyFloat_AsDouble(args[3]);
        if (ms == -1.0 && PyErr_Occurred()) return NULL;
        if ((stored = PyFloat_FromDouble(ms / 1000.0)) == NULL) return NULL;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) <= R_CONTEXT) {
            PyErr_SetString(PyExc_TypeError, "tell_run: a record is not a producerkit Record");
            goto error;
        }
        prefetch_release(record);
        int found = ledger_discard(pending, PyTuple_GET_ITEM(record, R_SEQ));
        if (found < 0) goto error;
        if (!found) continue; /* already failed (timed out) or reported twice */
        count++;
        PyObject *offset = offsets ? PyLong_FromLongLong(first + i) : Py_NewRef(Py_None);
        PyObject *stamp = PyTuple_GET_ITEM(record, R_TIMESTAMP);
        if (stored != NULL) {
            stamp = Py_NewRef(stored);
        } else if (stamp != Py_None) {
            double ms = PyLong_AsDouble(stamp);
            stamp = ms == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(ms / 1000.0);
        } else {
            stamp = Py_NewRef(Py_None);
        }
        PyObject *delivery = NULL;
        if (offset != NULL && stamp != NULL) {
            PyObject *fields[5] = {PyTuple_GET_ITEM(record, R_TOPIC),
                                   PyTuple_GET_ITEM(record, R_PARTITION), offset, Py_False, stamp};
            delivery = PyObject_Vectorcall(make, fields, 5, NULL);
        }
        Py_XDECREF(offset);
        Py_XDECREF(stamp);
        if (delivery == NULL) goto error;
        PyObject *told_args[2] = {delivery, PyTuple_GET_ITEM(record, R_CONTEXT)};
        PyObject *told = PyObject_Vectorcall(tell, told_args, 2, NULL);
        if (told == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) goto error_delivery;
            PyObject *exc = raised_exception();
            told = PyObject_CallOneArg(args[6], exc);
            Py_DECREF(exc);
            if (told == NULL) goto error_delivery;
        }
        Py_DECREF(told);
        PyObject *slot = PyTuple_GET_ITEM(record, R_FUTURE);
        if (slot != Py_None) {
            PyObject *answer_args[2] = {slot, delivery};
            PyObject *answered = PyObject_Vectorcall(args[7], answer_args, 2, NULL);
            if (answered == NULL) goto error_delivery;
            Py_DECREF(answered);
        }
        Py_DECREF(delivery);
        continue;
    error_delivery:
        Py_DECREF(delivery);
        goto error;
    }
    Py_XDECREF(stored);
    return PyLong_FromSsize_t(count);
error:
    Py_XDECREF(stored);
    return NULL;
}

/* ------------------------------------------------------------------------------ routing */

PyDoc_STRVAR(Router_doc,
"Router(partitioner, key_hash, keyless_partition, connections, not_a_partition, native_hash=0)\n\n"
"The C implementation of producerkit._core_py.Router (same constructor, same route()). native_hash:\n"
"the address of a C function uint64 f(const void *data, size_t size, uint64 seed) that computes\n"
"key_hash(key) for a bytes key with seed 0 (xxHash's XXH3_64bits_withSeed where key_hash is\n"
"xxhash's xxh3_64_intdigest: see producerkit._routing.native_hash), called instead of key_hash;\n"
"it is checked against key_hash on a few keys here, and a mismatch raises ValueError.");

typedef struct {
    PyObject_HEAD
    PyObject *partitioner; /* partitioner(key, n) -> int */
    PyObject *key_hash;    /* h with partition h(key) % n, or None */
    uint64_t (*native_hash)(const void *, size_t, uint64_t); /* key_hash in C, or NULL */
    PyObject *keyless_partition; /* keyless_partition(topic, n) -> int */
    PyObject *not_a_partition;   /* the error class for a partitioner's result that is no int */
    Py_ssize_t connections;
    Py_ssize_t round_robin;
} Router;

static int Router_traverse(Router *self, visitproc visit, void *arg) {
    Py_VISIT(self->partitioner);
    Py_VISIT(self->key_hash);
    Py_VISIT(self->keyless_partition);
    Py_VISIT(self->not_a_partition);
    return 0;
}

static int Router_clear(Router *self) {
    Py_CLEAR(self->partitioner);
    Py_CLEAR(self->key_hash);
    Py_CLEAR(self->keyless_partition);
    Py_CLEAR(self->not_a_partition);
    return 0;
}

static void Router_dealloc(Router *self) {
    PyObject_GC_UnTrack(self);
    Router_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 0 if native_hash computes key_hash on keys of every length class XXH3 treats apart (0, 1-3,
 * 4-8, 9-16, 17-128, 129-240, over 240 bytes), else -1 with ValueError. */
static int check_native_hash(uint64_t (*native_hash)(const void *, size_t, uint64_t),
                             PyObject *key_hash) {
    static const Py_ssize_t sizes[] = {0, 1, 3, 5, 12, 40, 200, 1000};
    char data[1000];
    for (size_t i = 0; i < sizeof(data); i++) data[i] = (char)(i * 31 + 7);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        PyObject *key = PyBytes_FromStringAndSize(data, sizes[i]);
        if (key == NULL) return -1;
        PyObject *expected = PyObject_CallOneArg(key_hash, key);
        Py_DECREF(key);
        if (expected == NULL) return -1;
        unsigned long long want = PyLong_AsUnsignedLongLongMask(expected);
        Py_DECREF(expected);
        if (want == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        if (native_hash(data, (size_t)sizes[i], 0) != want) {
            PyErr_SetString(PyExc_ValueError, "Router: native_hash differs from key_hash");
            return -1;
        }
    }
    return 0;
}

static int Router_init(Router *self, PyObject *args, PyObject *kwargs) {
    PyObject *partitioner, *key_hash, *keyless_partition, *not_a_partition;
    Py_ssize_t connections;
    unsigned long long native_address = 0;
    static char *names[] = {"partitioner", "key_hash",        "keyless_partition",
                            "connections", "not_a_partition", "native_hash",
                            NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnO|K:Router", names, &partitioner,
                                     &key_hash, &keyless_partition, &connections,
                                     &not_a_partition, &native_address))
        return -1;
    uint64_t (*native_hash)(const void *, size_t, uint64_t) = NULL;
    if (native_address != 0) {
        native_hash = (uint64_t(*)(const void *, size_t, uint64_t))(uintptr_t)native_address;
        if (check_native_hash(native_hash, key_hash) < 0) return -1;
    }
    if (connections < 1) {
        PyErr_SetString(PyExc_ValueError, "Router: connections must be at least 1");
        return -1;
    }
    Router_clear(self);
    self->partitioner = Py_NewRef(partitioner);
    self->key_hash = Py_NewRef(key_hash);
    self->keyless_partition = Py_NewRef(keyless_partition);
    self->not_a_partition = Py_NewRef(not_a_partition);
    self->connections = connections;
    self->round_robin = 0;
    self->native_hash = native_hash;
    return 0;
}

/* A bytes key's partition among n > 0 by the native hash. New reference. */
static inline PyObject *native_partition(Router *self, PyObject *key, Py_ssize_t n) {
    uint64_t h = self->native_hash(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key), 0);
    return PyLong_FromSsize_t((Py_ssize_t)(h % (uint64_t)n));
}

/* The key's partition among n (n_obj), as PyRouter computes it. New reference. */
static PyObject *key_partition(Router *self, PyObject *key, PyObject *n_obj) {
    if (self->key_hash == Py_None) {
        PyObject *call_args[2] = {key, n_obj};
        return PyObject_Vectorcall(self->partitioner, call_args, 2, NULL);
    }
    Py_ssize_t n = PyLong_AsSsize_t(n_obj);
    if (n < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no partitions");
        return NULL;
    }
    if (self->native_hash != NULL && PyBytes_CheckExact(key)) return native_partition(self, key, n);
    /* key_hash is one of partitioners.modulo_hash's C hashes (xxh3_64, crc32): its value is an
     * int in [0, 2**64), which the mask reads exactly and faster than the checked conversion. */
    PyObject *hash = PyObject_Vectorcall(self->key_hash, &key, 1, NULL);
    if (hash == NULL) return NULL;
    unsigned long long h = PyLong_AsUnsignedLongLongMask(hash);
    Py_DECREF(hash);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLongLong(h % (unsigned long long)n);
}

/* Raise the router's not_a_partition for a partitioner's result that is no partition. */
static void not_a_partition(Router *self, PyObject *partition) {
    PyErr_Format(self->not_a_partition,
                 "the partitioner returned %R, which is not a partition number (an int)",
                 partition);
}

/* A connection index from an int in [0, connections) or not: -1 with ConfigurationError set. */
static Py_ssize_t connection_of(Router *self, PyObject *number) {
    if (!PyLong_CheckExact(number)) {
        not_a_partition(self, number);
        return -1;
    }
    PyObject *count = PyLong_FromSsize_t(self->connections);
    if (count == NULL) return -1;
    PyObject *index = PyNumber_Remainder(number, count);
    Py_DECREF(count);
    if (index == NULL) return -1;
    Py_ssize_t connection = PyLong_AsSsize_t(index);
    Py_DECREF(index);
    return connection;
}

/* route(): *partition_out gets a new reference (the partition, or None). 0, or -1 on error. */
static int route(Router *self, PyObject *topic, PyObject *key, PyObject *partition,
                 PyObject *n_obj, PyObject **partition_out, Py_ssize_t *connection_out) {
    if (partition == Py_None && n_obj != Py_None) {
        if (key != Py_None) {
            partition = key_partition(self, key, n_obj);
        } else {
            PyObject *call_args[2] = {topic, n_obj};
            partition = PyObject_Vectorcall(self->keyless_partition, call_args, 2, NULL);
        }
        if (partition == NULL) return -1;
    } else {
        Py_INCREF(partition);
    }
    Py_ssize_t connection = 0;
    if (self->connections > 1) {
        if (partition != Py_None) {
            connection = connection_of(self, partition);
        } else if (key != Py_None) {
            PyObject *count = PyLong_FromSsize_t(self->connections);
            PyObject *call_args[2] = {key, count};
            PyObject *chosen =
                count == NULL ? NULL : PyObject_Vectorcall(self->partitioner, call_args, 2, NULL);
            Py_XDECREF(count);
            connection = chosen == NULL ? -1 : connection_of(self, chosen);
            Py_XDECREF(chosen);
        } else {
            connection = self->round_robin = (self->round_robin + 1) % self->connections;
        }
        if (connection < 0) {
            Py_DECREF(partition);
            return -1;
        }
    }
    *partition_out = partition;
    *connection_out = connection;
    return 0;
}

static PyObject *Router_route(Router *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "route(topic, key, partition, num_partitions) takes 4 arguments");
        return NULL;
    }
    PyObject *partition;
    Py_ssize_t connection;
    if (route(self, args[0], args[1], args[2], args[3], &partition, &connection) < 0) return NULL;
    return Py_BuildValue("(Nn)", partition, connection);
}

static PyMethodDef Router_methods[] = {
    {"route", (PyCFunction)(void (*)(void))Router_route, METH_FASTCALL,
     "route(topic, key, partition, num_partitions) -> (partition, connection)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RouterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.Router",
    .tp_basicsize = sizeof(Router),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Router_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Router_init,
    .tp_dealloc = (destructor)Router_dealloc,
    .tp_traverse = (traverseproc)Router_traverse,
    .tp_clear = (inquiry)Router_clear,
    .tp_methods = Router_methods,
};

/* ------------------------------------------------------------------------------ admitting */

/* Record: the C twin of producerkit._record.Record, a tuple subclass whose fields are also
 * read by name (a member per position: T_OBJECT_EX, which CPython's specializing interpreter
 * turns into a direct load, where T_OBJECT takes the generic attribute lookup), allocated
 * from a free list of its own: a record is built and dropped per message, and a named tuple
 * class defined in Python costs every message the generic allocation and deallocation of a
 * heap type. The free list holds a produce_batch chunk's worth (at most ~2 MB kept after a
 * burst): records allocated past it count toward the collector's young generation, and a
 * chunk of them triggered collections in the middle of admitting it. */

#define RECORD_FREE_LIST 16384
static PyObject *record_free_list[RECORD_FREE_LIST];
static int record_free_count;

#define ITEM_OFFSET(i) (offsetof(PyTupleObject, ob_item) + (i) * sizeof(PyObject *))

static PyMemberDef Record_members[] = {
    {"seq", T_OBJECT_EX, ITEM_OFFSET(R_SEQ), READONLY, "its number: the n-th record admitted has n"},
    {"value", T_OBJECT_EX, ITEM_OFFSET(R_VALUE), READONLY, "bytes, or None for a tombstone"},
    {"key", T_OBJECT_EX, ITEM_OFFSET(R_KEY), READONLY, "bytes or None"},
    {"topic", T_OBJECT_EX, ITEM_OFFSET(R_TOPIC), READONLY, "str"},
    {"partition", T_OBJECT_EX, ITEM_OFFSET(R_PARTITION), READONLY, "where it was routed, or None"},
    {"headers", T_OBJECT_EX, ITEM_OFFSET(R_HEADERS), READONLY, "(name, value) pairs, or None"},
    {"msg_id", T_OBJECT_EX, ITEM_OFFSET(R_MSG_ID), READONLY, "str or None"},
    {"deadline", T_OBJECT_EX, ITEM_OFFSET(R_DEADLINE), READONLY, "time.monotonic() to be acked by"},
    {"connection", T_OBJECT_EX, ITEM_OFFSET(R_CONNECTION), READONLY, "the connection's index"},
    {"slot", T_OBJECT_EX, ITEM_OFFSET(R_FUTURE), READONLY, "what tells its outcome, or None"},
    {"timestamp", T_OBJECT_EX, ITEM_OFFSET(R_TIMESTAMP), READONLY, "CreateTime in ms, or None"},
    {"context", T_OBJECT_EX, ITEM_OFFSET(R_CONTEXT), READONLY, "what on_delivery is told with it"},
    {NULL},
};

static void Record_dealloc(PyObject *record) {
    if (PyObject_GC_IsTracked(record)) PyObject_GC_UnTrack(record);
    PyObject **items = ((PyTupleObject *)record)->ob_item;
    Py_ssize_t size = Py_SIZE(record);
    for (Py_ssize_t i = 0; i < size; i++) Py_CLEAR(items[i]);
    if (size == R_FIELDS && record_free_count < RECORD_FREE_LIST)
        record_free_list[record_free_count++] = record;
    else
        PyObject_GC_Del(record);
}

static int Record_traverse(PyObject *record, visitproc visit, void *arg) {
    PyObject **items = ((PyTupleObject *)record)->ob_item;
    for (Py_ssize_t i = Py_SIZE(record); --i >= 0;) Py_VISIT(items[i]);
    return 0;
}

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.Record",
    .tp_basicsize = sizeof(PyTupleObject) - sizeof(PyObject *),
    .tp_itemsize = sizeof(PyObject *),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A message in flight: the C twin of producerkit._record.Record.",
    .tp_base = &PyTuple_Type,
    .tp_dealloc = Record_dealloc,
    .tp_traverse = Record_traverse,
    .tp_members = Record_members,
};

/* A new record with every item NULL (the caller sets them all, then may track it). */
static PyObject *new_record(void) {
    PyObject *record;
    if (record_free_count > 0) {
        record = record_free_list[--record_free_count];
        PyObject_InitVar((PyVarObject *)record, &RecordType, R_FIELDS);
    } else {
        record = (PyObject *)PyObject_GC_NewVar(PyTupleObject, &RecordType, R_FIELDS);
        if (record == NULL) return NULL;
        for (Py_ssize_t i = 0; i < R_FIELDS; i++) PyTuple_SET_ITEM(record, i, NULL);
    }
    return record;
}

PyDoc_STRVAR(WindowCore_doc,
"WindowCore(limit, timeout, watch, untrack=False)\n\n"
"The C implementation of producerkit._core_py.WindowCore: the ledger every message reads\n"
"(pending, limit, peak_in_flight, timeout, handed, taken, watching), full() and admit().");

typedef struct {
    PyObject_HEAD
    PyObject *pending; /* the ledger (a Ledger): seq -> record */
    long long last_seq; /* record[SEQ] of the last record admitted (the first has 1) */
    PyObject *watch;   /* watch(record): the first record into an empty window */
    Py_ssize_t limit, peak_in_flight, handed, taken;
    double timeout;
    int untrack;
    char watching; /* the window's deadline timer is armed: no watch() until it is disarmed */
} WindowCore;

/* The in-flight bound: whether the window holds limit messages, those admitted and not
 * settled and those handed over by other threads and not yet admitted. Every admission asks
 * it (WindowCore.full in Python). */
static inline int window_full(WindowCore *window) {
    return ledger_len((Ledger *)window->pending) + window->handed - window->taken >= window->limit;
}

static int WindowCore_traverse(WindowCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->pending);
    Py_VISIT(self->watch);
    return 0;
}

static int WindowCore_clear(WindowCore *self) {
    Py_CLEAR(self->pending);
    Py_CLEAR(self->watch);
    return 0;
}

static void WindowCore_dealloc(WindowCore *self) {
    PyObject_GC_UnTrack(self);
    WindowCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int WindowCore_init(WindowCore *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t limit;
    double timeout;
    PyObject *watch;
    int untrack = 0;
    static char *names[] = {"limit", "timeout", "watch", "untrack", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ndO|p:WindowCore", names, &limit, &timeout,
                                     &watch, &untrack))
        return -1;
    PyObject *pending = PyObject_CallNoArgs((PyObject *)&LedgerType);
    if (pending == NULL) return -1;
    WindowCore_clear(self);
    self->pending = pending;
    self->last_seq = 0;
    self->watch = Py_NewRef(watch);
    self->limit = limit;
    self->peak_in_flight = 0;
    self->handed = self->taken = 0;
    self->timeout = timeout;
    self->untrack = untrack;
    self->watching = 0;
    return 0;
}

/* time.monotonic(), exactly. */
static double monotonic(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t now;
    if (PyTime_MonotonicRaw(&now) < 0) return 0.0; /* cannot fail on the platforms we run on */
    return PyTime_AsSecondsDouble(now);
#else
    return _PyTime_AsSecondsDouble(_PyTime_GetMonotonicClock());
#endif
}

/* The message fields admit() reads, in a Message's order (see producerkit._record). */
#define M_VALUE 0
#define M_KEY 1
#define M_TOPIC 2
#define M_PARTITION 3
#define M_HEADERS 4
#define M_MSG_ID 5
#define M_TIMESTAMP 6
#define M_FIELDS 7

/* The record of one message admitted into the window (new reference), or Py_None (new
 * reference) if the window is full; NULL with an exception set. fields: a message's, in Message
 * order; partition replaces its partition. ``deadline``: monotonic() + timeout as a float (a
 * chunk's records share one, taken as the chunk is admitted), or NULL to take the clock here.
 * ``reserved``: a message handed over by another thread, whose room its reservation holds
 * (see WindowCore_doc): no room is asked, and the reservation passes to the record as the
 * record goes into pending, with nothing between (in flight never looks one lower). */
static PyObject *admit(WindowCore *self, PyObject *const *fields, PyObject *partition,
                       Py_ssize_t connection, PyObject *slot, PyObject *context, int untrack,
                       PyObject *deadline, int reserved) {
    if (!reserved && window_full(self)) return Py_NewRef(Py_None);
    Py_ssize_t in_flight = ledger_len((Ledger *)self->pending);
    PyObject *seq = PyLong_FromLongLong(self->last_seq + 1);
    deadline = deadline == NULL ? PyFloat_FromDouble(monotonic() + self->timeout)
                                : Py_NewRef(deadline);
    PyObject *index = PyLong_FromSsize_t(connection);
    PyObject *record = new_record();
    if (seq == NULL || deadline == NULL || index == NULL || record == NULL) {
        Py_XDECREF(seq);
        Py_XDECREF(deadline);
        Py_XDECREF(index);
        Py_XDECREF(record);
        return NULL;
    }
    self->last_seq++;
    PyTuple_SET_ITEM(record, R_SEQ, seq); /* the tuple owns every new reference from here on */
    PyTuple_SET_ITEM(record, R_VALUE, Py_NewRef(fields[M_VALUE]));
    PyTuple_SET_ITEM(record, R_KEY, Py_NewRef(fields[M_KEY]));
    PyTuple_SET_ITEM(record, R_TOPIC, Py_NewRef(fields[M_TOPIC]));
    PyTuple_SET_ITEM(record, R_PARTITION, Py_NewRef(partition));
    PyTuple_SET_ITEM(record, R_HEADERS, Py_NewRef(fields[M_HEADERS]));
    PyTuple_SET_ITEM(record, R_MSG_ID, Py_NewRef(fields[M_MSG_ID]));
    PyTuple_SET_ITEM(record, R_DEADLINE, deadline);
    PyTuple_SET_ITEM(record, R_CONNECTION, index);
    PyTuple_SET_ITEM(record, R_FUTURE, Py_NewRef(slot));
    PyTuple_SET_ITEM(record, R_TIMESTAMP, Py_NewRef(fields[M_TIMESTAMP]));
    PyTuple_SET_ITEM(record, R_CONTEXT, Py_NewRef(context));
    /* Tracked unless untrack and no field can hold a reference (as CPython decides when it
     * first scans such a tuple): the other fields are bytes, str, int, float or None by
     * construction. */
    if (!untrack || (fields[M_HEADERS] != Py_None && PyObject_IS_GC(fields[M_HEADERS])) ||
        (slot != Py_None && PyObject_IS_GC(slot)) ||
        (context != Py_None && PyObject_IS_GC(context)))
        PyObject_GC_Track(record);

    /* From here on the message is counted: it must end acked or failed. */
    if (ledger_put((Ledger *)self->pending, self->last_seq, record) < 0) {
        Py_DECREF(record);
        return NULL;
    }
    self->taken += reserved;
    if (in_flight >= self->peak_in_flight) self->peak_in_flight = in_flight + 1;
    if (in_flight == 0 && !self->watching) {
        PyObject *watched = PyObject_CallOneArg(self->watch, record);
        if (watched == NULL) {
            Py_DECREF(record);
            return NULL;
        }
        Py_DECREF(watched);
    }
    return record;
}

static PyObject *WindowCore_admit(WindowCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 6 || !PyTuple_Check(args[0]) ||
        PyTuple_GET_SIZE(args[0]) != M_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "admit(message: Message, partition, connection, slot, "
                                         "context=None, reserved=False) -> Record | None");
        return NULL;
    }
    Py_ssize_t connection = PyLong_AsSsize_t(args[2]);
    if (connection == -1 && PyErr_Occurred()) return NULL;
    int reserved = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (reserved < 0) return NULL;
    return admit(self, &PyTuple_GET_ITEM(args[0], 0), args[1], connection, args[3],
                 nargs >= 5 ? args[4] : Py_None, self->untrack, NULL, reserved);
}

static PyObject *WindowCore_full(WindowCore *self, PyObject *unused) {
    return PyBool_FromLong(window_full(self));
}

static PyMethodDef WindowCore_methods[] = {
    {"full", (PyCFunction)WindowCore_full, METH_NOARGS,
     "full() -> whether the window holds limit messages (the in-flight bound)"},
    {"admit", (PyCFunction)(void (*)(void))WindowCore_admit, METH_FASTCALL,
     "admit(message, partition, connection, slot, context=None, reserved=False) -> Record, or "
     "None if the window is full (reserved: a handed-over message, in its reserved room)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef WindowCore_members[] = {
    {"pending", T_OBJECT_EX, offsetof(WindowCore, pending), READONLY, "seq -> record in flight"},
    {"limit", T_PYSSIZET, offsetof(WindowCore, limit), 0, "most messages in flight"},
    {"peak_in_flight", T_PYSSIZET, offsetof(WindowCore, peak_in_flight), 0,
     "peak of messages in flight"},
    {"handed", T_PYSSIZET, offsetof(WindowCore, handed), 0,
     "messages handed over by other threads (counted in flight until taken)"},
    {"taken", T_PYSSIZET, offsetof(WindowCore, taken), 0,
     "handed-over messages admitted (admit counts them, reserved=True)"},
    {"timeout", T_DOUBLE, offsetof(WindowCore, timeout), READONLY, "seconds to each deadline"},
    {"watching", T_BOOL, offsetof(WindowCore, watching), 0,
     "the window's deadline timer is armed (set by the window): admit calls watch only when not"},
    {NULL},
};

static PyTypeObject WindowCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.WindowCore",
    .tp_basicsize = sizeof(WindowCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = WindowCore_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WindowCore_init,
    .tp_dealloc = (destructor)WindowCore_dealloc,
    .tp_traverse = (traverseproc)WindowCore_traverse,
    .tp_clear = (inquiry)WindowCore_clear,
    .tp_methods = WindowCore_methods,
    .tp_members = WindowCore_members,
};

/* ------------------------------------------------------------------------------ produce */

PyDoc_STRVAR(Admission_doc,
"Admission(router, window, sends, send_failed, hand_off, topics, default_topic, max_payload,\n"
"          *, takes_context=False, stamps=False, value_serializer=None, trace_headers=None)\n\n"
"The C implementation of producerkit._core_py.Admission: a plain message (admit) or chunk\n"
"(admit_chunk) checked, routed, admitted and sent in one call; everything else DECLINED\n"
"(NotImplemented) for the checked path. Its docstrings there are the contract.");

typedef struct {
    PyObject_HEAD
    Router *router;
    WindowCore *window;
    PyObject *sends;         /* tuple: each connection's send(record) */
    PyObject *send_failed;   /* send_failed(record, exc) */
    PyObject *hand_off;      /* hand_off(record, awaitable) -> awaitable */
    PyObject *topics;        /* dict: validated topic -> partition count (None: unpartitioned) */
    PyObject *default_topic; /* str or None */
    Py_ssize_t max_payload;
    int takes_context;          /* the producer has on_delivery: a message may carry a context */
    int stamps;                 /* fix each record's CreateTime (epoch ms) as it is admitted */
    PyObject *value_serializer; /* value_serializer(value) -> bytes, or NULL */
    PyObject *trace_headers;    /* trace_headers() -> header pairs or None, or NULL */
} Admission;

static PyObject *DECLINED;

static int Admission_traverse(Admission *self, visitproc visit, void *arg) {
    Py_VISIT(self->router);
    Py_VISIT(self->window);
    Py_VISIT(self->sends);
    Py_VISIT(self->send_failed);
    Py_VISIT(self->hand_off);
    Py_VISIT(self->topics);
    Py_VISIT(self->default_topic);
    Py_VISIT(self->value_serializer);
    Py_VISIT(self->trace_headers);
    return 0;
}

static int Admission_clear(Admission *self) {
    Py_CLEAR(self->router);
    Py_CLEAR(self->window);
    Py_CLEAR(self->sends);
    Py_CLEAR(self->send_failed);
    Py_CLEAR(self->hand_off);
    Py_CLEAR(self->topics);
    Py_CLEAR(self->default_topic);
    Py_CLEAR(self->value_serializer);
    Py_CLEAR(self->trace_headers);
    return 0;
}

static void Admission_dealloc(Admission *self) {
    PyObject_GC_UnTrack(self);
    Admission_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Admission_init(Admission *self, PyObject *args, PyObject *kwargs) {
    PyObject *router, *window, *sends, *send_failed, *hand_off, *topics, *default_topic;
    Py_ssize_t max_payload;
    int takes_context = 0, stamps = 0;
    PyObject *value_serializer = Py_None, *trace_headers = Py_None;
    static char *names[] = {"router",        "window",        "sends",         "send_failed",
                            "hand_off",      "topics",        "default_topic", "max_payload",
                            "takes_context", "stamps",        "value_serializer",
                            "trace_headers", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!OOO!On|$ppOO:Admission", names,
                                     &RouterType, &router, &WindowCoreType, &window, &PyTuple_Type,
                                     &sends, &send_failed, &hand_off, &PyDict_Type, &topics,
                                     &default_topic, &max_payload, &takes_context, &stamps,
                                     &value_serializer, &trace_headers))
        return -1;
    if (PyTuple_GET_SIZE(sends) != ((Router *)router)->connections) {
        PyErr_SetString(PyExc_ValueError, "Admission: one send per connection");
        return -1;
    }
    Admission_clear(self);
    self->router = (Router *)Py_NewRef(router);
    self->window = (WindowCore *)Py_NewRef(window);
    self->sends = Py_NewRef(sends);
    self->send_failed = Py_NewRef(send_failed);
    self->hand_off = Py_NewRef(hand_off);
    self->topics = Py_NewRef(topics);
    self->default_topic = Py_NewRef(default_topic);
    self->max_payload = max_payload;
    self->takes_context = takes_context;
    self->stamps = stamps;
    self->value_serializer = value_serializer == Py_None ? NULL : Py_NewRef(value_serializer);
    self->trace_headers = trace_headers == Py_None ? NULL : Py_NewRef(trace_headers);
    return 0;
}

static PyObject *Admission_admit(Admission *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "admit(value, key, topic, partition, headers, msg_id, "
                                         "context, expect, timestamp, reserved=False) takes 9 "
                                         "or 10 arguments");
        return NULL;
    }
    int reserved = nargs == 10 ? PyObject_IsTrue(args[9]) : 0;
    if (reserved < 0) return NULL;
    PyObject *key = args[1], *topic = args[2], *context = args[6];
    for (int i = 3; i < 9; i++)
        if (args[i] != Py_None && !(i == 6 && self->takes_context)) return Py_NewRef(DECLINED);
    if (key != Py_None && !PyBytes_CheckExact(key)) return Py_NewRef(DECLINED);
    if (topic == Py_None) topic = self->default_topic;
    if (!PyUnicode_CheckExact(topic)) return Py_NewRef(DECLINED);
    PyObject *n_obj = PyDict_GetItemWithError(self->topics, topic); /* borrowed */
    if (n_obj == NULL) {
        if (PyErr_Occurred()) return NULL;
        return Py_NewRef(DECLINED); /* first message to it: the Python path learns its count */
    }
    WindowCore *window = self->window;
    if (!reserved && window_full(window)) return Py_NewRef(DECLINED);
    /* Owned from here: the value (serialized), the headers (the trace context's), the stamp. */
    PyObject *value = Py_NewRef(args[0]), *headers = Py_NewRef(Py_None), *stamp = Py_None;
    PyObject *outcome = Py_NewRef(DECLINED), *record = NULL;
    Py_INCREF(stamp);
    if (self->value_serializer != NULL && value != Py_None) {
        /* One that raises declines: the Python path calls it again and reports what it raised. */
        Py_SETREF(value, PyObject_CallOneArg(self->value_serializer, value));
        if (value == NULL) goto decline;
    }
    if (!PyBytes_CheckExact(value)) goto done;
    Py_ssize_t size = PyBytes_GET_SIZE(value) + (key == Py_None ? 0 : PyBytes_GET_SIZE(key));
    if (self->trace_headers != NULL) {
        Py_SETREF(headers, PyObject_CallNoArgs(self->trace_headers));
        if (headers == NULL) goto decline;
        if (headers != Py_None) {
            if (!PyTuple_CheckExact(headers)) goto done;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(headers); i++) {
                PyObject *pair = PyTuple_GET_ITEM(headers, i);
                if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                    !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0)) ||
                    !PyBytes_CheckExact(PyTuple_GET_ITEM(pair, 1)))
                    goto done;
                size += PyUnicode_GET_LENGTH(PyTuple_GET_ITEM(pair, 0)) +
                        PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1));
            }
        }
    }
    if (size > self->max_payload) goto done;
    if (self->stamps) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        Py_SETREF(stamp, PyLong_FromLongLong((long long)now.tv_sec * 1000 + now.tv_nsec / 1000000));
        if (stamp == NULL) goto error;
    }
    PyObject *partition;
    Py_ssize_t connection;
    if (route(self->router, topic, key, Py_None, n_obj, &partition, &connection) < 0) goto error;
    PyObject *fields[M_FIELDS] = {value, key, topic, Py_None, headers, Py_None, stamp};
    record = admit(window, fields, partition, connection, Py_None, context, window->untrack,
                   NULL, reserved);
    Py_DECREF(partition);
    if (record == NULL) goto error;
    if (record == Py_None) goto done; /* a serializer's call filled the window: DECLINED */
    Py_CLEAR(outcome);
    PyObject *handed_off =
        PyObject_Vectorcall(PyTuple_GET_ITEM(self->sends, connection), &record, 1, NULL);
    if (handed_off == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) { /* CancelledError and kin propagate */
            PyObject *exc = raised_exception();
            outcome = PyObject_CallFunctionObjArgs(self->send_failed, record, exc, NULL);
            Py_DECREF(exc);
            if (outcome != NULL) Py_SETREF(outcome, Py_NewRef(Py_None));
        }
    } else if (handed_off == Py_None) {
        outcome = handed_off;
    } else {
        PyObject *call[2] = {record, handed_off};
        outcome = PyObject_Vectorcall(self->hand_off, call, 2, NULL);
        Py_DECREF(handed_off);
    }
    goto done;
decline:
    if (!PyErr_ExceptionMatches(PyExc_Exception)) goto error; /* KeyboardInterrupt and kin */
    PyErr_Clear();
    goto done;
error:
    Py_CLEAR(outcome);
done:
    Py_XDECREF(record);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    Py_XDECREF(stamp);
    return outcome;
}

/* Whether a chunk's item is a plain message: bytes or (a tombstone) None value, bytes or None
 * key, within max_payload. */
static int plain_item(Admission *self, PyObject *value, PyObject *key, int tombstones) {
    if (key != Py_None && !PyBytes_CheckExact(key)) return 0;
    Py_ssize_t size = key == Py_None ? 0 : PyBytes_GET_SIZE(key);
    if (value == Py_None) {
        if (!tombstones || key == Py_None) return 0;
    } else if (PyBytes_CheckExact(value)) {
        size += PyBytes_GET_SIZE(value);
    } else {
        return 0;
    }
    return size <= self->max_payload;
}

static PyObject *Admission_admit_chunk(Admission *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_CheckExact(args[0]) ||
        (args[1] != Py_None && !PyList_CheckExact(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "admit_chunk(values: list, keys: list | None, topic, "
                                         "start, stop, tombstones)");
        return NULL;
    }
    PyObject *values = args[0], *keys = args[1], *topic = args[2];
    Py_ssize_t size = PyList_GET_SIZE(values);
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    Py_ssize_t count = PyLong_AsSsize_t(args[4]); /* stop: admit up to this index */
    int tombstones = PyObject_IsTrue(args[5]);
    if ((start == -1 || count == -1 || tombstones < 0) && PyErr_Occurred()) return NULL;
    if (keys != Py_None && PyList_GET_SIZE(keys) != size) return Py_NewRef(DECLINED);
    if (topic == Py_None) topic = self->default_topic;
    if (!PyUnicode_CheckExact(topic) || start < 0 || start > count || count > size)
        return Py_NewRef(DECLINED);
    PyObject *n_obj = PyDict_GetItemWithError(self->topics, topic); /* borrowed */
    if (n_obj == NULL) {
        if (PyErr_Occurred()) return NULL;
        return Py_NewRef(DECLINED);
    }
    /* The whole chunk is plain, or none of it is taken: checked by its first call (start 0).
     * A later call checks each message again as it takes it (the lists may have changed
     * meanwhile), and stops at one that is not plain (see the end). */
    int checked = start == 0;
    if (checked) {
        for (Py_ssize_t i = 0; i < size; i++) {
            PyObject *key = keys == Py_None ? Py_None : PyList_GET_ITEM(keys, i);
            if (!plain_item(self, PyList_GET_ITEM(values, i), key, tombstones))
                return Py_NewRef(DECLINED);
        }
    }
    int declined = 0;
    Router *router = self->router;
    Py_ssize_t connections = router->connections, i = start;
    PyObject *deadline = NULL; /* one for the chunk: its records are admitted in one moment */
    PyObject *stamp = NULL; /* likewise their CreateTime, where it is fixed (else None) */
    PyObject *only_records = NULL; /* the one connection's list, if only one */
    Py_ssize_t admitted = 0;       /* records in it */
    PyObject *by_connection = PyList_New(connections);
    if (by_connection == NULL) return NULL;
    /* One connection: its list made as long as the rest of the chunk, cut to what is admitted. */
    for (Py_ssize_t c = 0; c < connections; c++) {
        PyObject *records = PyList_New(connections == 1 ? count - start : 0);
        if (records == NULL) goto error;
        PyList_SET_ITEM(by_connection, c, records);
    }
    if (connections == 1) only_records = PyList_GET_ITEM(by_connection, 0);
    /* Bytes keys hashed by the native hash onto one connection: route()'s result, computed
     * here without its per-message dispatch and conversions. */
    Py_ssize_t partitions = 0;
    if (router->native_hash != NULL && connections == 1 && PyLong_CheckExact(n_obj)) {
        partitions = PyLong_AsSsize_t(n_obj);
        if (partitions < 1) {
            PyErr_Clear();
            partitions = 0; /* route() raises what it raises for such a count */
        }
    }
    WindowCore *window = self->window;
    deadline = PyFloat_FromDouble(monotonic() + window->timeout);
    if (deadline == NULL) goto error;
    if (self->stamps) { /* admit's CreateTime, for on_delivery: one for the chunk too */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        stamp = PyLong_FromLongLong((long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
        if (stamp == NULL) goto error;
    }
    for (; i < count; i++) {
        /* A partitioner in Python runs in this loop: the lists may have shrunk since. */
        if (i >= PyList_GET_SIZE(values) || (keys != Py_None && i >= PyList_GET_SIZE(keys))) {
            declined = 1;
            break;
        }
        PyObject *key = keys == Py_None ? Py_None : PyList_GET_ITEM(keys, i);
        if (window_full(window)) break; /* full: the caller waits for room and goes on */
        if (!checked && !plain_item(self, PyList_GET_ITEM(values, i), key, tombstones)) {
            declined = 1;
            break;
        }
        PyObject *partition;
        Py_ssize_t connection = 0;
        if (partitions > 0 && key != Py_None) {
            partition = native_partition(router, key, partitions);
            if (partition == NULL) goto error;
        } else if (route(router, topic, key, Py_None, n_obj, &partition, &connection) < 0) {
            goto error;
        }
        PyObject *fields[M_FIELDS] = {PyList_GET_ITEM(values, i), key,    topic, Py_None,
                                      Py_None,                   Py_None,
                                      stamp == NULL ? Py_None : stamp};
        /* A chunk's records all live until the chunk is settled: untracked on every backend
         * (a window of tracked tuples makes the collector's work grow with the window). */
        PyObject *record =
            admit(window, fields, partition, connection, Py_None, Py_None, 1, deadline, 0);
        Py_DECREF(partition);
        if (record == NULL) goto error;
        if (only_records != NULL) {
            PyList_SET_ITEM(only_records, admitted++, record);
        } else {
            int appended = PyList_Append(PyList_GET_ITEM(by_connection, connection), record);
            Py_DECREF(record);
            if (appended < 0) goto error;
        }
    }
    if (only_records != NULL) Py_SET_SIZE(only_records, admitted);
    Py_DECREF(deadline);
    Py_XDECREF(stamp);
    if (declined && i == start) {
        Py_DECREF(by_connection);
        return Py_NewRef(DECLINED);
    }
    /* Stopped at a message that is not plain: what was admitted, then DECLINED for the rest. */
    if (declined) return Py_BuildValue("(nNO)", i, by_connection, DECLINED);
    return Py_BuildValue("(nN)", i, by_connection);
error:
    Py_XDECREF(deadline);
    Py_XDECREF(stamp);
    if (only_records != NULL) Py_SET_SIZE(only_records, admitted);
    /* Records admitted before the error are in flight: hand them back with it, so that the
     * caller sends them and they are not lost from the ledger; the error is the i-th's. */
    if (i > start) return Py_BuildValue("(nNN)", i, by_connection, raised_exception());
    Py_DECREF(by_connection);
    return NULL;
}

static PyMethodDef Admission_methods[] = {
    {"admit_chunk", (PyCFunction)(void (*)(void))Admission_admit_chunk, METH_FASTCALL,
     "admit_chunk(values, keys, topic, start, stop, tombstones) -> (end, records by "
     "connection) | (end, records by connection, error or DECLINED) | DECLINED"},
    {"admit", (PyCFunction)(void (*)(void))Admission_admit, METH_FASTCALL,
     "admit(value, key, topic, partition, headers, msg_id, context, expect, timestamp) -> None | "
     "awaitable | DECLINED"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AdmissionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.Admission",
    .tp_basicsize = sizeof(Admission),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Admission_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Admission_init,
    .tp_dealloc = (destructor)Admission_dealloc,
    .tp_traverse = (traverseproc)Admission_traverse,
    .tp_clear = (inquiry)Admission_clear,
    .tp_methods = Admission_methods,
};

/* ------------------------------------------------------------------------- produce's door */

PyDoc_STRVAR(Done_doc,
"An awaitable that has already finished: awaiting it returns None, or raises the exception it\n"
"holds (once). A coroutine to asyncio and anyio (send, throw, close, __await__), so a task can\n"
"be made of it. What ProduceDoor returns for a message it took.");

typedef struct {
    PyObject_HEAD
    PyObject *error; /* raised by the first send/next, then cleared; NULL: returns None */
} Done;

static PyObject *DONE; /* the shared one that returns None */

static void Done_dealloc(Done *self) {
    Py_CLEAR(self->error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Done_next(Done *self) {
    if (self->error != NULL) {
        PyObject *error = self->error;
        self->error = NULL;
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        Py_DECREF(error);
    }
    return NULL; /* no exception set: StopIteration, with None */
}

static PyObject *Done_send(Done *self, PyObject *arg) {
    PyObject *result = Done_next(self);
    if (result == NULL && !PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
    return result;
}

static PyObject *Done_throw(Done *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw(type[, value[, traceback]])");
        return NULL;
    }
    Py_CLEAR(self->error);
    PyObject *what = args[0];
    if (PyExceptionInstance_Check(what))
        PyErr_SetObject((PyObject *)Py_TYPE(what), what);
    else if (PyExceptionClass_Check(what))
        PyErr_SetObject(what, nargs > 1 ? args[1] : NULL);
    else
        PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
    return NULL;
}

static PyObject *Done_close(Done *self, PyObject *unused) {
    Py_CLEAR(self->error);
    Py_RETURN_NONE;
}

static PyObject *Done_self(PyObject *self) { return Py_NewRef(self); }

static PyMethodDef Done_methods[] = {
    {"send", (PyCFunction)Done_send, METH_O, "send(value): raises StopIteration (or the error)"},
    {"throw", (PyCFunction)(void (*)(void))Done_throw, METH_FASTCALL, "throw(exc): raises exc"},
    {"close", (PyCFunction)Done_close, METH_NOARGS, "close(): nothing left to run"},
    {NULL, NULL, 0, NULL},
};

static PyAsyncMethods Done_async = {.am_await = (unaryfunc)Done_self};

static PyTypeObject DoneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.Done",
    .tp_basicsize = sizeof(Done),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Done_doc,
    .tp_dealloc = (destructor)Done_dealloc,
    .tp_as_async = &Done_async,
    .tp_iter = Done_self,
    .tp_iternext = (iternextfunc)Done_next,
    .tp_methods = Done_methods,
};

PyDoc_STRVAR(ProducerCore_doc,
"The C implementation of producerkit._core_py.ProducerCore: the base of Producer, whose\n"
"_admission (the running producer's Admission, else None) is a field ProduceDoor reads.");

typedef struct {
    PyObject_HEAD
    PyObject *admission; /* an Admission while the producer runs, else NULL or None */
} ProducerCore;

static int ProducerCore_traverse(ProducerCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->admission);
    return 0;
}

static int ProducerCore_clear(ProducerCore *self) {
    Py_CLEAR(self->admission);
    return 0;
}

static void ProducerCore_dealloc(ProducerCore *self) {
    PyObject_GC_UnTrack(self);
    ProducerCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef ProducerCore_members[] = {
    {"_admission", T_OBJECT, offsetof(ProducerCore, admission), 0,
     "the running producer's Admission, else None"},
    {NULL},
};

static PyTypeObject ProducerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.ProducerCore",
    .tp_basicsize = sizeof(ProducerCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = ProducerCore_doc,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)ProducerCore_dealloc,
    .tp_traverse = (traverseproc)ProducerCore_traverse,
    .tp_clear = (inquiry)ProducerCore_clear,
    .tp_members = ProducerCore_members,
};

PyDoc_STRVAR(ProduceDoor_doc,
"ProduceDoor(produce)\n\n"
"The C implementation of producerkit._core_py.ProduceDoor: Producer.produce as the class holds\n"
"it, a method descriptor. A call with one positional value, produce's keywords and\n"
"nonblocking true, on a producer whose _admission is an Admission, goes to admit() as\n"
"produce()'s first lines send it, without a Python frame: a message taken returns an\n"
"awaitable already finished (Done, raising what admit raised, if it raised) or the hand-off\n"
"to await. Every other call, and every message DECLINED, is produce(producer, *args,\n"
"**kwargs): the method itself. Instances have a __dict__, for functools.update_wrapper.");

typedef struct {
    PyObject_HEAD
    PyObject *function; /* Producer.produce's own function */
    PyObject *dict;     /* __wrapped__, __name__, __doc__, ... */
    vectorcallfunc vectorcall;
} ProduceDoor;

/* produce's keywords, interned, in admit's order of arguments (1..8), then nonblocking. */
static PyObject *door_keywords[9];
static const char *door_keyword_names[9] = {"key",     "topic",   "partition", "headers",
                                            "msg_id",  "context", "expect",    "timestamp",
                                            "nonblocking"};

static int ProduceDoor_traverse(ProduceDoor *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->dict);
    return 0;
}

static int ProduceDoor_clear(ProduceDoor *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->dict);
    return 0;
}

static void ProduceDoor_dealloc(ProduceDoor *self) {
    PyObject_GC_UnTrack(self);
    ProduceDoor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Admission_admit(Admission *self, PyObject *const *args, Py_ssize_t nargs);

/* args[0] is the producer (the door is a method descriptor), args[1] the value. */
static PyObject *ProduceDoor_vectorcall(ProduceDoor *self, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *fields[9] = {NULL, Py_None, Py_None, Py_None, Py_None,
                           Py_None, Py_None, Py_None, Py_None};
    int nonblocking = 0;
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &ProducerCoreType)) goto produce;
    PyObject *admission = ((ProducerCore *)args[0])->admission;
    if (admission == NULL || !Py_IS_TYPE(admission, &AdmissionType)) goto produce;
    fields[0] = args[1];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int found = -1;
        for (int k = 0; k < 9 && found < 0; k++)
            if (name == door_keywords[k]) found = k;
        for (int k = 0; k < 9 && found < 0; k++)
            if (PyUnicode_Check(name) &&
                PyUnicode_CompareWithASCIIString(name, door_keyword_names[k]) == 0)
                found = k;
        if (found < 0) goto produce; /* the method says what is wrong with it */
        if (found == 8) {
            nonblocking = PyObject_IsTrue(args[nargs + i]);
            if (nonblocking < 0) return NULL;
        } else {
            fields[found + 1] = args[nargs + i];
        }
    }
    if (!nonblocking) goto produce;
    Py_INCREF(admission); /* admit may run Python code (a serializer) that stops the producer */
    PyObject *outcome = Admission_admit((Admission *)admission, fields, 9);
    Py_DECREF(admission);
    if (outcome == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* KeyboardInterrupt, ... */
        PyObject *error = raised_exception();
        Done *failed = PyObject_New(Done, &DoneType);
        if (failed != NULL)
            failed->error = error;
        else
            Py_DECREF(error);
        return (PyObject *)failed;
    }
    if (outcome == Py_None) {
        Py_DECREF(outcome);
        return Py_NewRef(DONE);
    }
    if (outcome != DECLINED) return outcome; /* the hand-off, to await as produce() awaits it */
    Py_DECREF(outcome);
produce:
    return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

static PyObject *ProduceDoor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function;
    if (!PyArg_ParseTuple(args, "O:ProduceDoor", &function)) return NULL;
    ProduceDoor *self = (ProduceDoor *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->function = Py_NewRef(function);
    self->vectorcall = (vectorcallfunc)ProduceDoor_vectorcall;
    return (PyObject *)self;
}

/* producer.produce: the door bound to the producer, as a method. */
static PyObject *ProduceDoor_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyGetSetDef ProduceDoor_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ProduceDoorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit._speedups.ProduceDoor",
    .tp_basicsize = sizeof(ProduceDoor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = ProduceDoor_doc,
    .tp_new = ProduceDoor_new,
    .tp_dealloc = (destructor)ProduceDoor_dealloc,
    .tp_traverse = (traverseproc)ProduceDoor_traverse,
    .tp_clear = (inquiry)ProduceDoor_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ProduceDoor, vectorcall),
    .tp_descr_get = ProduceDoor_get,
    .tp_dictoffset = offsetof(ProduceDoor, dict),
    .tp_getset = ProduceDoor_getset,
};

static PyMethodDef methods[] = {
    {"pop_run", (PyCFunction)(void (*)(void))pop_run, METH_FASTCALL, pop_run_doc},
    {"tell_run", (PyCFunction)(void (*)(void))tell_run, METH_FASTCALL, tell_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "producerkit._speedups",
    "producerkit's core in C (see producerkit/_core_py.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&RecordType) < 0 || PyType_Ready(&RouterType) < 0 ||
        PyType_Ready(&LedgerType) < 0 ||
        PyType_Ready(&WindowCoreType) < 0 || PyType_Ready(&AdmissionType) < 0 ||
        PyType_Ready(&SlotsMakerType) < 0 || PyType_Ready(&DoneType) < 0 ||
        PyType_Ready(&ExactBytesType) < 0 ||
        PyType_Ready(&ProduceDoorType) < 0 || PyType_Ready(&ProducerCoreType) < 0)
        return NULL;
    if (DONE == NULL) {
        DONE = (PyObject *)PyObject_New(Done, &DoneType);
        if (DONE == NULL) return NULL;
        ((Done *)DONE)->error = NULL;
        for (int k = 0; k < 9; k++) {
            door_keywords[k] = PyUnicode_InternFromString(door_keyword_names[k]);
            if (door_keywords[k] == NULL) return NULL;
        }
    }
    if (DECLINED == NULL) {
        DECLINED = Py_NewRef(Py_NotImplemented); /* shared with the Python implementation */
        if (!DECLINED) return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "RECORD_SEQ", R_SEQ) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_VALUE", R_VALUE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_KEY", R_KEY) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_HEADERS", R_HEADERS) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_DEADLINE", R_DEADLINE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_TOPIC", R_TOPIC) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_PARTITION", R_PARTITION) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_MSG_ID", R_MSG_ID) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_CONNECTION", R_CONNECTION) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_FUTURE", R_FUTURE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_TIMESTAMP", R_TIMESTAMP) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_CONTEXT", R_CONTEXT) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_VALUE", M_VALUE) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_KEY", M_KEY) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_TOPIC", M_TOPIC) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_PARTITION", M_PARTITION) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_HEADERS", M_HEADERS) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_MSG_ID", M_MSG_ID) < 0 ||
        PyModule_AddIntConstant(module, "MESSAGE_TIMESTAMP", M_TIMESTAMP) < 0 ||
        PyModule_AddObjectRef(module, "DECLINED", DECLINED) < 0 ||
        PyModule_AddObjectRef(module, "Record", (PyObject *)&RecordType) < 0 ||
        PyModule_AddObjectRef(module, "Router", (PyObject *)&RouterType) < 0 ||
        PyModule_AddObjectRef(module, "WindowCore", (PyObject *)&WindowCoreType) < 0 ||
        PyModule_AddObjectRef(module, "Ledger", (PyObject *)&LedgerType) < 0 ||
        PyModule_AddObjectRef(module, "Admission", (PyObject *)&AdmissionType) < 0 ||
        PyModule_AddObjectRef(module, "SlotsMaker", (PyObject *)&SlotsMakerType) < 0 ||
        PyModule_AddObjectRef(module, "ExactBytes", (PyObject *)&ExactBytesType) < 0 ||
        PyModule_AddObjectRef(module, "Done", (PyObject *)&DoneType) < 0 ||
        PyModule_AddObjectRef(module, "ProduceDoor", (PyObject *)&ProduceDoorType) < 0 ||
        PyModule_AddObjectRef(module, "ProducerCore", (PyObject *)&ProducerCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
