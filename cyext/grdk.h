/* grudge-stream's native ingest: the few librdkafka C API entry points it uses, resolved at run
 * time from the librdkafka that confluent-kafka has already loaded into the process (dlopen with
 * RTLD_NOLOAD: never a second copy, never a link-time dependency).
 *
 * Declared here from librdkafka's documented public API (rdkafka.h): the opaque handle types,
 * the public rd_kafka_message_t struct (stable ABI since librdkafka 0.9) and the functions. */
#ifndef GRUDGE_GRDK_H
#define GRUDGE_GRDK_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <Python.h>

typedef struct grdk_kafka_s grdk_kafka_t;   /* rd_kafka_t */
typedef struct grdk_queue_s grdk_queue_t;   /* rd_kafka_queue_t */
typedef struct grdk_topic_s grdk_topic_t;   /* rd_kafka_topic_t */
typedef struct grdk_headers_s grdk_headers_t; /* rd_kafka_headers_t */

/* rd_kafka_message_t, field for field. */
typedef struct {
    int err;                 /* rd_kafka_resp_err_t: 0 or an error (payload: its text) */
    grdk_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} grdk_message_t;

#define GRDK_CONSUMER 1              /* RD_KAFKA_CONSUMER */
#define GRDK_ERR_PARTITION_EOF (-191) /* RD_KAFKA_RESP_ERR__PARTITION_EOF */

typedef struct {
    void *lib;
    int (*version)(void);
    const char *(*name)(const grdk_kafka_t *);
    int (*type)(const grdk_kafka_t *);
    grdk_queue_t *(*queue_new)(grdk_kafka_t *);
    grdk_queue_t *(*queue_get_partition)(grdk_kafka_t *, const char *, int32_t);
    void (*queue_forward)(grdk_queue_t *, grdk_queue_t *);
    void (*queue_destroy)(grdk_queue_t *);
    ssize_t (*consume_batch_queue)(grdk_queue_t *, int, grdk_message_t **, size_t);
    void (*message_destroy)(grdk_message_t *);
    int64_t (*message_timestamp)(const grdk_message_t *, int *);
    const char *(*err2str)(int);
    int (*message_headers)(const grdk_message_t *, grdk_headers_t **);
    int (*header_get_all)(const grdk_headers_t *, size_t, const char **, const void **, size_t *);
} grdk_api_t;

static grdk_api_t grdk;

/* 0 once every symbol is resolved from the already loaded library at `path`; else -1 with the
 * reason in `why`. */
static int grdk_load(const char *path, char *why, size_t whylen) {
    void *lib;
    if (grdk.lib != NULL)
        return 0;
    lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        const char *e = dlerror();
        snprintf(why, whylen, "librdkafka not loaded from %s (%s)", path, e ? e : "dlopen failed");
        return -1;
    }
#define GRDK_SYM(field, sym)                                                   \
    do {                                                                       \
        *(void **)(&grdk.field) = dlsym(lib, sym);                             \
        if (grdk.field == NULL) {                                              \
            snprintf(why, whylen, "librdkafka at %s lacks %s", path, sym);     \
            dlclose(lib);                                                      \
            memset(&grdk, 0, sizeof(grdk));                                    \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    GRDK_SYM(version, "rd_kafka_version");
    GRDK_SYM(name, "rd_kafka_name");
    GRDK_SYM(type, "rd_kafka_type");
    GRDK_SYM(queue_new, "rd_kafka_queue_new");
    GRDK_SYM(queue_get_partition, "rd_kafka_queue_get_partition");
    GRDK_SYM(queue_forward, "rd_kafka_queue_forward");
    GRDK_SYM(queue_destroy, "rd_kafka_queue_destroy");
    GRDK_SYM(consume_batch_queue, "rd_kafka_consume_batch_queue");
    GRDK_SYM(message_destroy, "rd_kafka_message_destroy");
    GRDK_SYM(message_timestamp, "rd_kafka_message_timestamp");
    GRDK_SYM(err2str, "rd_kafka_err2str");
    GRDK_SYM(message_headers, "rd_kafka_message_headers");
    GRDK_SYM(header_get_all, "rd_kafka_header_get_all");
#undef GRDK_SYM
    grdk.lib = lib;
    return 0;
}

/* confluent-kafka's client object (its C struct "Handle") starts with PyObject_HEAD, then the
 * rd_kafka_t pointer; NULL once the client is closed. */
static grdk_kafka_t *grdk_client_handle(PyObject *client) {
    return *(grdk_kafka_t **)((char *)client + sizeof(PyObject));
}

#endif
