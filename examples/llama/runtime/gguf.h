/* gguf.h — a bounds-checked reader of GGUF model files (versions 2 and 3).
 *
 * The whole file is read into memory and parsed once: header, metadata
 * key/values (every value type, arrays included, nested arrays too), tensor
 * infos and the aligned data section. Every length, count, offset and size
 * is checked against the file size, with overflow checks, so a corrupt or
 * truncated file yields an error message naming what is wrong, never an
 * over-read. Tensor data can be converted to f32 from F32 or F16 only.
 *
 * Errors: functions returning int return 0 on success and -1 on failure,
 * with a NUL-terminated message in err (err_size bytes; err may be NULL). */
#ifndef FLASHSPEC_LLAMA_GGUF_H
#define FLASHSPEC_LLAMA_GGUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Metadata value types of the GGUF specification. */
enum gguf_value_type {
  GGUF_TYPE_UINT8 = 0,
  GGUF_TYPE_INT8 = 1,
  GGUF_TYPE_UINT16 = 2,
  GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4,
  GGUF_TYPE_INT32 = 5,
  GGUF_TYPE_FLOAT32 = 6,
  GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8,
  GGUF_TYPE_ARRAY = 9,
  GGUF_TYPE_UINT64 = 10,
  GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12
};

/* The tensor types this reader converts (ggml's numbering); others are refused. */
enum gguf_tensor_type { GGUF_TENSOR_F32 = 0, GGUF_TENSOR_F16 = 1 };

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_STRING_LEN (1u << 20)  /* a longer key or string value is refused */
#define GGUF_MAX_ARRAY_DEPTH 8          /* nested arrays deeper than this are refused */
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_kv {
  const char* key; /* points into the file image; not NUL-terminated */
  uint64_t key_len;
  uint32_t type;   /* enum gguf_value_type */
  /* Scalars: the value, widened. */
  uint64_t u;      /* unsigned integer types and bool */
  int64_t i;       /* signed integer types */
  double f;        /* FLOAT32, FLOAT64 */
  /* STRING: the bytes (not NUL-terminated). */
  const char* str;
  uint64_t str_len;
  /* ARRAY: element type and count (elements are skipped, not decoded). */
  uint32_t array_type;
  uint64_t array_count;
} gguf_kv;

typedef struct gguf_tensor_info {
  const char* name; /* points into the file image; not NUL-terminated */
  uint64_t name_len;
  uint32_t n_dims;
  uint64_t dims[GGUF_MAX_DIMS]; /* ne[0] is the innermost (contiguous) dimension */
  uint32_t type;                /* ggml type */
  uint64_t offset;              /* relative to the data section */
  uint64_t n_elements;
  uint64_t n_bytes;             /* for F32/F16; 0 for other types */
} gguf_tensor_info;

/* A name and its entry, for the sorted lookup indexes. */
typedef struct gguf_name_ref {
  const char* name;
  uint64_t len;
  uint64_t index;
} gguf_name_ref;

typedef struct gguf_file {
  unsigned char* image; /* the whole file */
  uint64_t size;
  uint32_t version;
  uint64_t n_kv;
  gguf_kv* kv;
  uint64_t n_tensors;
  gguf_tensor_info* tensors;
  uint64_t alignment;
  uint64_t data_offset; /* start of the data section in the image */
  /* Keys and tensor names sorted (by length, then bytes): duplicates are
   * found and lookups done in O(log n), so a file with many entries cannot
   * make loading quadratic. */
  gguf_name_ref* kv_index;
  gguf_name_ref* tensor_index;
} gguf_file;

/* Read and parse the file at path. On success *out owns the image. */
int gguf_open(const char* path, gguf_file** out, char* err, size_t err_size);
/* Parse a copy of size bytes at data (used by tests and fuzzing). */
int gguf_open_memory(const void* data, size_t size, gguf_file** out, char* err, size_t err_size);
/* NULL is a no-op. */
void gguf_close(gguf_file* file);

/* NULL when absent. */
const gguf_kv* gguf_find_kv(const gguf_file* file, const char* key);
const gguf_tensor_info* gguf_find_tensor(const gguf_file* file, const char* name);

/* Typed metadata reads: absent keys and values of another type are errors
 * naming the key. gguf_get_uint accepts any integer type with a value ≥ 0;
 * gguf_get_float accepts FLOAT32 and FLOAT64. The string is copied into
 * out (capacity out_size, NUL-terminated); a longer one is an error. */
int gguf_get_uint(const gguf_file* file, const char* key, uint64_t* out, char* err, size_t err_size);
int gguf_get_float(const gguf_file* file, const char* key, double* out, char* err, size_t err_size);
int gguf_get_string(const gguf_file* file, const char* key, char* out, size_t out_size, char* err, size_t err_size);

/* Convert a F32 or F16 tensor into out (capacity count floats, which must
 * equal the tensor's element count). */
int gguf_tensor_to_f32(const gguf_file* file, const gguf_tensor_info* tensor, float* out, uint64_t count,
                       char* err, size_t err_size);

/* IEEE half → float (exact). */
float gguf_half_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
