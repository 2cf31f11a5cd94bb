#include "engine/callback_drafter.h"

#include <cstdint>
#include <string>

#include "engine/host_call.h"
#include "util/dtype.h"
#include "util/raw_enum.h"
#include "util/status.h"

namespace flashspec {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

void check_callback_view(const flashspec_tensor& view, const char* what, flashspec_memory memory, int64_t rows,
                         int64_t cols) {
  const std::string name(what);
  if (view.data == nullptr) fail(FLASHSPEC_ERR_CALLBACK, name + ": data is NULL");
  const int32_t dtype = raw_enum(view.dtype);
  if (dtype != FLASHSPEC_DTYPE_F32 && dtype != FLASHSPEC_DTYPE_BF16 && dtype != FLASHSPEC_DTYPE_F16)
    fail(FLASHSPEC_ERR_CALLBACK, name + ": unknown dtype " + str(dtype));
  if (reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) != 0)
    fail(FLASHSPEC_ERR_CALLBACK, name + ": data is not aligned to its element size");
  if (raw_enum(view.memory) != memory)
    fail(FLASHSPEC_ERR_CALLBACK, name + (memory == FLASHSPEC_MEMORY_HOST ? ": must be host memory for this backend"
                                                                          : ": must be device memory for this backend"));
  if (view.rows != rows)
    fail(FLASHSPEC_ERR_CALLBACK, name + ": has " + str(view.rows) + " rows, expected " + str(rows));
  if (view.cols != cols)
    fail(FLASHSPEC_ERR_CALLBACK, name + ": has " + str(view.cols) + " columns, expected " + str(cols));
  if (view.row_stride < view.cols)
    fail(FLASHSPEC_ERR_CALLBACK, name + ": row_stride " + str(view.row_stride) + " is smaller than cols");
}

flashspec_draft_call CallbackDrafter::make_call(const DraftRequest& request, int32_t max_tokens) {
  flashspec_draft_call call{};
  call.struct_size = sizeof(flashspec_draft_call);
  call.context = request.context;
  call.context_len = request.length;
  call.max_tokens = max_tokens;
  call.step = request.step;
  return call;
}

void CallbackDrafter::invoke(flashspec_draft_call& call) {
  call_host("draft callback", [&] { return config_.draft(config_.user_data, &call); });
  if (call.num_tokens < 0 || call.num_tokens > call.max_tokens)
    fail(FLASHSPEC_ERR_CALLBACK, "draft callback: num_tokens is " + str(call.num_tokens) + ", outside [0, " +
                                     str(call.max_tokens) + "]");
}

void CallbackDrafter::propose(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) {
  out.clear();
  if (config_.kind == FLASHSPEC_DRAFT_HIDDEN)
    propose_hidden(request, runner, out);
  else
    propose_tokens(request, runner, out);
}

void CallbackDrafter::propose_tokens(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) {
  const bool tree = config_.kind == FLASHSPEC_DRAFT_TREE;
  buffer_.assign(size_t(request.max_tokens), -1);
  flashspec_draft_call call = make_call(request, request.max_tokens);
  call.tokens = buffer_.data();
  if (tree) {
    // A parent left unwritten reads as outside the tree.
    parents_.assign(size_t(request.max_tokens), -2);
    call.parents = parents_.data();
  }
  invoke(call);
  for (int32_t j = 0; j < call.num_tokens; ++j)
    if (buffer_[size_t(j)] < 0 || buffer_[size_t(j)] >= request.vocab)
      fail(FLASHSPEC_ERR_CALLBACK, "draft callback: token " + str(j) + " is " + str(buffer_[size_t(j)]) +
                                       ", outside [0, " + str(request.vocab) + ")");
  if (tree) {
    for (int32_t i = 0; i < call.num_tokens; ++i) {
      const int32_t parent = parents_[size_t(i)];
      if (parent < -1 || parent >= i)
        fail(FLASHSPEC_ERR_CALLBACK, "draft callback: node " + str(i) + ": parent " + str(parent) +
                                         " is outside [-1, " + str(i) +
                                         ") (-1: the last context token; a parent comes before its children)");
    }
    out.parents.assign(parents_.begin(), parents_.begin() + call.num_tokens);
  }
  out.tokens.assign(buffer_.begin(), buffer_.begin() + call.num_tokens);
  if (config_.kind == FLASHSPEC_DRAFT_LOGITS && call.num_tokens > 0) {
    check_callback_view(call.logits, "draft callback: logits", runner.memory(), call.num_tokens, request.vocab);
    out.has_logits = true;
    out.logits = call.logits;
    out.temperature = config_.draft_temperature;
  }
}

void CallbackDrafter::propose_hidden(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) {
  const int64_t hidden_size = config_.head->hidden;
  FieldNames names{};
  names[size_t(Field::kHidden)] = "draft callback: hidden";
  while (int32_t(out.tokens.size()) < request.max_tokens) {
    const int32_t drafted = int32_t(out.tokens.size());
    flashspec_draft_call call = make_call(request, request.max_tokens - drafted);
    call.drafted = out.tokens.data();
    call.num_drafted = drafted;
    invoke(call);
    if (call.num_tokens == 0) break;
    check_callback_view(call.hidden, "draft callback: hidden", runner.memory(), call.num_tokens, hidden_size);
    buffer_.assign(size_t(call.num_tokens), -1);
    naming_fields(names, [&] { runner.draft_greedy(*config_.head, call.hidden, buffer_.data()); });
    // The head's vocabulary is the target's (checked when the engine is made).
    out.tokens.insert(out.tokens.end(), buffer_.begin(), buffer_.end());
  }
}

}  // namespace flashspec
