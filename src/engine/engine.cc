#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine/callback_drafter.h"
#include "engine/host_call.h"
#include "util/busy_guard.h"
#include "util/status.h"

namespace flashspec {

namespace {

std::string str(int64_t v) { return std::to_string(v); }


}  // namespace

Engine::Engine(EngineConfig config, LmHeadRunner& runner)
    : config_(std::move(config)),
      runner_(runner),
      vocab_(config_.target_head->vocab),
      hidden_(config_.target_head->hidden),
      policy_(make_policy(config_.policy)),
      reward_scale_(make_reward_scale(config_.cost, config_.arms, config_.drafters)),
      metrics_(int32_t(config_.arms.size())),
      sequence_(SequenceShared{&config_.arms, &config_.drafters, &config_.cost, policy_.get(), &reward_scale_,
                               &metrics_, nullptr, vocab_, config_.max_context,
                               config_.adaptive_draft_len, config_.draft_len_memory,
                               config_.target_keep != nullptr}) {}

bool Engine::run_step() {
  const auto start = std::chrono::steady_clock::now();
  sequence_.draft(runner_);
  const int32_t drafted = sequence_.drafted();

  // Target forward over the tokens its cache lacks, then the drafts (a
  // tree's with their parents).
  const bool tree = sequence_.tree();
  forward_tokens_.clear();
  forward_parents_.clear();
  sequence_.append_forward_tokens(forward_tokens_, tree ? &forward_parents_ : nullptr);
  flashspec_target_call call{};
  call.struct_size = sizeof(flashspec_target_call);
  call.tokens = forward_tokens_.data();
  call.parents = tree ? forward_parents_.data() : nullptr;
  call.num_tokens = int32_t(forward_tokens_.size());
  call.num_past = sequence_.cache_length();
  call.num_rows = drafted + 1;
  call.step = sequence_.step();
  call_host("target forward", [&] { return config_.target_forward(config_.target_user_data, &call); });
  check_callback_view(call.hidden, "target forward: hidden", runner_.memory(), drafted + 1, hidden_);
  sequence_.forwarded();

  // Verify and finalize through the fused LM head. Its errors name the
  // callback outputs they are about.
  const SequenceVerify verify = sequence_.verify_request(&call.hidden);
  emitted_.assign(size_t(drafted + 1), -1);
  accepted_nodes_.assign(size_t(drafted + 1), -1);
  FieldNames names{};
  names[size_t(Field::kHidden)] = "target forward: hidden";
  names[size_t(Field::kDraftLogits)] = "draft callback: logits";
  const int32_t accepted = naming_fields(
      names, [&] { return runner_.verify(*config_.target_head, verify, emitted_.data(), accepted_nodes_.data()); });
  switch (sequence_.verified(accepted, emitted_.data(), accepted_nodes_.data())) {
    case CacheFix::kNone: break;
    case CacheFix::kRollback:
      if (config_.target_rollback)
        call_host("target rollback",
                  [&] { return config_.target_rollback(config_.target_user_data, sequence_.cache_length()); });
      break;
    case CacheFix::kKeep: {
      const std::vector<int32_t>& keep = sequence_.keep();
      call_host("target keep", [&] {
        return config_.target_keep(config_.target_user_data, sequence_.forward_past(), keep.data(),
                                   int32_t(keep.size()));
      });
      break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return sequence_.deliver(seconds);
}

void Engine::generate(const int32_t* prompt, int32_t prompt_len, const GenerateConfig& config,
                      int32_t* tokens_out) {
  // The C API refuses a nested generate before it gets here.
  if (busy_) fail(FLASHSPEC_ERR_INTERNAL, "Engine::generate entered while generating");
  BusyGuard busy(busy_);
  cancel_requested_.store(false, std::memory_order_relaxed);
  sequence_.begin(prompt, prompt_len, config, tokens_out);
  try {
    run_loop();
  } catch (...) {
    sequence_.end();
    throw;
  }
  sequence_.end();
}

void Engine::run_loop() {
  while (!sequence_.finished_before_step()) {
    if (cancel_requested_.load(std::memory_order_relaxed)) {
      sequence_.progress().finish_reason = FLASHSPEC_FINISH_CANCELLED;
      fail(FLASHSPEC_ERR_CANCELLED,
           "engine: generation cancelled after " + str(sequence_.progress().num_tokens) + " tokens");
    }
    if (run_step()) return;
  }
}

}  // namespace flashspec
