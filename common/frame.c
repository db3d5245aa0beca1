#include "common/frame.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Longest Error.message frame_error_reply sends. */
#define FRAME_MESSAGE_MAX 1024
/* Nesting the wire diagnosis follows; the schemas are not recursive and nest far less. */
#define FRAME_DEPTH_MAX 16

static const ProtobufCMessageDescriptor *const frame__desc[FRAME_KIND_COUNT] = {
    [FRAME_CLIENT_REQUEST] = &river__client__client_request__descriptor,
    [FRAME_CLIENT_REPLY] = &river__client__client_reply__descriptor,
    [FRAME_WORKER_MESSAGE] = &river__worker__worker_message__descriptor,
    [FRAME_DAEMON_MESSAGE] = &river__worker__daemon_message__descriptor,
    [FRAME_ADMIN_REQUEST] = &river__admin__admin_request__descriptor,
    [FRAME_ADMIN_REPLY] = &river__admin__admin_reply__descriptor,
};

/* River codes and the client-facing codes they become; codes not listed are INTERNAL. */
static const struct {
    int err;
    River__Client__Error__Code code;
} frame__codes[] = {
    {RIVER_OK, RIVER__CLIENT__ERROR__CODE__OK},
    {RIVER_EINVAL, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_ERANGE, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_EPROTO, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_EFORMAT, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_ETRUNC, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_ETOKENIZER, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_EUNSUPPORTED, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT},
    {RIVER_EFULL, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED},
    {RIVER_ENOMEM, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED},
    {RIVER_ETIMEOUT, RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED},
    {RIVER_ECANCELED, RIVER__CLIENT__ERROR__CODE__CANCELLED},
    {RIVER_EUNAVAILABLE, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE},
    {RIVER_EAUTH, RIVER__CLIENT__ERROR__CODE__UNAUTHENTICATED},
};

const char *frame_kind_name(frame_kind_t kind)
{
    return (unsigned)kind < FRAME_KIND_COUNT ? frame__desc[kind]->short_name : "?";
}

int frame_kind_of(const ProtobufCMessage *msg)
{
    if (!msg)
        return -1;
    for (int k = 0; k < FRAME_KIND_COUNT; k++)
        if (msg->descriptor == frame__desc[k])
            return k;
    return -1;
}

/* The oneof of an envelope: its case member and the first field in it. Every envelope has
 * exactly one oneof; the generated descriptors list its fields together. */
static const ProtobufCFieldDescriptor *frame__oneof(const ProtobufCMessageDescriptor *d)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            return &d->fields[i];
    return NULL;
}

static uint32_t frame__case(const ProtobufCMessage *env, const ProtobufCFieldDescriptor *f)
{
    uint32_t c;
    memcpy(&c, (const char *)env + f->quantifier_offset, sizeof c);
    return c;
}

const char *frame_case_name(const ProtobufCMessage *env)
{
    if (frame_kind_of(env) < 0)
        return "?";
    const ProtobufCFieldDescriptor *f = frame__oneof(env->descriptor);
    uint32_t c = frame__case(env, f);
    if (c == 0)
        return "none";
    const ProtobufCFieldDescriptor *cf =
        protobuf_c_message_descriptor_get_field(env->descriptor, c);
    return cf ? cf->name : "?";
}

size_t frame_size(const ProtobufCMessage *env)
{
    return frame_kind_of(env) < 0 ? 0 : protobuf_c_message_get_packed_size(env);
}

/* What an envelope must satisfy before it is packed: packing follows every pointer, so a
 * NULL string or sub-message would crash it rather than fail. */
static int frame__check_out(const ProtobufCMessage *env)
{
    int kind = frame_kind_of(env);
    if (kind < 0)
        return river_err_set(RIVER_EINVAL, "frame: message %s is not an envelope",
                             env ? env->descriptor->name : "NULL");
    /* Every envelope's oneof holds messages only; a NULL one would pack to nothing. */
    uint32_t c = frame__case(env, frame__oneof(env->descriptor));
    const ProtobufCFieldDescriptor *cf =
        c ? protobuf_c_message_descriptor_get_field(env->descriptor, c) : NULL;
    const void *sub = NULL;
    if (cf)
        memcpy(&sub, (const char *)env + cf->offset, sizeof sub);
    if (!sub)
        return river_err_set(RIVER_EINVAL, "frame: %s carries no message",
                             frame_kind_name(kind));
    if (!protobuf_c_message_check(env))
        return river_err_set(RIVER_EINVAL, "frame: %s has a NULL string or message",
                             frame_kind_name(kind));
    return 0;
}

int frame_encode_buf(const ProtobufCMessage *env, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int rc = frame__check_out(env);
    if (rc < 0)
        return rc;
    size_t n = protobuf_c_message_get_packed_size(env);
    /* malloc(0) may return NULL; an envelope with a kind set is never empty anyway. */
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return river_err_set(RIVER_ENOMEM, "frame: %zu bytes", n);
    size_t w = protobuf_c_message_pack(env, b);
    if (w != n) {
        free(b);
        return river_err_set(RIVER_EINVAL, "frame: %s packed %zu bytes, expected %zu",
                             env->descriptor->short_name, w, n);
    }
    *buf = b;
    *len = n;
    return 0;
}

int frame_encode_msg(const ProtobufCMessage *env, zmq_msg_t *out)
{
    int rc = frame__check_out(env);
    if (rc < 0) {
        zmq_msg_init(out);
        return rc;
    }
    size_t n = protobuf_c_message_get_packed_size(env);
    if (zmq_msg_init_size(out, n) != 0) {
        zmq_msg_init(out);
        return river_err_set(RIVER_ENOMEM, "frame: zmq message of %zu bytes: %s", n,
                             zmq_strerror(zmq_errno()));
    }
    size_t w = protobuf_c_message_pack(env, zmq_msg_data(out));
    if (w != n) {
        zmq_msg_close(out);
        zmq_msg_init(out);
        return river_err_set(RIVER_EINVAL, "frame: %s packed %zu bytes, expected %zu",
                             env->descriptor->short_name, w, n);
    }
    return 0;
}

/* ---- Diagnosis of frames protobuf-c refused ----
 *
 * protobuf-c only says "no". To tell the peer what was wrong, the frame is walked again
 * at the wire level along the descriptors: tags, varints, lengths and wire types. It
 * runs only on the error path. */

enum { FRAME_WT_VARINT = 0, FRAME_WT_64 = 1, FRAME_WT_LEN = 2, FRAME_WT_32 = 5 };

/* Reads a varint at *pos; false when the buffer ends inside it or it is over 10 bytes. */
static bool frame__varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0, i = 0; i < 10; i++, shift += 7) {
        if (*pos >= len)
            return false;
        uint8_t b = p[(*pos)++];
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

static int frame__wire_type_of(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return FRAME_WT_64;
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return FRAME_WT_32;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return FRAME_WT_LEN;
    default:
        return FRAME_WT_VARINT;
    }
}

/* Walks one message's bytes; writes what is wrong into why and returns false, or returns
 * true when the walk found nothing (protobuf-c may still have refused, e.g. a bad varint
 * inside a packed array). path names the message ("ClientRequest.generate"), at is the
 * offset of p within the whole frame. */
static bool frame__diagnose(const ProtobufCMessageDescriptor *d, const char *path,
                            const uint8_t *p, size_t len, size_t at, int depth, char *why,
                            size_t cap)
{
    size_t pos = 0;
    while (pos < len) {
        size_t start = pos;
        uint64_t tag, n;
        if (!frame__varint(p, len, &pos, &tag)) {
            snprintf(why, cap, "%s: bad or truncated field tag at byte %zu", path,
                     at + start);
            return false;
        }
        uint64_t id = tag >> 3;
        int wt = (int)(tag & 7);
        if (id == 0 || id > 536870911u) {
            snprintf(why, cap, "%s: invalid field number %llu at byte %zu", path,
                     (unsigned long long)id, at + start);
            return false;
        }
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)id);
        if (f) {
            int want = frame__wire_type_of(f->type);
            bool packed = f->label == PROTOBUF_C_LABEL_REPEATED && want != FRAME_WT_LEN &&
                          wt == FRAME_WT_LEN;
            if (wt != want && !packed) {
                snprintf(why, cap, "%s.%s: wire type %d at byte %zu, expected %d",
                         path, f->name, wt, at + start, want);
                return false;
            }
        }
        const char *fname = f ? f->name : "?";
        switch (wt) {
        case FRAME_WT_VARINT:
            if (!frame__varint(p, len, &pos, &n)) {
                snprintf(why, cap, "%s.%s: bad or truncated varint at byte %zu",
                         path, fname, at + start);
                return false;
            }
            break;
        case FRAME_WT_64:
        case FRAME_WT_32: {
            size_t w = wt == FRAME_WT_64 ? 8 : 4;
            if (len - pos < w) {
                snprintf(why, cap, "%s.%s: truncated, %zu-byte value at byte %zu, %zu left",
                         path, fname, w, at + pos, len - pos);
                return false;
            }
            pos += w;
            break;
        }
        case FRAME_WT_LEN:
            if (!frame__varint(p, len, &pos, &n)) {
                snprintf(why, cap, "%s.%s: bad or truncated length at byte %zu",
                         path, fname, at + start);
                return false;
            }
            if (n > len - pos) {
                snprintf(why, cap, "%s.%s: truncated, %llu bytes at byte %zu, %zu left",
                         path, fname, (unsigned long long)n, at + pos, len - pos);
                return false;
            }
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < FRAME_DEPTH_MAX) {
                char sub[192];
                snprintf(sub, sizeof sub, "%.120s.%.60s", path, f->name);
                if (!frame__diagnose(f->descriptor, sub, p + pos, (size_t)n, at + pos,
                                     depth + 1, why, cap))
                    return false;
            }
            pos += (size_t)n;
            break;
        default:
            snprintf(why, cap, "%s: unsupported wire type %d at byte %zu", path, wt,
                     at + start);
            return false;
        }
    }
    return true;
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 prefix of s[0..n): RFC 3629, no overlong forms, no
 * surrogates, nothing past U+10FFFF. */
static size_t frame__utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i <= k)
            return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += k + 1;
    }
    return n;
}

/* Checks every string of a decoded message, following sub-messages and only the oneof
 * members that are set (the others share their storage). path names the message. */
static int frame__check_strings(const ProtobufCMessage *m, const char *path, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    if (depth > FRAME_DEPTH_MAX)
        return river_err_set(RIVER_EPROTO, "frame: %s nests too deep", path);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && frame__case(m, f) != f->id)
            continue;
        const char *member = (const char *)m + f->offset;
        size_t count = 1;
        const void *const *items = (const void *const *)member;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            memcpy(&count, (const char *)m + f->quantifier_offset, sizeof count);
            memcpy(&items, member, sizeof items);
        }
        for (size_t j = 0; j < count; j++) {
            if (!items[j])
                continue;
            char sub[256];
            if (f->label == PROTOBUF_C_LABEL_REPEATED)
                snprintf(sub, sizeof sub, "%s.%s[%zu]", path, f->name, j);
            else
                snprintf(sub, sizeof sub, "%s.%s", path, f->name);
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                const uint8_t *s = items[j];
                size_t n = strlen((const char *)s);
                size_t ok = frame__utf8_valid(s, n);
                if (ok != n)
                    return river_err_set(RIVER_EPROTO,
                                         "frame: %s is not valid UTF-8 (byte %zu of %zu)",
                                         sub, ok, n);
            } else {
                int rc = frame__check_strings(items[j], sub, depth + 1);
                if (rc < 0)
                    return rc;
            }
        }
    }
    return 0;
}

/* ---- Decoding ---- */

int frame_decode(frame_kind_t kind, const void *data, size_t len, size_t max_bytes,
                 ProtobufCMessage **out)
{
    *out = NULL;
    if ((unsigned)kind >= FRAME_KIND_COUNT)
        return river_err_set(RIVER_EINVAL, "frame: unknown frame kind %d", (int)kind);
    if (!data && len)
        return river_err_set(RIVER_EINVAL, "frame: NULL data of %zu bytes", len);
    const ProtobufCMessageDescriptor *d = frame__desc[kind];
    if (max_bytes == 0)
        max_bytes = FRAME_MAX_BYTES_DEFAULT;
    if (len > max_bytes)
        return river_err_set(RIVER_ERANGE, "%s frame of %zu bytes is over the limit of %zu "
                             "bytes", d->short_name, len, max_bytes);

    /* protobuf-c reads nothing for len 0, but wants a valid pointer. */
    static const uint8_t empty[1];
    const uint8_t *p = len ? data : empty;
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, p);
    if (!m) {
        char why[256];
        if (frame__diagnose(d, d->short_name, p, len, 0, 0, why, sizeof why))
            snprintf(why, sizeof why, "%s: malformed contents", d->short_name);
        return river_err_set(RIVER_EPROTO, "malformed %s frame of %zu bytes: %s",
                             d->short_name, len, why);
    }

    const ProtobufCFieldDescriptor *of = frame__oneof(d);
    int rc;
    if (frame__case(m, of) == 0) {
        /* The kind's field number is not in this build's schema (a newer peer), or the
         * envelope is empty. Either way there is nothing this side can act on. */
        if (m->n_unknown_fields > 0)
            rc = river_err_set(RIVER_EPROTO, "%s frame carries an unknown message kind "
                               "(field %u); is the peer newer than this build?",
                               d->short_name, m->unknown_fields[0].tag);
        else
            rc = river_err_set(RIVER_EPROTO, "%s frame carries no message", d->short_name);
        goto fail;
    }
    rc = frame__check_strings(m, d->short_name, 0);
    if (rc < 0)
        goto fail;
    *out = m;
    return 0;

fail:
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

int frame_decode_msg(frame_kind_t kind, zmq_msg_t *msg, size_t max_bytes,
                     ProtobufCMessage **out)
{
    return frame_decode(kind, zmq_msg_data(msg), zmq_msg_size(msg), max_bytes, out);
}

void frame_free(ProtobufCMessage **msg)
{
    if (msg && *msg) {
        protobuf_c_message_free_unpacked(*msg, NULL);
        *msg = NULL;
    }
}

/* ---- Error replies ---- */

River__Client__Error__Code frame_error_code(int err)
{
    for (size_t i = 0; i < sizeof frame__codes / sizeof frame__codes[0]; i++)
        if (frame__codes[i].err == err)
            return frame__codes[i].code;
    return RIVER__CLIENT__ERROR__CODE__INTERNAL;
}

void frame_error_fill(River__Client__Error *e, const char *request_id,
                      River__Client__Error__Code code, const char *message)
{
    river__client__error__init(e);
    /* protobuf-c's string members are not const; packing only reads them. */
    e->request_id = (char *)(request_id ? request_id : "");
    e->code = code;
    e->message = (char *)(message ? message : "");
}

/* Copies at most cap-1 bytes of s into buf, replacing bytes that are not UTF-8 with '?',
 * so that the reply passes the peer's frame check whatever the message held. */
static void frame__sanitize(char *buf, size_t cap, const char *s)
{
    size_t n = strlen(s), o = 0, i = 0;
    while (i < n && o + 1 < cap) {
        size_t ok = frame__utf8_valid((const uint8_t *)s + i, n - i);
        if (ok == 0) {
            buf[o++] = '?';
            i++;
            continue;
        }
        /* Copy whole characters only: back off to a lead byte when the buffer ends. */
        size_t take = ok < cap - 1 - o ? ok : cap - 1 - o;
        while (take > 0 && take < ok && ((uint8_t)s[i + take] & 0xc0) == 0x80)
            take--;
        if (take == 0)
            break;
        memcpy(buf + o, s + i, take);
        o += take;
        i += take;
    }
    buf[o] = '\0';
}

int frame_error_reply(const char *request_id, River__Client__Error__Code code,
                      const char *message, zmq_msg_t *out)
{
    char id[FRAME_MESSAGE_MAX], text[FRAME_MESSAGE_MAX];
    frame__sanitize(id, sizeof id, request_id ? request_id : "");
    frame__sanitize(text, sizeof text, message ? message : "");
    River__Client__Error e;
    frame_error_fill(&e, id, code, text);
    River__Client__ClientReply r = RIVER__CLIENT__CLIENT_REPLY__INIT;
    r.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR;
    r.error = &e;
    return frame_encode_msg(&r.base, out);
}
