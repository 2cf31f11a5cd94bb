/* tokenizer.h — a C API over SentencePiece (Debian libsentencepiece-dev):
 * load a tokenizer.model, encode text to ids, decode ids to text, look up
 * pieces. Errors are return values (0 success, -1 failure) with a message in
 * err; no C++ exception crosses this API. */
#ifndef FLASHSPEC_LLAMA_TOKENIZER_H
#define FLASHSPEC_LLAMA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llama_tokenizer llama_tokenizer;

int llama_tokenizer_load(const char* path, llama_tokenizer** out, char* err, size_t err_size);
void llama_tokenizer_free(llama_tokenizer* tokenizer); /* NULL is a no-op */
int32_t llama_tokenizer_vocab_size(const llama_tokenizer* tokenizer);
int32_t llama_tokenizer_bos(const llama_tokenizer* tokenizer); /* -1 if none */
int32_t llama_tokenizer_eos(const llama_tokenizer* tokenizer); /* -1 if none */

/* Encode text (length bytes) without bos/eos into ids (capacity entries);
 * *count gets the number of ids. More ids than capacity is an error that
 * still sets *count to the number needed. */
int llama_tokenizer_encode(const llama_tokenizer* tokenizer, const char* text, size_t length, int32_t* ids,
                           int32_t capacity, int32_t* count, char* err, size_t err_size);
/* Decode ids into text: a newly malloc'ed NUL-terminated string in *text
 * (free() it), its length in *length (optional). */
int llama_tokenizer_decode(const llama_tokenizer* tokenizer, const int32_t* ids, int32_t count, char** text,
                           size_t* length, char* err, size_t err_size);
/* The piece of id (copied, NUL-terminated, into out of out_size bytes). */
int llama_tokenizer_piece(const llama_tokenizer* tokenizer, int32_t id, char* out, size_t out_size, char* err,
                          size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
