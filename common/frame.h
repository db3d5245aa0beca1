/* ZMQ + protobuf framing: one envelope message (proto/river_*.proto) is one ZMQ frame.
 *
 * Every link has one envelope per direction, a message whose only content is a oneof of
 * the real messages. frame_encode_* serializes an envelope; frame_decode checks a
 * received frame against a size limit, unpacks it and validates it (a known message kind
 * is set, strings are UTF-8), so that the code behind it never sees a frame it cannot
 * handle. Nothing a peer sends can crash the decoder: bad frames come back as errors with
 * a detail line (river_err_detail()) fit to send back to the peer. */
#ifndef RIVER_COMMON_FRAME_H
#define RIVER_COMMON_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <zmq.h>

#include "proto/river_admin.pb-c.h"
#include "proto/river_client.pb-c.h"
#include "proto/river_worker.pb-c.h"

/* The envelopes, one per link and direction. */
typedef enum {
    FRAME_CLIENT_REQUEST = 0, /* River__Client__ClientRequest, client -> riverd */
    FRAME_CLIENT_REPLY,       /* River__Client__ClientReply, riverd -> client */
    FRAME_WORKER_MESSAGE,     /* River__Worker__WorkerMessage, worker -> riverd */
    FRAME_DAEMON_MESSAGE,     /* River__Worker__DaemonMessage, riverd -> worker */
    FRAME_ADMIN_REQUEST,      /* River__Admin__AdminRequest, riverctl -> riverd */
    FRAME_ADMIN_REPLY,        /* River__Admin__AdminReply, riverd -> riverctl */
    FRAME_KIND_COUNT
} frame_kind_t;

/* The frame limit frame_decode applies when given 0. */
#define FRAME_MAX_BYTES_DEFAULT ((size_t)1 << 20)

/* The envelope's message name ("ClientRequest"); "?" outside the table. */
const char *frame_kind_name(frame_kind_t kind);

/* The kind of an envelope message, or -1 when msg is NULL or not an envelope. */
int frame_kind_of(const ProtobufCMessage *msg);

/* The name of the message an envelope carries ("generate", "heartbeat"), for logs; "none"
 * when no kind is set, "?" when msg is not an envelope. */
const char *frame_case_name(const ProtobufCMessage *env);

/* Bytes env takes on the wire; 0 when it is not an envelope. */
size_t frame_size(const ProtobufCMessage *env);

/* Serializes env into a fresh malloc'd buffer. RIVER_EINVAL when env is not an envelope,
 * carries no message, or has a NULL where a string or message must be. */
int frame_encode_buf(const ProtobufCMessage *env, uint8_t **buf, size_t *len);

/* Serializes env into *out, which it initializes; the caller sends or closes it. Same
 * errors as frame_encode_buf; on error *out is an empty message (closing it is harmless). */
int frame_encode_msg(const ProtobufCMessage *env, zmq_msg_t *out);

/* Decodes a frame that should hold an envelope of `kind`. max_bytes is the largest frame
 * accepted (0: FRAME_MAX_BYTES_DEFAULT). *out receives the message (free it with
 * frame_free), NULL on error:
 *   RIVER_ERANGE  the frame is over max_bytes (the detail names the limit);
 *   RIVER_EPROTO  truncated or malformed bytes, no message kind or one this build does
 *                 not know, a string that is not UTF-8 (the detail says which);
 *   RIVER_EINVAL  bad arguments. */
int frame_decode(frame_kind_t kind, const void *data, size_t len, size_t max_bytes,
                 ProtobufCMessage **out);

/* frame_decode on the contents of a received ZMQ message (which stays the caller's). */
int frame_decode_msg(frame_kind_t kind, zmq_msg_t *msg, size_t max_bytes,
                     ProtobufCMessage **out);

/* Frees a decoded message and sets *msg to NULL; NULL and *msg == NULL are fine. */
void frame_free(ProtobufCMessage **msg);

/* The client-facing code for a River error code: bad input (RIVER_EINVAL, RIVER_ERANGE,
 * RIVER_EPROTO...) is INVALID_ARGUMENT, RIVER_EFULL and RIVER_ENOMEM are
 * RESOURCE_EXHAUSTED, RIVER_ETIMEOUT is DEADLINE_EXCEEDED, RIVER_ECANCELED is CANCELLED,
 * RIVER_EUNAVAILABLE (a split pair's peer is gone) is UNAVAILABLE, 0 is OK and anything
 * else INTERNAL. */
River__Client__Error__Code frame_error_code(int err);

/* Fills an Error message whose strings point at request_id and message (borrowed; NULL
 * reads as ""). For AdminReply.error and Failed.error as well as client replies. */
void frame_error_fill(River__Client__Error *e, const char *request_id,
                      River__Client__Error__Code code, const char *message);

/* Encodes the ClientReply{error} that answers a request or a bad frame. request_id is ""
 * (or NULL) when the frame was too broken to carry one. For a bad frame:
 *     rc = frame_decode(FRAME_CLIENT_REQUEST, data, len, max, &m);
 *     if (rc < 0)
 *         frame_error_reply(NULL, frame_error_code(rc), river_err_detail(), &reply);
 * A message longer than 1024 bytes is cut there. */
int frame_error_reply(const char *request_id, River__Client__Error__Code code,
                      const char *message, zmq_msg_t *out);

#endif
