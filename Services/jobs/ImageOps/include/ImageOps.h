#ifndef IMAGEOPS_H
#define IMAGEOPS_H
#include <stddef.h>

/* Thin, non-variadic wrappers over the libvips calls the workers use (Swift cannot call C
 * variadic functions). Each returns 0 on success, or -1 with a message in `error`. */

/* Starts libvips once per process (the first call; safe from any thread); `threads` bounds its
 * worker threads. */
int imageops_start(const char *program, int threads);

/* Applies `effect` (grayscale, blur, sharpen, upscale) from `input` to `output`
 * (format from its extension); `amount` is sigma for blur and sharpen, the factor for upscale. */
int imageops_apply(const char *input, const char *output, const char *effect, double amount, char *error, size_t error_size);

/* Auto-enhance (histogram equalisation) blended over the original by `fidelity` (0: the
 * original, 1: fully enhanced), then resized by `scale`. */
int imageops_enhance(const char *input, const char *output, double fidelity, double scale, char *error, size_t error_size);

/* Writes a `size`x`size` centre-cropped JPEG thumbnail of `input` to `output`. */
int imageops_thumbnail(const char *input, const char *output, int size, char *error, size_t error_size);

/* Reads an image's width and height. */
int imageops_probe(const char *path, int *width, int *height, char *error, size_t error_size);

/* The same three on images in memory, for work that needs no file (a model's answer): the size
 * from the header; a `size`x`size` centre-cropped JPEG thumbnail; the image as JPEG. What
 * `out` points to is freed with `imageops_free`. */
int imageops_probe_buffer(const void *data, size_t length, int *width, int *height, char *error, size_t error_size);
int imageops_thumbnail_buffer(const void *data, size_t length, int size, void **out, size_t *out_length, char *error, size_t error_size);
int imageops_jpeg_buffer(const void *data, size_t length, void **out, size_t *out_length, char *error, size_t error_size);
void imageops_free(void *pointer);

/* The two ways the thumbnails above are made. A plain JPEG's (YCbCr or grayscale, no ICC
 * profile, at least `size` pixels on its shorter side) is made with libjpeg alone, 0 with a JPEG
 * in `out`; anything else answers IMAGEOPS_NOT_HANDLED (JPEGThumbnail.c says why). Every other
 * image, and any the first refuses, is made with libvips. */
enum { IMAGEOPS_NOT_HANDLED = 1 };
int imageops_thumbnail_jpeg(const void *data, size_t length, int size, void **out, size_t *out_length);
int imageops_thumbnail_buffer_vips(const void *data, size_t length, int size, void **out, size_t *out_length, char *error, size_t error_size);

/* The mean absolute difference of two images of the same size, per pixel and band (0 to 255). */
int imageops_mean_difference(const void *a, size_t a_length, const void *b, size_t b_length, double *difference, char *error, size_t error_size);

#endif
