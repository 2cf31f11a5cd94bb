/* gguf.c — see gguf.h.
 *
 * Written here rather than taken from a library: the reference reader is
 * ggml's (llama.cpp), and ggml is not packaged in Debian 12, nor is any
 * other C reader of GGUF. The format checked against is what the PyPI `gguf`
 * package's GGUFWriter writes (tests/make_fixtures.py). */
#include "gguf.h"
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* A cursor over the file image; every read checks what is left. */
typedef struct reader {
  const unsigned char* data;
  uint64_t size;
  uint64_t pos;
  char* err;
  size_t err_size;
} reader;

static int need(reader* r, uint64_t bytes, const char* what) {
  if (bytes > r->size - r->pos) {
    llama_set_error(r->err, r->err_size, "truncated file: %s needs %llu bytes at offset %llu, the file has %llu",
              what, (unsigned long long)bytes, (unsigned long long)r->pos, (unsigned long long)r->size);
    return -1;
  }
  return 0;
}

static int read_bytes(reader* r, void* out, uint64_t bytes, const char* what) {
  if (need(r, bytes, what) != 0) return -1;
  memcpy(out, r->data + r->pos, (size_t)bytes);
  r->pos += bytes;
  return 0;
}

/* GGUF is little-endian; so are the machines this runs on (checked in gguf_open_memory). */
static int read_u32(reader* r, uint32_t* out, const char* what) { return read_bytes(r, out, 4, what); }
static int read_u64(reader* r, uint64_t* out, const char* what) { return read_bytes(r, out, 8, what); }

static int read_string(reader* r, const char** out, uint64_t* len, const char* what) {
  uint64_t n;
  if (read_u64(r, &n, what) != 0) return -1;
  if (n > GGUF_MAX_STRING_LEN) {
    llama_set_error(r->err, r->err_size, "%s at offset %llu: length %llu exceeds the limit of %u bytes", what,
              (unsigned long long)(r->pos - 8), (unsigned long long)n, GGUF_MAX_STRING_LEN);
    return -1;
  }
  if (need(r, n, what) != 0) return -1;
  *out = (const char*)(r->data + r->pos);
  *len = n;
  r->pos += n;
  return 0;
}

static uint64_t scalar_size(uint32_t type) {
  switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
  }
}

/* Skip (or, for the top-level value, decode into kv) one value of type. */
static int read_value(reader* r, uint32_t type, gguf_kv* kv, int depth, const char* key) {
  const uint64_t width = scalar_size(type);
  if (width != 0) {
    unsigned char raw[8] = {0};
    if (read_bytes(r, raw, width, key) != 0) return -1;
    if (kv == NULL) return 0;
    switch (type) {
      case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: kv->u = raw[0]; break;
      case GGUF_TYPE_INT8: kv->i = (int8_t)raw[0]; break;
      case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, raw, 2); kv->u = v; break; }
      case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, raw, 2); kv->i = v; break; }
      case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, raw, 4); kv->u = v; break; }
      case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, raw, 4); kv->i = v; break; }
      case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, raw, 4); kv->f = v; break; }
      case GGUF_TYPE_UINT64: memcpy(&kv->u, raw, 8); break;
      case GGUF_TYPE_INT64: memcpy(&kv->i, raw, 8); break;
      case GGUF_TYPE_FLOAT64: memcpy(&kv->f, raw, 8); break;
    }
    return 0;
  }
  if (type == GGUF_TYPE_STRING) {
    const char* s;
    uint64_t len;
    if (read_string(r, &s, &len, key) != 0) return -1;
    if (kv != NULL) {
      kv->str = s;
      kv->str_len = len;
    }
    return 0;
  }
  if (type == GGUF_TYPE_ARRAY) {
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
      llama_set_error(r->err, r->err_size, "metadata '%s': arrays nested deeper than %d", key, GGUF_MAX_ARRAY_DEPTH);
      return -1;
    }
    uint32_t element_type;
    uint64_t count;
    if (read_u32(r, &element_type, key) != 0 || read_u64(r, &count, key) != 0) return -1;
    if (element_type > GGUF_TYPE_FLOAT64) {
      llama_set_error(r->err, r->err_size, "metadata '%s': unknown array element type %u", key, element_type);
      return -1;
    }
    if (kv != NULL) {
      kv->array_type = element_type;
      kv->array_count = count;
    }
    const uint64_t element_width = scalar_size(element_type);
    if (element_width != 0) {
      /* count * width must fit in what is left (division: no overflow). */
      if (count > (r->size - r->pos) / element_width) {
        llama_set_error(r->err, r->err_size, "metadata '%s': array of %llu elements runs past the end of the file",
                  key, (unsigned long long)count);
        return -1;
      }
      r->pos += count * element_width;
      return 0;
    }
    /* Strings and arrays: each element takes at least 8 bytes, which bounds
     * the loop by the file size. */
    if (count > (r->size - r->pos) / 8) {
      llama_set_error(r->err, r->err_size, "metadata '%s': array of %llu elements runs past the end of the file", key,
                (unsigned long long)count);
      return -1;
    }
    for (uint64_t e = 0; e < count; ++e)
      if (read_value(r, element_type, NULL, depth + 1, key) != 0) return -1;
    return 0;
  }
  llama_set_error(r->err, r->err_size, "metadata '%s': unknown value type %u", key, type);
  return -1;
}

static int compare_names(const void* a, const void* b) {
  const gguf_name_ref* x = (const gguf_name_ref*)a;
  const gguf_name_ref* y = (const gguf_name_ref*)b;
  if (x->len != y->len) return x->len < y->len ? -1 : 1;
  return x->len ? memcmp(x->name, y->name, (size_t)x->len) : 0;
}

/* Sorts index (count entries filled by the caller); -1 if a name repeats,
 * with *repeated set to it. */
static int sort_names(gguf_name_ref* index, uint64_t count, const gguf_name_ref** repeated) {
  qsort(index, (size_t)count, sizeof *index, compare_names);
  for (uint64_t i = 1; i < count; ++i)
    if (compare_names(&index[i - 1], &index[i]) == 0) {
      *repeated = &index[i];
      return -1;
    }
  return 0;
}

static const gguf_name_ref* find_name(const gguf_name_ref* index, uint64_t count, const char* name) {
  const gguf_name_ref key = {name, strlen(name), 0};
  return (const gguf_name_ref*)bsearch(&key, index, (size_t)count, sizeof *index, compare_names);
}

const gguf_kv* gguf_find_kv(const gguf_file* file, const char* key) {
  if (file == NULL || key == NULL || file->kv_index == NULL) return NULL;
  const gguf_name_ref* found = find_name(file->kv_index, file->n_kv, key);
  return found ? &file->kv[found->index] : NULL;
}

const gguf_tensor_info* gguf_find_tensor(const gguf_file* file, const char* name) {
  if (file == NULL || name == NULL || file->tensor_index == NULL) return NULL;
  const gguf_name_ref* found = find_name(file->tensor_index, file->n_tensors, name);
  return found ? &file->tensors[found->index] : NULL;
}

static int parse(gguf_file* f, char* err, size_t err_size) {
  reader r = {f->image, f->size, 0, err, err_size};
  uint32_t magic;
  if (read_u32(&r, &magic, "the magic number") != 0) return -1;
  if (memcmp(&magic, "GGUF", 4) != 0) {
    llama_set_error(err, err_size, "not a GGUF file: the magic number is not \"GGUF\"");
    return -1;
  }
  if (read_u32(&r, &f->version, "the version") != 0) return -1;
  if (f->version != 2 && f->version != 3) {
    llama_set_error(err, err_size, "unsupported GGUF version %u (versions 2 and 3 are read)", f->version);
    return -1;
  }
  if (read_u64(&r, &f->n_tensors, "the tensor count") != 0 || read_u64(&r, &f->n_kv, "the metadata count") != 0)
    return -1;
  /* A key/value takes at least 8 + 4 + 1 bytes and a tensor info 8 + 4 + 4 + 8:
   * larger counts cannot fit, and refusing them keeps the allocations bounded. */
  if (f->n_kv > (r.size - r.pos) / 13) {
    llama_set_error(err, err_size, "metadata count %llu cannot fit in a file of %llu bytes", (unsigned long long)f->n_kv,
              (unsigned long long)r.size);
    return -1;
  }
  if (f->n_tensors > (r.size - r.pos) / 24) {
    llama_set_error(err, err_size, "tensor count %llu cannot fit in a file of %llu bytes",
              (unsigned long long)f->n_tensors, (unsigned long long)r.size);
    return -1;
  }
  f->kv = (gguf_kv*)calloc(f->n_kv ? f->n_kv : 1, sizeof(gguf_kv));
  f->tensors = (gguf_tensor_info*)calloc(f->n_tensors ? f->n_tensors : 1, sizeof(gguf_tensor_info));
  gguf_name_ref* kv_index = (gguf_name_ref*)calloc(f->n_kv ? f->n_kv : 1, sizeof(gguf_name_ref));
  gguf_name_ref* tensor_index = (gguf_name_ref*)calloc(f->n_tensors ? f->n_tensors : 1, sizeof(gguf_name_ref));
  f->kv_index = kv_index; /* owned by f from here on (gguf_close frees them) */
  f->tensor_index = tensor_index;
  if (f->kv == NULL || f->tensors == NULL || kv_index == NULL || tensor_index == NULL) {
    llama_set_error(err, err_size, "out of memory for %llu metadata entries and %llu tensors",
              (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors);
    return -1;
  }

  for (uint64_t k = 0; k < f->n_kv; ++k) {
    gguf_kv* kv = &f->kv[k];
    if (read_string(&r, &kv->key, &kv->key_len, "a metadata key") != 0) return -1;
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(kv->key_len < 120 ? kv->key_len : 120), kv->key);
    if (read_u32(&r, &kv->type, key) != 0) return -1;
    if (read_value(&r, kv->type, kv, 0, key) != 0) return -1;
    kv_index[k] = (gguf_name_ref){kv->key, kv->key_len, k};
  }
  const gguf_name_ref* repeated = NULL;
  if (sort_names(kv_index, f->n_kv, &repeated) != 0) {
    llama_set_error(err, err_size, "metadata key '%.*s' appears twice", (int)(repeated->len < 120 ? repeated->len : 120),
              repeated->name);
    return -1;
  }

  f->alignment = GGUF_DEFAULT_ALIGNMENT;
  const gguf_kv* alignment = gguf_find_kv(f, "general.alignment");
  if (alignment != NULL) {
    if (alignment->type != GGUF_TYPE_UINT32 || alignment->u == 0 || (alignment->u & (alignment->u - 1)) != 0 ||
        alignment->u > (1u << 20)) {
      llama_set_error(err, err_size, "general.alignment must be a uint32 power of two up to 2^20");
      return -1;
    }
    f->alignment = alignment->u;
  }

  for (uint64_t t = 0; t < f->n_tensors; ++t) {
    gguf_tensor_info* ti = &f->tensors[t];
    if (read_string(&r, &ti->name, &ti->name_len, "a tensor name") != 0) return -1;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(ti->name_len < 120 ? ti->name_len : 120), ti->name);
    tensor_index[t] = (gguf_name_ref){ti->name, ti->name_len, t};
    if (read_u32(&r, &ti->n_dims, name) != 0) return -1;
    if (ti->n_dims == 0 || ti->n_dims > GGUF_MAX_DIMS) {
      llama_set_error(err, err_size, "tensor '%s': %u dimensions (1 to %d are allowed)", name, ti->n_dims, GGUF_MAX_DIMS);
      return -1;
    }
    ti->n_elements = 1;
    for (uint32_t d = 0; d < ti->n_dims; ++d) {
      if (read_u64(&r, &ti->dims[d], name) != 0) return -1;
      if (ti->dims[d] == 0 || ti->dims[d] > (UINT64_MAX / 4) / ti->n_elements) {
        llama_set_error(err, err_size, "tensor '%s': dimension %u is %llu (zero, or the size overflows)", name, d,
                  (unsigned long long)ti->dims[d]);
        return -1;
      }
      ti->n_elements *= ti->dims[d];
    }
    for (uint32_t d = ti->n_dims; d < GGUF_MAX_DIMS; ++d) ti->dims[d] = 1;
    if (read_u32(&r, &ti->type, name) != 0 || read_u64(&r, &ti->offset, name) != 0) return -1;
    /* Sizes are known for the types converted; a tensor of another type is
     * parsed (so the file opens) and refused when converted. */
    ti->n_bytes = ti->type == GGUF_TENSOR_F32 ? ti->n_elements * 4 : ti->type == GGUF_TENSOR_F16 ? ti->n_elements * 2 : 0;
    if (ti->offset % f->alignment != 0) {
      llama_set_error(err, err_size, "tensor '%s': data offset %llu is not a multiple of the alignment %llu", name,
                (unsigned long long)ti->offset, (unsigned long long)f->alignment);
      return -1;
    }
  }

  if (sort_names(tensor_index, f->n_tensors, &repeated) != 0) {
    llama_set_error(err, err_size, "tensor '%.*s' appears twice", (int)(repeated->len < 120 ? repeated->len : 120),
              repeated->name);
    return -1;
  }

  /* The data section starts at the next multiple of the alignment. */
  const uint64_t padding = (f->alignment - r.pos % f->alignment) % f->alignment;
  if (padding > r.size - r.pos) {
    llama_set_error(err, err_size, "truncated file: the data section would start at offset %llu, past the end (%llu bytes)",
              (unsigned long long)(r.pos + padding), (unsigned long long)r.size);
    return -1;
  }
  f->data_offset = r.pos + padding;
  const uint64_t data_size = r.size - f->data_offset;
  for (uint64_t t = 0; t < f->n_tensors; ++t) {
    const gguf_tensor_info* ti = &f->tensors[t];
    if (ti->offset > data_size || ti->n_bytes > data_size - ti->offset) {
      llama_set_error(err, err_size,
                "tensor '%.*s': data [%llu, +%llu bytes) runs past the end of the data section (%llu bytes); "
                "the file is truncated or corrupt",
                (int)(ti->name_len < 120 ? ti->name_len : 120), ti->name, (unsigned long long)ti->offset,
                (unsigned long long)ti->n_bytes, (unsigned long long)data_size);
      return -1;
    }
  }
  return 0;
}

int gguf_open_memory(const void* data, size_t size, gguf_file** out, char* err, size_t err_size) {
  if (out == NULL || (data == NULL && size != 0)) {
    llama_set_error(err, err_size, "gguf_open_memory: %s is NULL", out == NULL ? "out" : "data");
    return -1;
  }
  const uint32_t one = 1;
  if (*(const unsigned char*)&one != 1) {
    llama_set_error(err, err_size, "this reader needs a little-endian machine");
    return -1;
  }
  gguf_file* f = (gguf_file*)calloc(1, sizeof(gguf_file));
  if (f == NULL) {
    llama_set_error(err, err_size, "out of memory");
    return -1;
  }
  f->image = (unsigned char*)malloc(size ? size : 1);
  if (f->image == NULL) {
    free(f);
    llama_set_error(err, err_size, "out of memory for a file of %llu bytes", (unsigned long long)size);
    return -1;
  }
  if (size) memcpy(f->image, data, size);
  f->size = size;
  if (parse(f, err, err_size) != 0) {
    gguf_close(f);
    return -1;
  }
  *out = f;
  return 0;
}

int gguf_open(const char* path, gguf_file** out, char* err, size_t err_size) {
  if (path == NULL || out == NULL) {
    llama_set_error(err, err_size, "gguf_open: %s is NULL", path == NULL ? "path" : "out");
    return -1;
  }
  FILE* file = fopen(path, "rb");
  if (file == NULL) {
    llama_set_error(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  long size = -1;
  if (fseek(file, 0, SEEK_END) == 0) size = ftell(file);
  if (size < 0 || fseek(file, 0, SEEK_SET) != 0) {
    llama_set_error(err, err_size, "%s: cannot determine the file size", path);
    fclose(file);
    return -1;
  }
  unsigned char* image = (unsigned char*)malloc(size ? (size_t)size : 1);
  if (image == NULL) {
    llama_set_error(err, err_size, "%s: out of memory for %ld bytes", path, size);
    fclose(file);
    return -1;
  }
  const size_t got = fread(image, 1, (size_t)size, file);
  fclose(file);
  if (got != (size_t)size) {
    llama_set_error(err, err_size, "%s: read %zu of %ld bytes", path, got, size);
    free(image);
    return -1;
  }
  char detail[384] = "";
  gguf_file* f = (gguf_file*)calloc(1, sizeof(gguf_file));
  if (f == NULL) {
    free(image);
    llama_set_error(err, err_size, "%s: out of memory", path);
    return -1;
  }
  f->image = image;
  f->size = (uint64_t)size;
  if (parse(f, detail, sizeof detail) != 0) {
    llama_set_error(err, err_size, "%s: %s", path, detail);
    gguf_close(f);
    return -1;
  }
  *out = f;
  return 0;
}

void gguf_close(gguf_file* file) {
  if (file == NULL) return;
  free(file->image);
  free(file->kv);
  free(file->tensors);
  free(file->kv_index);
  free(file->tensor_index);
  free(file);
}

int gguf_get_uint(const gguf_file* file, const char* key, uint64_t* out, char* err, size_t err_size) {
  const gguf_kv* kv = gguf_find_kv(file, key);
  if (kv == NULL) {
    llama_set_error(err, err_size, "metadata '%s' is missing", key);
    return -1;
  }
  switch (kv->type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_UINT32: case GGUF_TYPE_UINT64:
      *out = kv->u;
      return 0;
    case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32: case GGUF_TYPE_INT64:
      if (kv->i >= 0) {
        *out = (uint64_t)kv->i;
        return 0;
      }
      llama_set_error(err, err_size, "metadata '%s' is negative (%lld)", key, (long long)kv->i);
      return -1;
    default:
      llama_set_error(err, err_size, "metadata '%s' has type %u, not an integer", key, kv->type);
      return -1;
  }
}

int gguf_get_float(const gguf_file* file, const char* key, double* out, char* err, size_t err_size) {
  const gguf_kv* kv = gguf_find_kv(file, key);
  if (kv == NULL) {
    llama_set_error(err, err_size, "metadata '%s' is missing", key);
    return -1;
  }
  if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64) {
    llama_set_error(err, err_size, "metadata '%s' has type %u, not a float", key, kv->type);
    return -1;
  }
  *out = kv->f;
  return 0;
}

int gguf_get_string(const gguf_file* file, const char* key, char* out, size_t out_size, char* err,
                    size_t err_size) {
  const gguf_kv* kv = gguf_find_kv(file, key);
  if (kv == NULL) {
    llama_set_error(err, err_size, "metadata '%s' is missing", key);
    return -1;
  }
  if (kv->type != GGUF_TYPE_STRING) {
    llama_set_error(err, err_size, "metadata '%s' has type %u, not a string", key, kv->type);
    return -1;
  }
  if (kv->str_len >= out_size) {
    llama_set_error(err, err_size, "metadata '%s' is longer than %zu bytes", key, out_size ? out_size - 1 : 0);
    return -1;
  }
  memcpy(out, kv->str, (size_t)kv->str_len);
  out[kv->str_len] = '\0';
  return 0;
}

float gguf_half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13); /* inf / NaN */
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign; /* ±0 */
  } else {
    /* Subnormal: normalise. */
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      exponent--;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

int gguf_tensor_to_f32(const gguf_file* file, const gguf_tensor_info* tensor, float* out, uint64_t count,
                       char* err, size_t err_size) {
  if (file == NULL || tensor == NULL || out == NULL) {
    llama_set_error(err, err_size, "gguf_tensor_to_f32: a NULL argument");
    return -1;
  }
  if (count != tensor->n_elements) {
    llama_set_error(err, err_size, "tensor '%.*s' has %llu elements, %llu expected", (int)tensor->name_len, tensor->name,
              (unsigned long long)tensor->n_elements, (unsigned long long)count);
    return -1;
  }
  if (tensor->type != GGUF_TENSOR_F32 && tensor->type != GGUF_TENSOR_F16) {
    llama_set_error(err, err_size, "tensor '%.*s' has ggml type %u; only F32 (0) and F16 (1) are supported",
              (int)tensor->name_len, tensor->name, tensor->type);
    return -1;
  }
  /* parse() checked that n_bytes from offset lie inside the data section. */
  const unsigned char* src = file->image + file->data_offset + tensor->offset;
  if (tensor->type == GGUF_TENSOR_F32) {
    memcpy(out, src, (size_t)tensor->n_bytes);
  } else {
    for (uint64_t e = 0; e < count; ++e) {
      uint16_t h;
      memcpy(&h, src + 2 * e, 2);
      out[e] = gguf_half_to_float(h);
    }
  }
  return 0;
}
