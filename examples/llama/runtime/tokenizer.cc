// tokenizer.cc — see tokenizer.h.
#include "tokenizer.h"
#include "error.h"

#include <sentencepiece_processor.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

struct llama_tokenizer {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {


bool valid_id(const llama_tokenizer* t, int32_t id) { return id >= 0 && id < t->processor.GetPieceSize(); }

}  // namespace

extern "C" int llama_tokenizer_load(const char* path, llama_tokenizer** out, char* err, size_t err_size) {
  if (path == nullptr || out == nullptr) {
    llama_set_error(err, err_size, "llama_tokenizer_load: %s is NULL", path == nullptr ? "path" : "out");
    return -1;
  }
  try {
    auto* t = new llama_tokenizer;
    const auto status = t->processor.Load(path);
    if (!status.ok()) {
      llama_set_error(err, err_size, "%s: not a SentencePiece model: %s", path, status.ToString().c_str());
      delete t;
      return -1;
    }
    if (t->processor.GetPieceSize() <= 0) {
      llama_set_error(err, err_size, "%s: the SentencePiece model has no pieces", path);
      delete t;
      return -1;
    }
    *out = t;
    return 0;
  } catch (const std::bad_alloc&) {
    llama_set_error(err, err_size, "%s: out of memory", path);
  } catch (const std::exception& e) {
    llama_set_error(err, err_size, "%s: %s", path, e.what());
  }
  return -1;
}

extern "C" void llama_tokenizer_free(llama_tokenizer* tokenizer) { delete tokenizer; }

extern "C" int32_t llama_tokenizer_vocab_size(const llama_tokenizer* t) { return t ? t->processor.GetPieceSize() : 0; }
extern "C" int32_t llama_tokenizer_bos(const llama_tokenizer* t) { return t ? t->processor.bos_id() : -1; }
extern "C" int32_t llama_tokenizer_eos(const llama_tokenizer* t) { return t ? t->processor.eos_id() : -1; }

extern "C" int llama_tokenizer_encode(const llama_tokenizer* t, const char* text, size_t length, int32_t* ids,
                                      int32_t capacity, int32_t* count, char* err, size_t err_size) {
  if (t == nullptr || (text == nullptr && length > 0) || count == nullptr || (ids == nullptr && capacity > 0) ||
      capacity < 0) {
    llama_set_error(err, err_size, "llama_tokenizer_encode: a NULL argument or a negative capacity");
    return -1;
  }
  try {
    std::vector<int> pieces;
    const auto status = t->processor.Encode(std::string(text ? text : "", length), &pieces);
    if (!status.ok()) {
      llama_set_error(err, err_size, "encoding failed: %s", status.ToString().c_str());
      return -1;
    }
    *count = static_cast<int32_t>(pieces.size());
    if (pieces.size() > static_cast<size_t>(capacity)) {
      llama_set_error(err, err_size, "the text encodes to %zu tokens, more than the capacity %d", pieces.size(), capacity);
      return -1;
    }
    for (size_t i = 0; i < pieces.size(); ++i) ids[i] = pieces[i];
    return 0;
  } catch (const std::exception& e) {
    llama_set_error(err, err_size, "encoding failed: %s", e.what());
  }
  return -1;
}

extern "C" int llama_tokenizer_decode(const llama_tokenizer* t, const int32_t* ids, int32_t count, char** text,
                                      size_t* length, char* err, size_t err_size) {
  if (t == nullptr || (ids == nullptr && count > 0) || count < 0 || text == nullptr) {
    llama_set_error(err, err_size, "llama_tokenizer_decode: a NULL argument or a negative count");
    return -1;
  }
  try {
    std::vector<int> pieces(ids, ids + count);
    for (int32_t i = 0; i < count; ++i)
      if (!valid_id(t, ids[i])) {
        llama_set_error(err, err_size, "token %d at index %d is outside [0, %d)", ids[i], i, t->processor.GetPieceSize());
        return -1;
      }
    std::string decoded;
    const auto status = t->processor.Decode(pieces, &decoded);
    if (!status.ok()) {
      llama_set_error(err, err_size, "decoding failed: %s", status.ToString().c_str());
      return -1;
    }
    char* copy = static_cast<char*>(std::malloc(decoded.size() + 1));
    if (copy == nullptr) {
      llama_set_error(err, err_size, "out of memory");
      return -1;
    }
    std::memcpy(copy, decoded.data(), decoded.size());
    copy[decoded.size()] = '\0';
    *text = copy;
    if (length != nullptr) *length = decoded.size();
    return 0;
  } catch (const std::exception& e) {
    llama_set_error(err, err_size, "decoding failed: %s", e.what());
  }
  return -1;
}

extern "C" int llama_tokenizer_piece(const llama_tokenizer* t, int32_t id, char* out, size_t out_size, char* err,
                                     size_t err_size) {
  if (t == nullptr || out == nullptr || out_size == 0) {
    llama_set_error(err, err_size, "llama_tokenizer_piece: a NULL argument");
    return -1;
  }
  if (!valid_id(t, id)) {
    llama_set_error(err, err_size, "token %d is outside [0, %d)", id, t->processor.GetPieceSize());
    return -1;
  }
  try {
    const std::string& piece = t->processor.IdToPiece(id);
    if (piece.size() >= out_size) {
      llama_set_error(err, err_size, "the piece of token %d is longer than %zu bytes", id, out_size - 1);
      return -1;
    }
    std::memcpy(out, piece.data(), piece.size());
    out[piece.size()] = '\0';
    return 0;
  } catch (const std::exception& e) {
    llama_set_error(err, err_size, "piece lookup failed: %s", e.what());
  }
  return -1;
}
