/* producerkit.backends.kafka._cwire: the Kafka wire in C, the twin of the Python encoder in
 * producerkit/backends/kafka/wire.py (the same names and signatures; that module says what each
 * does and chooses one implementation at import): a RecordBatch (v2) from records, its records
 * section alone, a batch framed around a compressed section, CRC-32C, records grouped by
 * partition.
 *
 * It reads producerkit._record.Record tuples by position; wire.py checks the positions against
 * the Python constants at import. The module is optional: wire.py loads it, unless it did not
 * compile (no compiler or Python headers at install time) or PRODUCERKIT_NO_SPEEDUPS is set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_CRC 1
#include <nmmintrin.h>
#endif

/* Positions in producerkit._record.Record that the wire reads. */
#define R_VALUE 1
#define R_KEY 2
#define R_TOPIC 3
#define R_PARTITION 4
#define R_HEADERS 5
#define R_DEADLINE 7
#define R_TIMESTAMP 10

/* RecordBatch v2 header: base offset (8), length (4), leader epoch (4), magic (1), crc (4),
 * attributes (2), last offset delta (4), first and max timestamp (8 + 8), producer id (8),
 * producer epoch (2), base sequence (4), record count (4). */
#define BATCH_HEADER_SIZE 61
#define CRC_OFFSET 17
#define ATTRIBUTES_OFFSET 21

/* ------------------------------------------------------------------------------ CRC-32C */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = n;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        crc_table[0][n] = crc;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t crc = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            crc = crc_table[0][crc & 0xff] ^ (crc >> 8);
            crc_table[k][n] = crc;
        }
    }
}

static uint32_t crc32c_table(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        word ^= crc;
        crc = crc_table[7][word & 0xff] ^ crc_table[6][(word >> 8) & 0xff] ^
              crc_table[5][(word >> 16) & 0xff] ^ crc_table[4][(word >> 24) & 0xff] ^
              crc_table[3][(word >> 32) & 0xff] ^ crc_table[2][(word >> 40) & 0xff] ^
              crc_table[1][(word >> 48) & 0xff] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef HAVE_SSE42_CRC
/* The hardware CRC of a long buffer runs three streams at once (the instruction's latency is
 * three times its issue rate), then joins them: a stream's CRC followed by LONG (or SHORT) zero
 * bytes is a linear map of it, tabled here a byte at a time (Mark Adler's crc32c.c). */
#define CRC_LONG 8192
#define CRC_SHORT 256
static uint32_t crc_long[4][256], crc_short[4][256];

static uint32_t gf2_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++)
        if (vector & 1) sum ^= *matrix;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *matrix) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(matrix, matrix[n]);
}

/* The tables that append ``length`` (a power of two) zero bytes to a CRC register. */
static void crc_zeros_tables(uint32_t tables[4][256], size_t length) {
    uint32_t even[32], odd[32];
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four */
    const uint32_t *op = odd;
    do { /* eight zero bits (one byte) first, doubling until length bytes */
        gf2_square(even, odd);
        op = even;
        length >>= 1;
        if (!length) break;
        gf2_square(odd, even);
        op = odd;
        length >>= 1;
    } while (length);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) tables[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t crc_shift(uint32_t tables[4][256], uint32_t crc) {
    return tables[0][crc & 0xff] ^ tables[1][(crc >> 8) & 0xff] ^ tables[2][(crc >> 16) & 0xff] ^
           tables[3][crc >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *p,
                                                             size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    static const size_t blocks[2] = {CRC_LONG, CRC_SHORT};
    for (int b = 0; b < 2; b++) {
        size_t block = blocks[b];
        uint32_t (*tables)[256] = b == 0 ? crc_long : crc_short;
        while (n >= 3 * block) {
            uint64_t c1 = 0, c2 = 0, word;
            for (const unsigned char *end = p + block; p < end; p += 8) {
                memcpy(&word, p, 8);
                c = _mm_crc32_u64(c, word);
                memcpy(&word, p + block, 8);
                c1 = _mm_crc32_u64(c1, word);
                memcpy(&word, p + 2 * block, 8);
                c2 = _mm_crc32_u64(c2, word);
            }
            c = crc_shift(tables, (uint32_t)c) ^ (uint32_t)c1;
            c = crc_shift(tables, (uint32_t)c) ^ (uint32_t)c2;
            p += 2 * block;
            n -= 3 * block;
        }
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static uint32_t (*crc32c_impl)(uint32_t, const unsigned char *, size_t) = crc32c_table;

/* ------------------------------------------------------------------------------ varints */

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static inline Py_ssize_t varint_size(int64_t v) {
    uint64_t u = zigzag(v);
    Py_ssize_t size = 1;
    while (u >= 0x80) {
        u >>= 7;
        size++;
    }
    return size;
}

static inline unsigned char *put_varint(unsigned char *out, int64_t v) {
    uint64_t u = zigzag(v);
    while (u >= 0x80) {
        *out++ = (unsigned char)(u | 0x80);
        u >>= 7;
    }
    *out++ = (unsigned char)u;
    return out;
}

static inline unsigned char *put_be16(unsigned char *out, uint16_t v) {
    out[0] = (unsigned char)(v >> 8);
    out[1] = (unsigned char)v;
    return out + 2;
}

static inline unsigned char *put_be32(unsigned char *out, uint32_t v) {
    out[0] = (unsigned char)(v >> 24);
    out[1] = (unsigned char)(v >> 16);
    out[2] = (unsigned char)(v >> 8);
    out[3] = (unsigned char)v;
    return out + 4;
}

static inline unsigned char *put_be64(unsigned char *out, uint64_t v) {
    out = put_be32(out, (uint32_t)(v >> 32));
    return put_be32(out, (uint32_t)v);
}

/* ------------------------------------------------------------------------------ records */

typedef struct {
    PyObject *value, *key, *headers;
    int64_t timestamp_ms;
} RecordView;

static int view_record(PyObject *record, double time_shift, RecordView *view) {
    if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) <= R_TIMESTAMP) {
        PyErr_SetString(PyExc_TypeError, "encode_batch: a record is not a producerkit Record");
        return -1;
    }
    view->value = PyTuple_GET_ITEM(record, R_VALUE);
    view->key = PyTuple_GET_ITEM(record, R_KEY);
    view->headers = PyTuple_GET_ITEM(record, R_HEADERS);
    PyObject *deadline = PyTuple_GET_ITEM(record, R_DEADLINE);
    PyObject *timestamp = PyTuple_GET_ITEM(record, R_TIMESTAMP);
    if ((view->value != Py_None && !PyBytes_Check(view->value)) ||
        (view->key != Py_None && !PyBytes_Check(view->key)) ||
        (view->headers != Py_None && !PyTuple_Check(view->headers)) || !PyFloat_Check(deadline) ||
        (timestamp != Py_None && !PyLong_Check(timestamp))) {
        PyErr_SetString(PyExc_TypeError, "encode_batch: a record's fields have the wrong types");
        return -1;
    }
    if (timestamp == Py_None) { /* the produce time, recovered from the deadline */
        view->timestamp_ms = (int64_t)floor((PyFloat_AS_DOUBLE(deadline) + time_shift) * 1000.0);
    } else { /* the CreateTime the caller gave, in milliseconds */
        view->timestamp_ms = PyLong_AsLongLong(timestamp);
        if (view->timestamp_ms == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* The bytes a nullable field takes: its length varint and its data (-1 alone for None). */
static inline Py_ssize_t nullable_size(PyObject *data) {
    if (data == Py_None) return 1;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    return varint_size(n) + n;
}

static inline unsigned char *put_nullable(unsigned char *out, PyObject *data) {
    if (data == Py_None) return put_varint(out, -1);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    out = put_varint(out, n);
    memcpy(out, PyBytes_AS_STRING(data), (size_t)n);
    return out + n;
}

/* A record as pass 1 of encode_batch saw it, for pass 2 to write. */
typedef struct {
    RecordView view;
    int64_t timestamp_delta;
    Py_ssize_t body; /* size after the length prefix */
} RecordSlot;

/* The size of one record after its length prefix, or -1 with an exception set. */
static Py_ssize_t record_body_size(const RecordView *r, int64_t timestamp_delta,
                                   Py_ssize_t offset_delta) {
    Py_ssize_t size = 1 + varint_size(timestamp_delta) + varint_size(offset_delta);
    size += nullable_size(r->key) + nullable_size(r->value);
    Py_ssize_t count = r->headers == Py_None ? 0 : PyTuple_GET_SIZE(r->headers);
    size += varint_size(count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyTuple_GET_ITEM(r->headers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
            (PyTuple_GET_ITEM(pair, 1) != Py_None && !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)))) {
            PyErr_SetString(PyExc_TypeError,
                            "encode_batch: headers must be (str, bytes or None) pairs");
            return -1;
        }
        Py_ssize_t name_size;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size) == NULL) return -1;
        size += varint_size(name_size) + name_size + nullable_size(PyTuple_GET_ITEM(pair, 1));
    }
    return size;
}

static unsigned char *put_record(unsigned char *out, const RecordView *r, Py_ssize_t body_size,
                                 int64_t timestamp_delta, Py_ssize_t offset_delta) {
    out = put_varint(out, body_size);
    *out++ = 0; /* attributes */
    out = put_varint(out, timestamp_delta);
    out = put_varint(out, offset_delta);
    out = put_nullable(out, r->key);
    out = put_nullable(out, r->value); /* None: a tombstone */
    Py_ssize_t count = r->headers == Py_None ? 0 : PyTuple_GET_SIZE(r->headers);
    out = put_varint(out, count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyTuple_GET_ITEM(r->headers, i);
        Py_ssize_t name_size;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_size);
        out = put_varint(out, name_size);
        memcpy(out, name, (size_t)name_size);
        out += name_size;
        out = put_nullable(out, PyTuple_GET_ITEM(pair, 1));
    }
    return out;
}

/* Write a v2 RecordBatch header at out for a batch of size bytes (header included) holding
 * count records with the given codec (attributes) and timestamps; the CRC is left to frame(). */
static void put_header(unsigned char *out, Py_ssize_t size, int codec, Py_ssize_t count,
                       int64_t first_timestamp, int64_t max_timestamp) {
    out = put_be64(out, 0);                        /* base offset: the broker sets it */
    out = put_be32(out, (uint32_t)(size - 12));    /* length after this field */
    out = put_be32(out, (uint32_t)-1);             /* partition leader epoch */
    *out++ = 2;                                    /* magic */
    out = put_be32(out, 0);                        /* crc, once the rest is written */
    out = put_be16(out, (uint16_t)codec);          /* attributes: the codec, nothing else */
    out = put_be32(out, (uint32_t)(count - 1));    /* last offset delta */
    out = put_be64(out, (uint64_t)first_timestamp);
    out = put_be64(out, (uint64_t)max_timestamp);
    out = put_be64(out, (uint64_t)-1);             /* producer id: none */
    out = put_be16(out, (uint16_t)-1);             /* producer epoch */
    out = put_be32(out, (uint32_t)-1);             /* base sequence */
    put_be32(out, (uint32_t)count);                /* record count */
}

static void put_crc(unsigned char *base, Py_ssize_t size) {
    put_be32(base + CRC_OFFSET,
             crc32c_impl(0, base + ATTRIBUTES_OFFSET, (size_t)(size - ATTRIBUTES_OFFSET)));
}

/* A hint to load the cache line at p for reading (a no-op where the compiler has none). */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p))
#else
#define PREFETCH(p) ((void)(p))
#endif

/* How many records ahead pass 2 asks for a value's first bytes: its copy starts with them in
 * cache instead of waiting on each value's first lines in turn. */
#define PREFETCH_AHEAD 4

static inline void prefetch_bytes(PyObject *data) {
    if (!PyBytes_CheckExact(data)) return;
    const char *start = PyBytes_AS_STRING(data);
    PREFETCH(start);
    PREFETCH(start + 64);
    PREFETCH(start + 128);
}

/* Encode records[start:end] (as many as fit in max_bytes, at least one) after header_room
 * bytes left free: a new bytes object, or NULL with an exception set. */
static PyObject *encode_records(PyObject *records, Py_ssize_t start, Py_ssize_t max_bytes,
                                double time_shift, Py_ssize_t header_room, Py_ssize_t *end_out,
                                int64_t *first_out, int64_t *max_out) {
    Py_ssize_t total = PyList_GET_SIZE(records);
    if (start < 0 || start >= total) {
        PyErr_SetString(PyExc_IndexError, "encode_batch: start is outside the records");
        return NULL;
    }
    /* Pass 1: how many records fit, and the exact size; each record's view and body size are
     * kept for pass 2. */
    RecordSlot *slots = PyMem_New(RecordSlot, (size_t)(total - start));
    if (slots == NULL) return PyErr_NoMemory();
    int64_t first_timestamp = 0, max_timestamp = 0;
    Py_ssize_t size = BATCH_HEADER_SIZE, end = start;
    for (; end < total; end++) {
        RecordSlot *slot = &slots[end - start];
        if (view_record(PyList_GET_ITEM(records, end), time_shift, &slot->view) < 0) goto error;
        if (end == start) first_timestamp = max_timestamp = slot->view.timestamp_ms;
        slot->timestamp_delta = slot->view.timestamp_ms - first_timestamp;
        slot->body = record_body_size(&slot->view, slot->timestamp_delta, end - start);
        if (slot->body < 0) goto error;
        Py_ssize_t record_size = varint_size(slot->body) + slot->body;
        if (end > start && size + record_size > max_bytes) break;
        size += record_size;
        if (slot->view.timestamp_ms > max_timestamp) max_timestamp = slot->view.timestamp_ms;
    }
    /* Pass 2: write them. */
    Py_ssize_t length = size - BATCH_HEADER_SIZE + header_room;
    PyObject *encoded = PyBytes_FromStringAndSize(NULL, length);
    if (encoded == NULL) goto error;
    unsigned char *base = (unsigned char *)PyBytes_AS_STRING(encoded);
    unsigned char *out = base + header_room;
    for (Py_ssize_t i = start; i < end; i++) {
        const RecordSlot *slot = &slots[i - start];
        if (i + PREFETCH_AHEAD < end) prefetch_bytes(slots[i + PREFETCH_AHEAD - start].view.value);
        out = put_record(out, &slot->view, slot->body, slot->timestamp_delta, i - start);
    }
    PyMem_Free(slots);
    if (out != base + length) { /* a record changed between the passes: impossible with the GIL */
        Py_DECREF(encoded);
        PyErr_SetString(PyExc_RuntimeError, "encode_batch: size mismatch");
        return NULL;
    }
    *end_out = end;
    *first_out = first_timestamp;
    *max_out = max_timestamp;
    return encoded;
error:
    PyMem_Free(slots);
    return NULL;
}

static int encoding_args(PyObject *const *args, Py_ssize_t nargs, const char *name,
                         Py_ssize_t *start, Py_ssize_t *max_bytes, double *time_shift) {
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_Format(PyExc_TypeError,
                     "%s(records: list, start: int, max_bytes: int, time_shift: float)", name);
        return -1;
    }
    *start = PyLong_AsSsize_t(args[1]);
    *max_bytes = PyLong_AsSsize_t(args[2]);
    *time_shift = PyFloat_AsDouble(args[3]);
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(encode_batch_doc,
"encode_batch(records, start, max_bytes, time_shift, checksum=True) -> (bytes, end)\n\n"
"Encode records[start:end] as one uncompressed Kafka RecordBatch (v2), taking records while\n"
"the batch stays within max_bytes (always at least one). A record's CreateTime is its\n"
"TIMESTAMP (milliseconds) where set, else its deadline plus time_shift, in milliseconds. A None\n"
"value (a tombstone), key or header value is written as null. With checksum false the CRC is\n"
"left 0, for a batch whose header is stamped (and its CRC made) before it is sent.");

static PyObject *encode_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, max_bytes, end;
    double time_shift;
    int64_t first_timestamp, max_timestamp;
    int checksum = 1;
    if (nargs == 5) {
        checksum = PyObject_IsTrue(args[4]);
        if (checksum < 0) return NULL;
        nargs = 4;
    }
    if (encoding_args(args, nargs, "encode_batch", &start, &max_bytes, &time_shift) < 0)
        return NULL;
    PyObject *batch = encode_records(args[0], start, max_bytes, time_shift, BATCH_HEADER_SIZE,
                                     &end, &first_timestamp, &max_timestamp);
    if (batch == NULL) return NULL;
    unsigned char *base = (unsigned char *)PyBytes_AS_STRING(batch);
    Py_ssize_t size = PyBytes_GET_SIZE(batch);
    put_header(base, size, 0, end - start, first_timestamp, max_timestamp);
    if (checksum) put_crc(base, size);
    return Py_BuildValue("(Nn)", batch, end);
}

PyDoc_STRVAR(encode_records_doc,
"encode_records(records, start, max_bytes, time_shift) -> (bytes, end, first_ts, max_ts)\n\n"
"The records section of encode_batch's batch (the same records, without its header), to be\n"
"compressed and framed by frame_batch.");

static PyObject *encode_records_only(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, max_bytes, end;
    double time_shift;
    int64_t first_timestamp, max_timestamp;
    if (encoding_args(args, nargs, "encode_records", &start, &max_bytes, &time_shift) < 0)
        return NULL;
    PyObject *section = encode_records(args[0], start, max_bytes, time_shift, 0, &end,
                                       &first_timestamp, &max_timestamp);
    if (section == NULL) return NULL;
    return Py_BuildValue("(NnLL)", section, end, (long long)first_timestamp,
                         (long long)max_timestamp);
}

PyDoc_STRVAR(frame_batch_doc,
"frame_batch(section, codec, count, first_ts, max_ts) -> bytes\n\n"
"A RecordBatch (v2) around a records section compressed with codec (its attributes: 1 gzip,\n"
"2 snappy, 3 lz4, 4 zstd): the header, the section as it is, the CRC-32C.");

static PyObject *frame_batch(PyObject *module, PyObject *args) {
    Py_buffer section;
    int codec;
    Py_ssize_t count;
    long long first_timestamp, max_timestamp;
    if (!PyArg_ParseTuple(args, "y*inLL", &section, &codec, &count, &first_timestamp,
                          &max_timestamp))
        return NULL;
    if (count < 1 || codec < 0 || codec > 4) {
        PyBuffer_Release(&section);
        PyErr_SetString(PyExc_ValueError, "frame_batch: count >= 1 and codec 0-4");
        return NULL;
    }
    Py_ssize_t size = BATCH_HEADER_SIZE + section.len;
    PyObject *batch = PyBytes_FromStringAndSize(NULL, size);
    if (batch != NULL) {
        unsigned char *base = (unsigned char *)PyBytes_AS_STRING(batch);
        put_header(base, size, codec, count, first_timestamp, max_timestamp);
        memcpy(base + BATCH_HEADER_SIZE, section.buf, (size_t)section.len);
        put_crc(base, size);
    }
    PyBuffer_Release(&section);
    return batch;
}

PyDoc_STRVAR(partition_runs_doc,
"partition_runs(records) -> runs\n\n"
"records grouped by (topic, partition): one list per pair, in the order each pair first\n"
"appears, each in the records' order. KafkaConnection.send_many's grouping.");

/* Runs searched one by one up to this many; past it, a dict by (topic, partition) finds them. */
#define RUNS_SCANNED 32
/* Partitions below this, of the first record's topic, find their run by index. */
#define RUNS_INDEXED 1024

/* 1 if record belongs to run (same topic and partition as its first record), 0 if not, -1 on
 * an error. */
static int same_partition(PyObject *run, PyObject *record) {
    PyObject *first = PyList_GET_ITEM(run, 0);
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(first, R_PARTITION),
                                        PyTuple_GET_ITEM(record, R_PARTITION), Py_EQ);
    if (same <= 0) return same;
    return PyObject_RichCompareBool(PyTuple_GET_ITEM(first, R_TOPIC),
                                    PyTuple_GET_ITEM(record, R_TOPIC), Py_EQ);
}

static PyObject *partition_key(PyObject *record) {
    return PyTuple_Pack(2, PyTuple_GET_ITEM(record, R_TOPIC), PyTuple_GET_ITEM(record, R_PARTITION));
}

/* The run of record among runs (borrowed), or NULL with no error if it has none yet: scanned,
 * or looked up in by_key once there is one. */
static PyObject *find_run(PyObject *runs, PyObject *by_key, PyObject *record) {
    if (by_key != NULL) {
        PyObject *key = partition_key(record);
        if (key == NULL) return NULL;
        PyObject *run = PyDict_GetItemWithError(by_key, key);
        Py_DECREF(key);
        return run;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(runs); j++) {
        PyObject *run = PyList_GET_ITEM(runs, j);
        int same = same_partition(run, record);
        if (same < 0) return NULL;
        if (same) return run;
    }
    return NULL;
}

/* A new run holding record, appended to runs (and to by_key, made once runs outgrow the scan).
 * Borrowed, NULL on an error. */
static PyObject *new_run(PyObject *runs, PyObject **by_key, PyObject *record) {
    PyObject *run = PyList_New(1);
    if (run == NULL) return NULL;
    Py_INCREF(record);
    PyList_SET_ITEM(run, 0, record);
    int appended = PyList_Append(runs, run);
    Py_DECREF(run); /* runs holds it */
    if (appended < 0) return NULL;
    Py_ssize_t from = PyList_GET_SIZE(runs) - 1;
    if (*by_key == NULL) {
        if (PyList_GET_SIZE(runs) <= RUNS_SCANNED) return run;
        if ((*by_key = PyDict_New()) == NULL) return NULL;
        from = 0;
    }
    for (Py_ssize_t j = from; j < PyList_GET_SIZE(runs); j++) {
        PyObject *each = PyList_GET_ITEM(runs, j);
        PyObject *key = partition_key(PyList_GET_ITEM(each, 0));
        if (key == NULL) return NULL;
        int stored = PyDict_SetItem(*by_key, key, each);
        Py_DECREF(key);
        if (stored < 0) return NULL;
    }
    return run;
}

static PyObject *partition_runs(PyObject *module, PyObject *records) {
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "partition_runs(records: list)");
        return NULL;
    }
    PyObject *runs = PyList_New(0), *by_key = NULL, *topic = NULL;
    PyObject *indexed[RUNS_INDEXED] = {NULL}; /* borrowed from runs */
    if (runs == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) <= R_PARTITION) {
            PyErr_SetString(PyExc_TypeError, "partition_runs: a record is not a producerkit Record");
            goto error;
        }
        if (topic == NULL) topic = PyTuple_GET_ITEM(record, R_TOPIC);
        PyObject *partition = PyTuple_GET_ITEM(record, R_PARTITION);
        long index = -1;
        if (PyTuple_GET_ITEM(record, R_TOPIC) == topic && PyLong_CheckExact(partition)) {
            index = PyLong_AsLong(partition);
            if (index == -1 && PyErr_Occurred()) PyErr_Clear();
            if (index >= RUNS_INDEXED) index = -1;
        }
        PyObject *run = index >= 0 ? indexed[index] : NULL;
        if (run == NULL) {
            run = find_run(runs, by_key, record);
            if (run == NULL && PyErr_Occurred()) goto error;
            if (run == NULL) {
                if ((run = new_run(runs, &by_key, record)) == NULL) goto error;
            } else if (PyList_Append(run, record) < 0) {
                goto error;
            }
            if (index >= 0) indexed[index] = run;
        } else if (PyList_Append(run, record) < 0) {
            goto error;
        }
    }
    Py_XDECREF(by_key);
    return runs;
error:
    Py_XDECREF(by_key);
    Py_DECREF(runs);
    return NULL;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, crc=0) -> int: CRC-32C (Castagnoli), as Kafka uses it.");

static PyObject *crc32c(PyObject *module, PyObject *args) {
    Py_buffer data;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &crc)) return NULL;
    uint32_t result = crc32c_impl(crc, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(result);
}

/* ------------------------------------------------------------------------------ Appender */

PyDoc_STRVAR(Appender_doc,
"Appender(queues, queue_of, gathering, sender, batch_full, clock)\n\n"
"The twin of producerkit.backends.kafka.wire.Appender (which says what a call does): the\n"
"queues' and the gathering's slots read and written in place, by their offsets.");

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *queues;     /* dict topic -> dict partition -> PartitionQueue */
    PyObject *queue_of;   /* queue_of(record): a queue not in queues yet, made */
    PyObject *gathering;  /* Gathering: batch_records, ship_due */
    PyObject *sender;     /* Sender: linger, schedule_ship */
    PyObject *batch_full; /* batch_full(queue): seals and ships a full batch; an awaitable */
    PyObject *clock;      /* time.monotonic */
    PyTypeObject *queue_type;
    int lingers;
    Py_ssize_t records_at, opened_at_at, in_flight_at, batch_records_at, ship_due_at;
} Appender;

/* The offset of ``cls``'s object slot ``name`` in *offset; -1 with TypeError if it has none. */
static int slot_offset(PyTypeObject *cls, const char *name, Py_ssize_t *offset) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)cls, name);
    if (descr == NULL) return -1;
    int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
               ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (slot) *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!slot) {
        PyErr_Format(PyExc_TypeError, "Appender: %s of %R is no object slot", name, cls);
        return -1;
    }
    return 0;
}

#define SLOT(object, offset) (*(PyObject **)((char *)(object) + (offset)))

/* The slot at ``offset`` of ``object``, borrowed; NULL with AttributeError if unset. */
static PyObject *read_slot(PyObject *object, Py_ssize_t offset, const char *name) {
    PyObject *value = SLOT(object, offset);
    if (value == NULL) PyErr_Format(PyExc_AttributeError, "%R has no %s yet", object, name);
    return value;
}

static PyObject *Appender_vectorcall(Appender *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL || !PyTuple_Check(args[0]) ||
        PyTuple_GET_SIZE(args[0]) <= R_PARTITION) {
        PyErr_SetString(PyExc_TypeError, "append(record: Record) takes one record");
        return NULL;
    }
    PyObject *record = args[0];
    PyObject *queue = NULL;
    PyObject *partitions = PyDict_GetItemWithError(self->queues, PyTuple_GET_ITEM(record, R_TOPIC));
    if (partitions != NULL && PyDict_Check(partitions))
        queue = PyDict_GetItemWithError(partitions, PyTuple_GET_ITEM(record, R_PARTITION));
    if (queue != NULL) {
        Py_INCREF(queue);
    } else {
        if (PyErr_Occurred()) return NULL;
        queue = PyObject_CallOneArg(self->queue_of, record);
        if (queue == NULL) return NULL;
    }
    PyObject *outcome = NULL;
    if (!PyObject_TypeCheck(queue, self->queue_type)) {
        PyErr_Format(PyExc_TypeError, "Appender: %R is not a %s", queue, self->queue_type->tp_name);
        goto done;
    }
    PyObject *records = read_slot(queue, self->records_at, "records");
    if (records == NULL) goto done;
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "Appender: a queue's records are not a list");
        goto done;
    }
    if (PyList_Append(records, record) < 0) goto done;
    Py_ssize_t count = PyList_GET_SIZE(records);
    if (count == 1 && self->lingers) {
        PyObject *now = PyObject_CallNoArgs(self->clock);
        if (now == NULL) goto done;
        Py_XSETREF(SLOT(queue, self->opened_at_at), now);
    }
    PyObject *batch_records = read_slot(self->gathering, self->batch_records_at, "batch_records");
    if (batch_records == NULL) goto done;
    Py_ssize_t full_at = PyLong_AsSsize_t(batch_records);
    if (full_at == -1 && PyErr_Occurred()) goto done;
    if (count >= full_at) {
        outcome = PyObject_CallOneArg(self->batch_full, queue);
        goto done;
    }
    PyObject *ship_due = read_slot(self->gathering, self->ship_due_at, "ship_due");
    if (ship_due == NULL) goto done;
    int due = PyObject_IsTrue(ship_due);
    if (due < 0) goto done;
    if (!due) {
        PyObject *in_flight = read_slot(queue, self->in_flight_at, "in_flight");
        if (in_flight == NULL) goto done;
        int busy = PyObject_IsTrue(in_flight);
        if (busy < 0) goto done;
        if (!busy) {
            PyObject *linger = PyObject_GetAttrString(self->sender, "linger");
            if (linger == NULL) goto done;
            PyObject *scheduled = PyObject_CallMethod(self->sender, "schedule_ship", "O", linger);
            Py_DECREF(linger);
            if (scheduled == NULL) goto done;
            Py_DECREF(scheduled);
        }
    }
    outcome = Py_NewRef(Py_None);
done:
    Py_DECREF(queue);
    return outcome;
}

static int Appender_traverse(Appender *self, visitproc visit, void *arg) {
    Py_VISIT(self->queues);
    Py_VISIT(self->queue_of);
    Py_VISIT(self->gathering);
    Py_VISIT(self->sender);
    Py_VISIT(self->batch_full);
    Py_VISIT(self->clock);
    Py_VISIT(self->queue_type);
    return 0;
}

static int Appender_clear(Appender *self) {
    Py_CLEAR(self->queues);
    Py_CLEAR(self->queue_of);
    Py_CLEAR(self->gathering);
    Py_CLEAR(self->sender);
    Py_CLEAR(self->batch_full);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->queue_type);
    return 0;
}

static void Appender_dealloc(Appender *self) {
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Appender_init(Appender *self, PyObject *args, PyObject *kwargs) {
    PyObject *queues, *queue_of, *gathering, *sender, *batch_full, *clock, *queue_type;
    static char *names[] = {"queues", "queue_of", "gathering", "sender", "batch_full", "clock",
                            "queue_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOO!:Appender", names, &PyDict_Type,
                                     &queues, &queue_of, &gathering, &sender, &batch_full, &clock,
                                     &PyType_Type, &queue_type))
        return -1;
    PyTypeObject *gathering_type = Py_TYPE(gathering);
    if (slot_offset((PyTypeObject *)queue_type, "records", &self->records_at) < 0 ||
        slot_offset((PyTypeObject *)queue_type, "opened_at", &self->opened_at_at) < 0 ||
        slot_offset((PyTypeObject *)queue_type, "in_flight", &self->in_flight_at) < 0 ||
        slot_offset(gathering_type, "batch_records", &self->batch_records_at) < 0 ||
        slot_offset(gathering_type, "ship_due", &self->ship_due_at) < 0)
        return -1;
    PyObject *linger = PyObject_GetAttrString(sender, "linger");
    if (linger == NULL) return -1;
    int lingers = PyObject_IsTrue(linger);
    Py_DECREF(linger);
    if (lingers < 0) return -1;
    Appender_clear(self);
    self->queues = Py_NewRef(queues);
    self->queue_of = Py_NewRef(queue_of);
    self->gathering = Py_NewRef(gathering);
    self->sender = Py_NewRef(sender);
    self->batch_full = Py_NewRef(batch_full);
    self->clock = Py_NewRef(clock);
    self->queue_type = (PyTypeObject *)Py_NewRef(queue_type);
    self->lingers = lingers;
    self->vectorcall = (vectorcallfunc)Appender_vectorcall;
    return 0;
}

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producerkit.backends.kafka._cwire.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = Appender_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_vectorcall_offset = offsetof(Appender, vectorcall),
    .tp_call = PyVectorcall_Call,
};

static PyMethodDef methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_FASTCALL, encode_batch_doc},
    {"encode_records", (PyCFunction)(void (*)(void))encode_records_only, METH_FASTCALL,
     encode_records_doc},
    {"frame_batch", frame_batch, METH_VARARGS, frame_batch_doc},
    {"crc32c", crc32c, METH_VARARGS, crc32c_doc},
    {"partition_runs", partition_runs, METH_O, partition_runs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "producerkit.backends.kafka._cwire",
    "The Kafka wire in C (see producerkit/backends/kafka/wire.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cwire(void) {
    crc_init();
#ifdef HAVE_SSE42_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_zeros_tables(crc_long, CRC_LONG);
        crc_zeros_tables(crc_short, CRC_SHORT);
        crc32c_impl = crc32c_sse42;
    }
#endif
    if (PyType_Ready(&AppenderType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "Appender", (PyObject *)&AppenderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    const char *crc = crc32c_impl == crc32c_table ? "table" : "sse4.2";
    if (PyModule_AddStringConstant(module, "CRC32C", crc) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_VALUE", R_VALUE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_KEY", R_KEY) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_TOPIC", R_TOPIC) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_PARTITION", R_PARTITION) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_HEADERS", R_HEADERS) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_DEADLINE", R_DEADLINE) < 0 ||
        PyModule_AddIntConstant(module, "RECORD_TIMESTAMP", R_TIMESTAMP) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
