/* What the two sides of the split pair (workers/pair.h) share on the wire: limits, frame
 * decoding and sending, the peer's pidfd. Internal to workers/pair_*.c. */
#ifndef RIVER_WORKERS_PAIR_WIRE_H
#define RIVER_WORKERS_PAIR_WIRE_H

#include <stddef.h>
#include <sys/types.h>

#include <protobuf-c/protobuf-c.h>

/* A hello (and anything from a peer that is not paired) is small; its frames are held to
 * this before they are decoded. */
#define PAIR_HELLO_MAX_BYTES (64u << 10)
/* Bounds on what a hello may ask for. */
#define PAIR_MAX_ROWS 65536
#define PAIR_HEARTBEAT_MIN_MS 10
#define PAIR_HEARTBEAT_MAX_MS 3600000
#define PAIR_LIVENESS_MAX 1000

/* Keeps a peer's string printable for the log: at most 80 bytes, control bytes as '?'. */
const char *pair_wire_printable(const char *s, char *buf, size_t cap);

/* Unpacks a frame of at most max_bytes into an envelope with a message kind set. */
int pair_wire_decode(const ProtobufCMessageDescriptor *d, const void *data, size_t len,
                     size_t max_bytes, ProtobufCMessage **out);

/* Packs an envelope into a ZMQ message and sends it without waiting. */
int pair_wire_send(void *sock, const ProtobufCMessage *env, int flags);

/* A pidfd for a peer process (readable once it ends), or -1 when the kernel has none:
 * liveness then rests on heartbeats alone. */
int pair_wire_pidfd(pid_t pid);

/* Largest frame a layer request or reply of this shape takes: hidden states, positions
 * and tables (every int at most 10 bytes on the wire), and room for the rest. */
size_t pair_wire_frame_limit(int max_rows, int dim, int max_seq_len, int page_size);

#endif
