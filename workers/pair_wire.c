/* What both sides of the split pair share on the wire: frame decoding and sending, the
 * peer's pidfd, the frame limits, printable peer strings (workers/pair_wire.h). */
#include "workers/pair_wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/err.h"
#include "common/log.h"

const char *pair_wire_printable(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    for (; s && *s && n + 1 < cap && n < 80; s++)
        buf[n++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    buf[n] = '\0';
    return buf;
}

/* Unpacks a frame of at most max_bytes into an envelope with a message kind set. */
int pair_wire_decode(const ProtobufCMessageDescriptor *d, const void *data, size_t len,
                     size_t max_bytes, ProtobufCMessage **out)
{
    *out = NULL;
    if (len > max_bytes)
        return river_err_set(RIVER_ERANGE, "pair: frame of %zu bytes over the limit of %zu",
                             len, max_bytes);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, data);
    if (!m)
        return river_err_set(RIVER_EPROTO, "pair: malformed %s frame of %zu bytes",
                             d->short_name, len);
    /* Both envelopes are one oneof; its case is the first field's quantifier. */
    uint32_t kind;
    memcpy(&kind, (const char *)m + d->fields[0].quantifier_offset, sizeof kind);
    if (kind == 0) {
        protobuf_c_message_free_unpacked(m, NULL);
        return river_err_set(RIVER_EPROTO, "pair: %s frame without a message kind",
                             d->short_name);
    }
    *out = m;
    return 0;
}

/* Packs an envelope into a ZMQ message and sends it without waiting. */
int pair_wire_send(void *sock, const ProtobufCMessage *env, int flags)
{
    size_t n = protobuf_c_message_get_packed_size(env);
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, n))
        return river_err_set(RIVER_ENOMEM, "pair: message of %zu bytes", n);
    protobuf_c_message_pack(env, zmq_msg_data(&m));
    if (zmq_msg_send(&m, sock, flags | ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&m);
        return river_err_set(err == EHOSTUNREACH || err == EAGAIN ? RIVER_EUNAVAILABLE
                                                                  : RIVER_ESYS,
                             "pair: sending: %s", zmq_strerror(err));
    }
    return 0;
}

/* A pidfd for a peer process (readable once it ends), or -1 when the kernel has none:
 * liveness then rests on heartbeats alone. The raw system call rather than glibc's
 * pidfd_open, which only glibc 2.36 has: the binaries must also start on the older C
 * libraries of machines they are carried to (the lent GPU machine), where the kernel has
 * the call. */
int pair_wire_pidfd(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        log_warn("pidfd_open(%d): %s; the peer's end is noticed by heartbeats only",
                 (int)pid, strerror(errno));
    return fd;
}

/* Largest frame a layer request or reply of this shape takes: hidden states, positions
 * and tables (every int at most 10 bytes on the wire), and room for the rest. */
size_t pair_wire_frame_limit(int max_rows, int dim, int max_seq_len, int page_size)
{
    size_t rows = (size_t)max_rows;
    size_t pages = (size_t)(max_seq_len / page_size + 2);
    return 4096 + rows * (size_t)dim * sizeof(float) + rows * 40 + rows * pages * 10;
}
