#include "ImageOps.h"
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

/* A JPEG's thumbnail without libvips, for the common case: libvips builds a pipeline of
 * operations and threads for each image, a fixed cost of about 5 ms per thumbnail on the machine
 * this was measured on (a 640x480 photo; the decoding and resampling themselves are a tenth of
 * that), which made thumbnails the largest share of an image model's job. Here libjpeg decodes
 * the centre square alone at the smallest of its DCT scales (n/8) that still covers `size`
 * pixels (libjpeg-turbo's jpeg_crop_scanline and jpeg_skip_scanlines), the square is
 * averaged down to `size` x `size` (each output pixel the exact area it covers), the EXIF
 * orientation is applied, and libjpeg encodes at quality 75 (libvips' default).
 *
 * Only plain images take this path: YCbCr or grayscale, no embedded ICC profile (libvips would
 * convert those to sRGB), and at least `size` pixels on the shorter side (libvips enlarges). For
 * anything else, and for any libjpeg error, this answers IMAGEOPS_NOT_HANDLED and the caller uses
 * libvips, which gives its own error for a broken file. */

enum { QUALITY = 75, FIX = 14 };

struct failure {
    struct jpeg_error_mgr manager;
    jmp_buf jump;
};

static void on_error(j_common_ptr info) {
    longjmp(((struct failure *) info->err)->jump, 1);
}

/* Corrupt-data warnings are not printed (libjpeg's default writes them to stderr). */
static void on_message(j_common_ptr info, int level) {
    (void) info;
    (void) level;
}

static unsigned read16(const unsigned char *p, int little) {
    return little ? (unsigned) (p[0] | p[1] << 8) : (unsigned) (p[0] << 8 | p[1]);
}

static unsigned long read32(const unsigned char *p, int little) {
    return little ? (unsigned long) p[0] | (unsigned long) p[1] << 8 | (unsigned long) p[2] << 16 | (unsigned long) p[3] << 24
                  : (unsigned long) p[0] << 24 | (unsigned long) p[1] << 16 | (unsigned long) p[2] << 8 | (unsigned long) p[3];
}

/* The orientation tag (0x0112) of IFD0 in an APP1 Exif segment, 1 if absent or unreadable. */
static int exif_orientation(const unsigned char *data, unsigned length) {
    if (length < 14 || memcmp(data, "Exif\0\0", 6) != 0) return 1;
    const unsigned char *tiff = data + 6;
    unsigned long size = length - 6;
    int little;
    if (tiff[0] == 'I' && tiff[1] == 'I') little = 1;
    else if (tiff[0] == 'M' && tiff[1] == 'M') little = 0;
    else return 1;
    unsigned long ifd = read32(tiff + 4, little);
    if (ifd > size - 2) return 1;
    unsigned count = read16(tiff + ifd, little);
    for (unsigned i = 0; i < count; i++) {
        unsigned long entry = ifd + 2 + 12ul * i;
        if (entry + 12 > size) return 1;
        if (read16(tiff + entry, little) == 0x0112 && read16(tiff + entry + 2, little) == 3) {
            unsigned value = read16(tiff + entry + 8, little);
            return value >= 1 && value <= 8 ? (int) value : 1;
        }
    }
    return 1;
}

/* Weights for averaging `from` samples down to `to`: output i covers [i * from / to,
 * (i + 1) * from / to) of the input; `first[i]` is its first sample, `count[i]` how many, and
 * `weight[i * span + k]` the share of sample first[i] + k, in 1/2^FIX, summing to 2^FIX. */
struct weights {
    int span;
    int *first, *count, *weight;
};

static int make_weights(struct weights *w, int from, int to) {
    double scale = (double) from / to;
    w->span = (int) scale + 2;
    w->first = malloc(sizeof(int) * (size_t) to);
    w->count = malloc(sizeof(int) * (size_t) to);
    /* Zeroed: an output covering fewer than `span` samples has weight 0 for the rest, so that
     * the pass across can take `span` samples for every output (see `average_across`). */
    w->weight = calloc((size_t) to * (size_t) w->span, sizeof(int));
    if (!w->first || !w->count || !w->weight) return -1;
    for (int i = 0; i < to; i++) {
        double start = i * scale, end = (i + 1) * scale;
        int first = (int) start, total = 0, k = 0;
        double shares[w->span];
        for (int s = first; s < end && s < from && k < w->span; s++, k++) {
            double low = s > start ? s : start, high = s + 1 < end ? s + 1 : end;
            shares[k] = (high - low) / scale;
        }
        w->first[i] = first;
        w->count[i] = k;
        for (int j = 0; j < k; j++) {
            w->weight[i * w->span + j] = (int) (shares[j] * (1 << FIX) + 0.5);
            total += w->weight[i * w->span + j];
        }
        /* Rounding leftovers go to the largest share, so a flat area stays exactly flat. */
        int largest = 0;
        for (int j = 1; j < k; j++) if (shares[j] > shares[largest]) largest = j;
        w->weight[i * w->span + largest] += (1 << FIX) - total;
    }
    return 0;
}

static void free_weights(struct weights *w) {
    free(w->first);
    free(w->count);
    free(w->weight);
}

/* One decoded row averaged across to `size` outputs, 8 bits of fraction kept (at most 255 << 8:
 * the weights sum to 1 << FIX). Every output takes `taps` samples (`across.span`; the weights
 * past an output's own samples are 0, and the row is padded so that reading them is safe): a
 * trip count that is the same for every output, known to the compiler in the common cases,
 * instead of each output's own count, whose mispredicted branches cost more than the sums. */
static inline __attribute__((always_inline)) void average_across(const unsigned char *pixels, const struct weights *across, int size, int bands, int taps,
                                                                 unsigned short *averaged) {
    for (int x = 0; x < size; x++) {
        const unsigned char *source = pixels + (size_t) across->first[x] * (size_t) bands;
        const int *weight = across->weight + x * taps;
        if (bands == 3) {
            unsigned r = 0, g = 0, b = 0;
            for (int k = 0; k < taps; k++, source += 3) {
                unsigned share = (unsigned) weight[k];
                r += source[0] * share;
                g += source[1] * share;
                b += source[2] * share;
            }
            averaged[3 * x] = (unsigned short) ((r + (1 << (FIX - 9))) >> (FIX - 8));
            averaged[3 * x + 1] = (unsigned short) ((g + (1 << (FIX - 9))) >> (FIX - 8));
            averaged[3 * x + 2] = (unsigned short) ((b + (1 << (FIX - 9))) >> (FIX - 8));
        } else {
            unsigned total = 0;
            for (int k = 0; k < taps; k++) total += source[k] * (unsigned) weight[k];
            averaged[x] = (unsigned short) ((total + (1 << (FIX - 9))) >> (FIX - 8));
        }
    }
}

/* Output pixel (x, y) of the displayed image, from the stored square `n` x `n` by EXIF orientation. */
static void source_of(int orientation, int n, int x, int y, int *sx, int *sy) {
    switch (orientation) {
    case 2: *sx = n - 1 - x; *sy = y; break;
    case 3: *sx = n - 1 - x; *sy = n - 1 - y; break;
    case 4: *sx = x; *sy = n - 1 - y; break;
    case 5: *sx = y; *sy = x; break;
    case 6: *sx = y; *sy = n - 1 - x; break;
    case 7: *sx = n - 1 - y; *sy = n - 1 - x; break;
    case 8: *sx = n - 1 - y; *sy = x; break;
    default: *sx = x; *sy = y; break;
    }
}

struct work {
    struct jpeg_decompress_struct decoder;
    struct jpeg_compress_struct encoder;
    int decoding, encoding;
    unsigned char *pixels, *square, *turned;
    unsigned short *rows;
    unsigned *sums;
    struct weights across, down;
    unsigned char *encoded;
    unsigned long encoded_length;
};

static void release(struct work *w) {
    if (w->decoding) jpeg_destroy_decompress(&w->decoder);
    if (w->encoding) jpeg_destroy_compress(&w->encoder);
    free(w->pixels);
    free(w->rows);
    free(w->sums);
    free(w->square);
    free(w->turned);
    free(w->encoded);
    free_weights(&w->across);
    free_weights(&w->down);
    free(w);
}

int imageops_thumbnail_jpeg(const void *data, size_t length, int size, void **out, size_t *out_length) {
    const unsigned char *bytes = data;
    if (size < 1 || length < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8 || bytes[2] != 0xFF) return IMAGEOPS_NOT_HANDLED;
    if (length > 0xFFFFFFFFul) return IMAGEOPS_NOT_HANDLED;
    /* On the heap, so that what is set in it after setjmp is still there after a longjmp. */
    struct work *const w = calloc(1, sizeof(struct work));
    if (!w) return IMAGEOPS_NOT_HANDLED;
    struct failure failure;
    w->decoder.err = jpeg_std_error(&failure.manager);
    failure.manager.error_exit = on_error;
    failure.manager.emit_message = on_message;
    if (setjmp(failure.jump)) {
        release(w);
        return IMAGEOPS_NOT_HANDLED;
    }
    jpeg_create_decompress(&w->decoder);
    w->decoding = 1;
    jpeg_mem_src(&w->decoder, bytes, (unsigned long) length);
    jpeg_save_markers(&w->decoder, JPEG_APP0 + 1, 0xFFFF);
    jpeg_save_markers(&w->decoder, JPEG_APP0 + 2, 0xFFFF);
    jpeg_read_header(&w->decoder, TRUE);
    int orientation = 1;
    for (jpeg_saved_marker_ptr marker = w->decoder.marker_list; marker; marker = marker->next) {
        if (marker->marker == JPEG_APP0 + 2 && marker->data_length >= 12 && memcmp(marker->data, "ICC_PROFILE", 12) == 0) {
            longjmp(failure.jump, 1);
        }
        if (marker->marker == JPEG_APP0 + 1) orientation = exif_orientation(marker->data, marker->data_length);
    }
    J_COLOR_SPACE space = w->decoder.jpeg_color_space;
    if (space != JCS_YCbCr && space != JCS_GRAYSCALE && space != JCS_RGB) longjmp(failure.jump, 1);
    unsigned shorter = w->decoder.image_width < w->decoder.image_height ? w->decoder.image_width : w->decoder.image_height;
    if (shorter < (unsigned) size) longjmp(failure.jump, 1);
    /* The smallest n/8 whose shorter side still has `size` pixels. */
    unsigned eighths = 8;
    while (eighths > 1 && (shorter * (eighths - 1) + 7) / 8 >= (unsigned) size) eighths--;
    w->decoder.scale_num = eighths;
    w->decoder.scale_denom = 8;
    /* A grayscale JPEG stays one band, as libvips keeps it. */
    int bands = space == JCS_GRAYSCALE ? 1 : 3;
    w->decoder.out_color_space = bands == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&w->decoder);
    int width = (int) w->decoder.output_width, height = (int) w->decoder.output_height;
    int side = width < height ? width : height;
    if (side < size) longjmp(failure.jump, 1);
    int left = (width - side) / 2, top = (height - side) / 2;
    /* Only the centre square is decoded: libjpeg widens the columns asked for to its blocks
     * (`left` then falls `offset` pixels into a decoded row) and skips the rows above. */
    JDIMENSION first_column = (JDIMENSION) left, columns = (JDIMENSION) side;
    jpeg_crop_scanline(&w->decoder, &first_column, &columns);
    int offset = left - (int) first_column;
    if ((int) columns < offset + side) longjmp(failure.jump, 1);
    if (jpeg_skip_scanlines(&w->decoder, (JDIMENSION) top) != (JDIMENSION) top) longjmp(failure.jump, 1);
    /* Each row is averaged across as it is decoded. */
    /* Padded by `span` pixels, zeroed: the last outputs read that far (with weight 0). */
    w->pixels = calloc(((size_t) columns + (size_t) side / (size_t) size + 2) * (size_t) bands, 1);
    w->rows = malloc(sizeof(unsigned short) * (size_t) side * (size_t) size * (size_t) bands);
    w->square = malloc((size_t) size * (size_t) size * (size_t) bands);
    w->sums = malloc(sizeof(unsigned) * (size_t) size * (size_t) bands);
    if (!w->pixels || !w->rows || !w->square || !w->sums || make_weights(&w->across, side, size) != 0 || make_weights(&w->down, side, size) != 0) {
        longjmp(failure.jump, 1);
    }
    while (w->decoder.output_scanline < (unsigned) (top + side)) {
        int y = (int) w->decoder.output_scanline;
        JSAMPROW row = w->pixels;
        if (jpeg_read_scanlines(&w->decoder, &row, 1) != 1) longjmp(failure.jump, 1);
        unsigned short *averaged = w->rows + (size_t) (y - top) * (size_t) size * (size_t) bands;
        const unsigned char *square_row = w->pixels + (size_t) offset * (size_t) bands;
        /* A shrink by less than 2 (every scale but the last, 1/8) takes 2 or 3 samples. */
        if (bands == 3 && w->across.span == 3) average_across(square_row, &w->across, size, 3, 3, averaged);
        else if (bands == 1 && w->across.span == 3) average_across(square_row, &w->across, size, 1, 3, averaged);
        else average_across(square_row, &w->across, size, bands, w->across.span, averaged);
    }
    /* The rows below the square are never read. */
    jpeg_abort_decompress(&w->decoder);
    for (int y = 0; y < size; y++) {
        const int *weight = w->down.weight + y * w->down.span;
        /* Row by row, so that the inner loop runs along memory. */
        size_t width = (size_t) size * (size_t) bands;
        unsigned *sums = w->sums;
        memset(sums, 0, sizeof(unsigned) * width);
        for (int k = 0; k < w->down.count[y]; k++) {
            const unsigned short *row = w->rows + (size_t) (w->down.first[y] + k) * width;
            unsigned share = (unsigned) weight[k];
            for (size_t c = 0; c < width; c++) sums[c] += row[c] * share;
        }
        unsigned char *target = w->square + (size_t) y * width;
        for (size_t c = 0; c < width; c++) {
            unsigned value = (sums[c] + (1u << (FIX + 7))) >> (FIX + 8);
            target[c] = (unsigned char) (value > 255 ? 255 : value);
        }
    }
    unsigned char *shown = w->square;
    if (orientation != 1) {
        w->turned = malloc((size_t) size * (size_t) size * (size_t) bands);
        if (!w->turned) longjmp(failure.jump, 1);
        for (int y = 0; y < size; y++) {
            for (int x = 0; x < size; x++) {
                int sx, sy;
                source_of(orientation, size, x, y, &sx, &sy);
                memcpy(w->turned + ((size_t) y * size + x) * bands, w->square + ((size_t) sy * size + sx) * bands, (size_t) bands);
            }
        }
        shown = w->turned;
    }
    w->encoder.err = &failure.manager;
    jpeg_create_compress(&w->encoder);
    w->encoding = 1;
    jpeg_mem_dest(&w->encoder, &w->encoded, &w->encoded_length);
    w->encoder.image_width = (JDIMENSION) size;
    w->encoder.image_height = (JDIMENSION) size;
    w->encoder.input_components = bands;
    w->encoder.in_color_space = bands == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&w->encoder);
    jpeg_set_quality(&w->encoder, QUALITY, TRUE);
    jpeg_start_compress(&w->encoder, TRUE);
    while (w->encoder.next_scanline < (unsigned) size) {
        JSAMPROW row = shown + (size_t) w->encoder.next_scanline * (size_t) size * (size_t) bands;
        jpeg_write_scanlines(&w->encoder, &row, 1);
    }
    jpeg_finish_compress(&w->encoder);
    *out = w->encoded;
    *out_length = w->encoded_length;
    w->encoded = NULL;
    release(w);
    return 0;
}
