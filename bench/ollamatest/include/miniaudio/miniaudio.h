/*
 * Stand-in for miniaudio.h (https://miniaud.io), used only to build Ollama
 * from the Go module proxy in gpuhost's integration tests.
 *
 * The module zip of github.com/ollama/ollama leaves out llama.cpp's vendor/
 * folder, and Debian 12 packages no miniaudio. The only user,
 * llama.cpp/tools/mtmd/mtmd-helper.cpp, decodes audio input for multimodal
 * models; this header declares exactly the types and functions it calls,
 * and every function fails (MA_ERROR). Audio input therefore always fails
 * in a binary built with it, which the tests never use. Text generation is
 * untouched.
 */
#ifndef GPUHOST_MINIAUDIO_STANDIN_H
#define GPUHOST_MINIAUDIO_STANDIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef unsigned long long ma_uint64;
typedef unsigned int ma_uint32;
typedef int ma_result;

#define MA_SUCCESS 0
#define MA_ERROR (-1)

typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef enum { ma_encoding_format_unknown = 0, ma_encoding_format_wav } ma_encoding_format;

typedef struct {
    ma_format format;
    ma_uint32 channels;
    ma_uint32 sampleRate;
} ma_decoder_config;

typedef struct {
    ma_decoder_config config;
} ma_decoder;

typedef struct {
    ma_encoding_format encodingFormat;
    ma_format format;
    ma_uint32 channels;
    ma_uint32 sampleRate;
} ma_encoder_config;

typedef struct {
    ma_encoder_config config;
} ma_encoder;

static inline ma_decoder_config ma_decoder_config_init(ma_format format, ma_uint32 channels, ma_uint32 sampleRate) {
    ma_decoder_config c;
    c.format = format;
    c.channels = channels;
    c.sampleRate = sampleRate;
    return c;
}

static inline ma_result ma_decoder_init_memory(const void *data, size_t size, const ma_decoder_config *config, ma_decoder *decoder) {
    (void)data; (void)size; (void)config; (void)decoder;
    return MA_ERROR;
}

static inline ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *decoder, ma_uint64 *length) {
    (void)decoder;
    if (length) *length = 0;
    return MA_ERROR;
}

static inline ma_result ma_decoder_read_pcm_frames(ma_decoder *decoder, void *frames, ma_uint64 count, ma_uint64 *read) {
    (void)decoder; (void)frames; (void)count;
    if (read) *read = 0;
    return MA_ERROR;
}

static inline ma_result ma_decoder_uninit(ma_decoder *decoder) {
    (void)decoder;
    return MA_SUCCESS;
}

static inline ma_encoder_config ma_encoder_config_init(ma_encoding_format encodingFormat, ma_format format, ma_uint32 channels, ma_uint32 sampleRate) {
    ma_encoder_config c;
    c.encodingFormat = encodingFormat;
    c.format = format;
    c.channels = channels;
    c.sampleRate = sampleRate;
    return c;
}

static inline ma_result ma_encoder_init_file(const char *path, const ma_encoder_config *config, ma_encoder *encoder) {
    (void)path; (void)config; (void)encoder;
    return MA_ERROR;
}

static inline ma_result ma_encoder_write_pcm_frames(ma_encoder *encoder, const void *frames, ma_uint64 count, ma_uint64 *written) {
    (void)encoder; (void)frames; (void)count;
    if (written) *written = 0;
    return MA_ERROR;
}

static inline void ma_encoder_uninit(ma_encoder *encoder) { (void)encoder; }

#ifdef __cplusplus
}
#endif

#endif /* GPUHOST_MINIAUDIO_STANDIN_H */
