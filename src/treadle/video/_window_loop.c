/* One window's decode and conversion in one C call (treadle.video.window_loop).
 *
 * The same FFmpeg calls, in the same order, as treadle.video.native.NativeLoop makes
 * one ctypes call at a time: send each packet, receive every frame, convert each wanted
 * frame into the batch with sws_scale_frame (frame properties set as PyAV's reformat
 * sets them), then drain and flush. Called through ctypes, the whole window runs
 * without the GIL: two decode threads no longer hand the GIL back and forth a few times
 * per frame.
 *
 * No FFmpeg header is included: the functions are pointers and the struct fields are
 * byte offsets, both handed in from Python, where treadle.video.ffmpeg checked them
 * against PyAV's own objects. Nothing here is new decode logic; every rule (which frames
 * are warm-up, which configurations convert directly) is decided in Python and passed
 * in as tables.
 *
 * The module is also a Python extension (an empty one) so that setuptools builds and
 * installs it with the package; Python never calls into it except through ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*send_fn)(void *, const void *);
typedef int (*recv_fn)(void *, void *);
typedef void (*void_fn)(void *);
typedef int (*props_fn)(void *, const void *);
typedef int (*scale_fn)(void *, void *, const void *);

#define TL_EAGAIN (-11)
#define TL_EOF (-0x20464F45)
#define TL_INVALIDDATA (-0x41444E49)
#define TL_MAX_CONFIGS 8

/* The structs below are mirrored by window_loop.py's ctypes structures: change both, and
 * TL_ABI, which window_loop.py checks when it loads this library. */
#define TL_ABI 1

/* Functions and checked field offsets (treadle.video.ffmpeg.Layout). */
typedef struct {
    send_fn send_packet;
    recv_fn receive_frame;
    void_fn flush_buffers;
    void_fn frame_unref;
    props_fn copy_props;
    scale_fn scale_frame;
    int64_t frame_width, frame_height, frame_format, frame_pts;
    int64_t frame_colorspace, frame_color_range, frame_color_trc, frame_color_primaries;
    int64_t packet_pts, packet_data, packet_size;
} tl_api;

/* One source configuration checked against reformat: its frames' (format, width,
 * height, colorspace, color_range), and the destination addresses mod 64 it was
 * checked at (bit k: address % 64 == k). */
typedef struct {
    int32_t format, width, height, colorspace, color_range, pad;
    uint64_t aligned;
} tl_config;

typedef struct {
    void *ctx, *pkt, *frame, *dst, *sws;
    const uint8_t *base;               /* the window's bytes */
    int64_t n_packets;
    const int64_t *offset, *size, *pts, *display; /* per packet, decode order */
    int64_t n_wanted;
    const int64_t *wanted_pts;         /* sorted, unique */
    const int64_t *wanted_slot;        /* the output position each converts into */
    uint8_t *taken;                    /* set here per wanted pts converted */
    uint8_t *out;                      /* output position 0 */
    int64_t step;                      /* bytes between output positions */
    int64_t out_width, out_height;     /* rgb24 */
    int64_t rgb24;                     /* AV_PIX_FMT_RGB24 */
    int64_t src_color_range;           /* 0: leave the frame's */
    int64_t src_colorspace;            /* AVColorSpace to set, or -1 */
    int64_t n_configs;
    tl_config configs[TL_MAX_CONFIGS];
    int32_t own_colorspace[32];        /* frame colorspace -> destination's, -1: keep */
    /* results */
    int64_t error, error_call, error_frame;
} tl_window;

enum { TL_OK = 0, TL_FALLBACK = 1, TL_ERROR = 2 };
enum { TL_CALL_SEND = 0, TL_CALL_RECEIVE = 1, TL_CALL_SCALE = 2 };

#define I32(p, off) (*(int32_t *)((uint8_t *)(p) + (off)))
#define I64(p, off) (*(int64_t *)((uint8_t *)(p) + (off)))
#define PTR(p, off) (*(const void **)((uint8_t *)(p) + (off)))

static int64_t find_wanted(const tl_window *w, int64_t pts) {
    int64_t lo = 0, hi = w->n_wanted;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (w->wanted_pts[mid] < pts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < w->n_wanted && w->wanted_pts[lo] == pts) ? lo : -1;
}

static int covered(const tl_api *a, const tl_window *w, const void *f, const uint8_t *to) {
    int32_t fmt = I32(f, a->frame_format), wd = I32(f, a->frame_width);
    int32_t ht = I32(f, a->frame_height), cs = I32(f, a->frame_colorspace);
    int32_t cr = I32(f, a->frame_color_range);
    unsigned bit = (unsigned)((uintptr_t)to % 64);
    for (int64_t i = 0; i < w->n_configs; i++) {
        const tl_config *c = &w->configs[i];
        if (c->format == fmt && c->width == wd && c->height == ht && c->colorspace == cs &&
            c->color_range == cr)
            return (int)((c->aligned >> bit) & 1u);
    }
    return 0;
}

/* treadle.video.sws.DirectScaler.scale, field for field */
static int scale(const tl_api *a, const tl_window *w, void *src, uint8_t *to) {
    void *d = w->dst;
    int32_t cs = I32(src, a->frame_colorspace);
    int32_t own = (cs >= 0 && cs < 32) ? w->own_colorspace[cs] : -1;
    a->frame_unref(d);
    a->copy_props(d, src);
    I32(src, a->frame_color_trc) = I32(src, a->frame_color_primaries) = 2;
    if (w->src_color_range)
        I32(src, a->frame_color_range) = (int32_t)w->src_color_range;
    if (w->src_colorspace >= 0)
        I32(src, a->frame_colorspace) = (int32_t)w->src_colorspace;
    I32(d, a->frame_format) = (int32_t)w->rgb24;
    I32(d, a->frame_width) = (int32_t)w->out_width;
    I32(d, a->frame_height) = (int32_t)w->out_height;
    PTR(d, 0) = to;               /* data[0] */
    I32(d, 64) = (int32_t)(w->out_width * 3); /* linesize[0] */
    I32(d, a->frame_color_trc) = I32(d, a->frame_color_primaries) = 2;
    if (own >= 0)
        I32(d, a->frame_colorspace) = own;
    return a->scale_frame(w->sws, d, src);
}

static int fail(tl_window *w, int code, int call, int64_t frame) {
    w->error = code;
    w->error_call = call;
    w->error_frame = frame;
    return TL_ERROR;
}

static int receive(const tl_api *a, tl_window *w, int64_t current) {
    int got = 0;
    for (;;) {
        int r = a->receive_frame(w->ctx, w->frame);
        if (r == TL_EAGAIN || r == TL_EOF)
            return TL_OK;
        if (r < 0) {
            if (r == TL_INVALIDDATA && got)
                return TL_OK; /* as PyAV: the frames of this packet so far stand */
            return fail(w, r, TL_CALL_RECEIVE, current);
        }
        got++;
        int64_t k = find_wanted(w, I64(w->frame, a->frame_pts));
        if (k < 0 || w->taken[k]) {
            a->frame_unref(w->frame); /* warm-up */
            continue;
        }
        uint8_t *to = w->out + w->wanted_slot[k] * w->step;
        if (!covered(a, w, w->frame, to)) {
            a->frame_unref(w->frame);
            return TL_FALLBACK;
        }
        r = scale(a, w, w->frame, to);
        a->frame_unref(w->frame);
        if (r < 0)
            return fail(w, r, TL_CALL_SCALE, current);
        w->taken[k] = 1;
    }
}

/* Decode and convert one window; TL_OK, TL_FALLBACK (a frame not covered: nothing of it
 * written, the context mid-window) or TL_ERROR (error, error_call, error_frame set). */
int treadle_window_run(const tl_api *a, tl_window *w) {
    void *pkt = w->pkt;
    int64_t current = -1;
    for (int64_t i = 0; i < w->n_packets; i++) {
        current = w->display[i];
        PTR(pkt, a->packet_data) = w->base + w->offset[i];
        I32(pkt, a->packet_size) = (int32_t)w->size[i];
        I64(pkt, a->packet_pts) = w->pts[i];
        int r = a->send_packet(w->ctx, pkt);
        if (r < 0)
            return fail(w, r, TL_CALL_SEND, current);
        r = receive(a, w, current);
        if (r != TL_OK)
            return r;
    }
    int r = a->send_packet(w->ctx, NULL);
    if (r < 0)
        return fail(w, r, TL_CALL_SEND, -1);
    r = receive(a, w, -1);
    if (r != TL_OK)
        return r;
    a->flush_buffers(w->ctx);
    return TL_OK;
}

int64_t treadle_window_abi(void) { return TL_ABI; }

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_window_loop",
    .m_doc = "treadle's compiled window loop (called through ctypes: see window_loop.py)",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__window_loop(void) { return PyModule_Create(&module); }
