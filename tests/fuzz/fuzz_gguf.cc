// Fuzzes the Llama runtime example's model loader (examples/llama/runtime):
// the GGUF reader on arbitrary bytes, then the model loader and a forward of
// a few tokens on whatever parses.
//
// Invariants:
//   - gguf_open_memory either fails with a message, leaving *out as it was,
//     or gives a file whose every tensor lies inside the data section
//     (aligned, offset + size ≤ data size, no overflow), whose element counts
//     are the products of the dimensions, whose alignment is a power of two,
//     and whose keys and tensor names are found again by lookup;
//   - F32/F16 tensors convert; any other type is refused with a message;
//   - llama_model_load_gguf either fails with a message, leaving *out as it
//     was, or gives hyperparameters that fit together (d = n_head · head_dim,
//     head_dim even, n_head a multiple of n_head_kv, bos/eos in the
//     vocabulary); a forward of in-range tokens succeeds and one of an
//     out-of-range token is refused.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "gguf.h"
#include "model.h"

namespace {

gguf_file* const kUntouchedFile = reinterpret_cast<gguf_file*>(uintptr_t(0x1234));
llama_model* const kUntouchedModel = reinterpret_cast<llama_model*>(uintptr_t(0x5678));

void check_file(const gguf_file* f) {
  FS_CHECK(f->version == 2 || f->version == 3, "version %u accepted", f->version);
  FS_CHECK(f->alignment != 0 && (f->alignment & (f->alignment - 1)) == 0, "alignment %llu",
        (unsigned long long)f->alignment);
  FS_CHECK(f->data_offset <= f->size && f->data_offset % f->alignment == 0, "data offset %llu",
        (unsigned long long)f->data_offset);
  const uint64_t data_size = f->size - f->data_offset;
  for (uint64_t t = 0; t < f->n_tensors; ++t) {
    const gguf_tensor_info& ti = f->tensors[t];
    FS_CHECK(ti.n_dims >= 1 && ti.n_dims <= GGUF_MAX_DIMS, "tensor %llu: %u dims", (unsigned long long)t, ti.n_dims);
    uint64_t elements = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; ++d) {
      FS_CHECK(ti.dims[d] >= 1, "tensor %llu: dimension %u is 0", (unsigned long long)t, d);
      FS_CHECK(ti.dims[d] <= UINT64_MAX / elements, "tensor %llu: element count overflows", (unsigned long long)t);
      elements *= ti.dims[d];
    }
    FS_CHECK(elements == ti.n_elements, "tensor %llu: n_elements", (unsigned long long)t);
    FS_CHECK(ti.offset % f->alignment == 0, "tensor %llu: misaligned", (unsigned long long)t);
    FS_CHECK(ti.offset <= data_size && ti.n_bytes <= data_size - ti.offset, "tensor %llu: data outside the file",
          (unsigned long long)t);
    const uint64_t width = ti.type == GGUF_TENSOR_F32 ? 4 : ti.type == GGUF_TENSOR_F16 ? 2 : 0;
    FS_CHECK(ti.n_bytes == ti.n_elements * width, "tensor %llu: n_bytes", (unsigned long long)t);
    if (std::memchr(ti.name, 0, size_t(ti.name_len)) == nullptr) {
      const std::string name(ti.name, size_t(ti.name_len));
      FS_CHECK(gguf_find_tensor(f, name.c_str()) == &ti, "tensor '%s' not found by name", name.c_str());
    }
    if (ti.n_elements <= 4096) {
      std::vector<float> values(size_t(ti.n_elements));
      char err[256] = "";
      const int rc = gguf_tensor_to_f32(f, &ti, values.data(), ti.n_elements, err, sizeof err);
      FS_CHECK((rc == 0) == (width != 0), "tensor of type %u: conversion returned %d", ti.type, rc);
      FS_CHECK(rc == 0 || err[0] != '\0', "a refused conversion without a message");
    }
  }
  for (uint64_t k = 0; k < f->n_kv; ++k) {
    const gguf_kv& kv = f->kv[k];
    if (std::memchr(kv.key, 0, size_t(kv.key_len)) == nullptr) {
      const std::string key(kv.key, size_t(kv.key_len));
      FS_CHECK(gguf_find_kv(f, key.c_str()) == &kv, "key '%s' not found by name", key.c_str());
    }
  }
}

void check_model(const llama_model* model, const uint8_t* data, size_t size) {
  const llama_hparams* hp = llama_model_hparams(model);
  FS_CHECK(hp->n_embd == hp->n_head * hp->head_dim && hp->head_dim % 2 == 0, "d %d, heads %d", hp->n_embd, hp->n_head);
  FS_CHECK(hp->n_head % hp->n_head_kv == 0, "heads %d, kv heads %d", hp->n_head, hp->n_head_kv);
  FS_CHECK(hp->bos_token < hp->n_vocab && hp->eos_token < hp->n_vocab, "bos/eos outside the vocabulary");
  llama_session* session = nullptr;
  char err[256] = "";
  const int32_t capacity = hp->n_ctx < 4 ? hp->n_ctx : 4;
  if (llama_session_create(model, capacity, &session, err, sizeof err) != 0) {
    FS_CHECK(err[0] != '\0', "a refused session without a message");
    return;
  }
  std::vector<int32_t> tokens(static_cast<size_t>(capacity), 0);
  for (int32_t i = 0; i < capacity; ++i) tokens[size_t(i)] = int32_t(data[size_t(i) % size]) % hp->n_vocab;
  const float* hidden = nullptr;
  FS_CHECK(llama_session_forward(session, tokens.data(), capacity, &hidden, err, sizeof err) == 0, "forward: %s", err);
  FS_CHECK(llama_session_truncate(session, 0, err, sizeof err) == 0, "truncate: %s", err);
  const int32_t bad = hp->n_vocab;
  FS_CHECK(llama_session_forward(session, &bad, 1, &hidden, err, sizeof err) != 0, "token %d accepted", bad);
  FS_CHECK(llama_session_length(session) == 0, "a refused forward changed the cache");
  llama_session_free(session);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gguf_file* file = kUntouchedFile;
  char err[512] = "";
  if (gguf_open_memory(data, size, &file, err, sizeof err) != 0) {
    FS_CHECK(file == kUntouchedFile, "*out written on error");
    FS_CHECK(err[0] != '\0', "an error without a message");
    return 0;
  }
  check_file(file);
  llama_model* model = kUntouchedModel;
  err[0] = '\0';
  if (llama_model_load_gguf(file, "fuzz", &model, err, sizeof err) != 0) {
    FS_CHECK(model == kUntouchedModel, "*out written on error");
    FS_CHECK(err[0] != '\0', "an error without a message");
  } else {
    check_model(model, data, size);
    llama_model_free(model);
  }
  gguf_close(file);
  return 0;
}
