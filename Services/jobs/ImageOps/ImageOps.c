#include "ImageOps.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <vips/vips.h>

static int fail(char *error, size_t error_size) {
    if (error && error_size > 0) {
        const char *message = vips_error_buffer();
        strncpy(error, message && *message ? message : "libvips failed", error_size - 1);
        error[error_size - 1] = '\0';
    }
    vips_error_clear();
    return -1;
}

/* VIPS_INIT is not safe to call from two threads at once: the second returns while the first
 * is still registering libvips' operations, and its caller's next call finds no such operation.
 * So the first caller starts libvips under a lock, and every other waits for it. */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int started = 0, start_result = 0;

int imageops_start(const char *program, int threads) {
    pthread_mutex_lock(&start_lock);
    if (!started) {
        started = 1;
        start_result = VIPS_INIT(program) != 0 ? -1 : 0;
        if (start_result == 0) {
            vips_concurrency_set(threads > 0 ? threads : 1);
            vips_cache_set_max(0);
        }
    }
    int result = start_result;
    pthread_mutex_unlock(&start_lock);
    return result;
}

int imageops_apply(const char *input, const char *output, const char *effect, double amount, char *error, size_t error_size) {
    VipsImage *in = vips_image_new_from_file(input, "access", VIPS_ACCESS_SEQUENTIAL, NULL);
    if (!in) return fail(error, error_size);
    VipsImage *out = NULL;
    int rc;
    if (strcmp(effect, "grayscale") == 0) {
        rc = vips_colourspace(in, &out, VIPS_INTERPRETATION_B_W, NULL);
    } else if (strcmp(effect, "blur") == 0) {
        rc = vips_gaussblur(in, &out, amount, NULL);
    } else if (strcmp(effect, "sharpen") == 0) {
        rc = vips_sharpen(in, &out, "sigma", amount, NULL);
    } else if (strcmp(effect, "upscale") == 0) {
        rc = vips_resize(in, &out, amount, NULL);
    } else {
        g_object_unref(in);
        if (error && error_size > 0) snprintf(error, error_size, "unknown effect %s", effect);
        return -1;
    }
    if (rc != 0) {
        g_object_unref(in);
        return fail(error, error_size);
    }
    rc = vips_image_write_to_file(out, output, NULL);
    g_object_unref(out);
    g_object_unref(in);
    return rc == 0 ? 0 : fail(error, error_size);
}

int imageops_enhance(const char *input, const char *output, double fidelity, double scale, char *error, size_t error_size) {
    /* Random access: equalisation reads the image twice (its histogram, then the mapping). */
    VipsImage *base = vips_image_new_from_file(input, NULL);
    if (!base) return fail(error, error_size);
    VipsObject *scope = VIPS_OBJECT(vips_image_new());
    VipsImage **t = (VipsImage **) vips_object_local_array(scope, 6);
    int rc = 0;
    VipsImage *current = base;
    if (vips_image_get_format(base) != VIPS_FORMAT_UCHAR) {
        rc = vips_cast_uchar(base, &t[0], NULL);
        current = t[0];
    }
    /* The enhanced image blended over the original: out = (1 - f) * original + f * enhanced. */
    if (rc == 0) rc = vips_hist_equal(current, &t[1], NULL);
    if (rc == 0 && fidelity < 1.0) {
        rc = vips_linear1(current, &t[2], 1.0 - fidelity, 0.0, NULL)
            || vips_linear1(t[1], &t[3], fidelity, 0.0, NULL)
            || vips_add(t[2], t[3], &t[4], NULL)
            || vips_cast_uchar(t[4], &t[5], NULL);
        if (rc == 0) current = t[5];
    } else if (rc == 0) {
        current = t[1];
    }
    VipsImage *scaled = NULL;
    if (rc == 0 && scale != 1.0) {
        rc = vips_resize(current, &scaled, scale, NULL);
        if (rc == 0) current = scaled;
    }
    if (rc == 0) rc = vips_image_write_to_file(current, output, NULL);
    if (scaled) g_object_unref(scaled);
    g_object_unref(scope);
    g_object_unref(base);
    return rc == 0 ? 0 : fail(error, error_size);
}

/* Whether the file at `path` starts as a JPEG does (FF D8 FF). */
static int starts_as_jpeg(const char *path) {
    unsigned char head[3] = {0, 0, 0};
    FILE *file = fopen(path, "rb");
    if (!file) return 0;
    size_t read = fread(head, 1, sizeof head, file);
    fclose(file);
    return read == sizeof head && head[0] == 0xFF && head[1] == 0xD8 && head[2] == 0xFF;
}

int imageops_thumbnail(const char *input, const char *output, int size, char *error, size_t error_size) {
    /* A JPEG is read into memory for the quicker path (the pixel limit was checked before);
     * any other image is left to libvips unread. */
    gchar *contents = NULL;
    gsize length = 0;
    if (starts_as_jpeg(input) && g_file_get_contents(input, &contents, &length, NULL)) {
        void *thumbnail = NULL;
        size_t thumbnail_length = 0;
        int made = imageops_thumbnail_jpeg(contents, length, size, &thumbnail, &thumbnail_length);
        g_free(contents);
        if (made == 0) {
            gboolean written = g_file_set_contents(output, thumbnail, (gssize) thumbnail_length, NULL);
            g_free(thumbnail);
            if (written) return 0;
        }
    }
    VipsImage *out = NULL;
    if (vips_thumbnail(input, &out, size, "height", size, "crop", VIPS_INTERESTING_CENTRE, NULL) != 0) {
        return fail(error, error_size);
    }
    int rc = vips_image_write_to_file(out, output, NULL);
    g_object_unref(out);
    return rc == 0 ? 0 : fail(error, error_size);
}

int imageops_probe(const char *path, int *width, int *height, char *error, size_t error_size) {
    VipsImage *image = vips_image_new_from_file(path, NULL);
    if (!image) return fail(error, error_size);
    *width = vips_image_get_width(image);
    *height = vips_image_get_height(image);
    g_object_unref(image);
    return 0;
}

int imageops_probe_buffer(const void *data, size_t length, int *width, int *height, char *error, size_t error_size) {
    VipsImage *image = vips_image_new_from_buffer(data, length, "", NULL);
    if (!image) return fail(error, error_size);
    *width = vips_image_get_width(image);
    *height = vips_image_get_height(image);
    g_object_unref(image);
    return 0;
}

int imageops_thumbnail_buffer(const void *data, size_t length, int size, void **out, size_t *out_length, char *error, size_t error_size) {
    if (imageops_thumbnail_jpeg(data, length, size, out, out_length) == 0) return 0;
    return imageops_thumbnail_buffer_vips(data, length, size, out, out_length, error, error_size);
}

int imageops_thumbnail_buffer_vips(const void *data, size_t length, int size, void **out, size_t *out_length, char *error, size_t error_size) {
    VipsImage *thumbnail = NULL;
    if (vips_thumbnail_buffer((void *) data, length, &thumbnail, size, "height", size, "crop", VIPS_INTERESTING_CENTRE, NULL) != 0) {
        return fail(error, error_size);
    }
    int rc = vips_jpegsave_buffer(thumbnail, out, out_length, NULL);
    g_object_unref(thumbnail);
    return rc == 0 ? 0 : fail(error, error_size);
}

int imageops_jpeg_buffer(const void *data, size_t length, void **out, size_t *out_length, char *error, size_t error_size) {
    VipsImage *image = vips_image_new_from_buffer(data, length, "", "access", VIPS_ACCESS_SEQUENTIAL, NULL);
    if (!image) return fail(error, error_size);
    int rc = vips_jpegsave_buffer(image, out, out_length, NULL);
    g_object_unref(image);
    return rc == 0 ? 0 : fail(error, error_size);
}

int imageops_mean_difference(const void *a, size_t a_length, const void *b, size_t b_length, double *difference, char *error, size_t error_size) {
    VipsObject *scope = VIPS_OBJECT(vips_image_new());
    VipsImage **t = (VipsImage **) vips_object_local_array(scope, 5);
    int rc = !(t[0] = vips_image_new_from_buffer(a, a_length, "", NULL)) || !(t[1] = vips_image_new_from_buffer(b, b_length, "", NULL));
    if (rc == 0 && (t[0]->Xsize != t[1]->Xsize || t[0]->Ysize != t[1]->Ysize || t[0]->Bands != t[1]->Bands)) {
        g_object_unref(scope);
        if (error && error_size > 0) snprintf(error, error_size, "the images differ in size or bands");
        return -1;
    }
    if (rc == 0) rc = vips_subtract(t[0], t[1], &t[2], NULL) || vips_abs(t[2], &t[3], NULL) || vips_avg(t[3], difference, NULL);
    g_object_unref(scope);
    return rc == 0 ? 0 : fail(error, error_size);
}

void imageops_free(void *pointer) {
    g_free(pointer);
}
