#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "engine/callback_drafter.h"
#include "engine/host_call.h"
#include "util/status.h"

namespace flashspec {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::vector<DrafterCost> arm_costs(const EngineConfig& config) {
  std::vector<DrafterCost> costs;
  for (const Arm& arm : config.arms)
    costs.push_back(arm.draft_len > 0 ? config.drafters[size_t(arm.drafter)]->cost() : DrafterCost{});
  return costs;
}

std::vector<int32_t> arm_lengths(const EngineConfig& config) {
  std::vector<int32_t> lengths;
  for (const Arm& arm : config.arms) lengths.push_back(arm.draft_len);
  return lengths;
}

// Clears the busy flag however generate() leaves.
class BusyGuard {
 public:
  explicit BusyGuard(bool& flag) : flag_(flag) { flag_ = true; }
  ~BusyGuard() { flag_ = false; }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  bool& flag_;
};

}  // namespace

Engine::Engine(EngineConfig config, LmHeadRunner& runner)
    : config_(std::move(config)),
      runner_(runner),
      vocab_(config_.target_head->vocab),
      hidden_(config_.target_head->hidden),
      policy_(make_policy(config_.policy)),
      reward_scale_(config_.cost, arm_costs(config_), arm_lengths(config_)),
      metrics_(int32_t(config_.arms.size())) {}

void Engine::forward_target(const std::vector<int32_t>& tokens, int32_t num_past, int32_t num_rows, uint64_t step,
                            flashspec_tensor& hidden) {
  flashspec_target_call call{};
  call.struct_size = sizeof(flashspec_target_call);
  call.tokens = tokens.data();
  call.num_tokens = int32_t(tokens.size());
  call.num_past = num_past;
  call.num_rows = num_rows;
  call.step = step;
  call_host("target forward", [&] { return config_.target_forward(config_.target_user_data, &call); });
  check_callback_view(call.hidden, "target forward: hidden", runner_.memory(), num_rows, hidden_);
  hidden = call.hidden;
}

Engine::StepOutcome Engine::run_step(int32_t arm_index, int32_t draft_len, const GenerateConfig& config,
                                     uint64_t step) {
  const Arm& arm = config_.arms[size_t(arm_index)];
  const int32_t length = int32_t(sequence_.size());

  // Draft.
  proposal_.clear();
  const bool drafter_called = draft_len > 0;
  if (drafter_called) {
    DraftRequest request{sequence_.data(), length, draft_len, vocab_, step};
    config_.drafters[size_t(arm.drafter)]->propose(request, runner_, proposal_);
    require(int32_t(proposal_.tokens.size()) <= draft_len, FLASHSPEC_ERR_CALLBACK, "drafter",
            "proposed " + str(int64_t(proposal_.tokens.size())) + " tokens, more than the " + str(draft_len) +
                " asked for");
  }
  const int32_t drafted = int32_t(proposal_.tokens.size());

  // Target forward over the tokens its cache lacks, then the drafts.
  forward_tokens_.assign(sequence_.begin() + cache_length_, sequence_.end());
  forward_tokens_.insert(forward_tokens_.end(), proposal_.tokens.begin(), proposal_.tokens.end());
  flashspec_tensor hidden{};
  forward_target(forward_tokens_, cache_length_, drafted + 1, step, hidden);
  cache_length_ = length + drafted;

  // Verify and finalize through the fused LM head. Its errors name the
  // callback outputs they are about.
  SequenceVerify verify{};
  verify.drafts = proposal_.tokens.data();
  verify.num_drafts = drafted;
  verify.hidden = &hidden;
  verify.draft_logits = proposal_.has_logits ? &proposal_.logits : nullptr;
  verify.temperature = config.temperature;
  verify.draft_temperature = proposal_.temperature;
  verify.seed = config.seed;
  verify.request_id = config.request_id;
  verify.step = step;
  emitted_.assign(size_t(drafted + 1), -1);
  FieldNames names{};
  names[size_t(Field::kHidden)] = "target forward: hidden";
  names[size_t(Field::kDraftLogits)] = "draft callback: logits";
  const int32_t accepted =
      naming_fields(names, [&] { return runner_.verify(*config_.target_head, verify, emitted_.data()); });
  // A device backend reports what only the device sees per request: the
  // engine's own values are valid, so a row was not finite.
  if (accepted < 0)
    fail(FLASHSPEC_ERR_NON_FINITE, "target forward: hidden: a row holds a non-finite value, or gives a logit "
                                   "that overflows fp32 (divided by the temperature)");
  if (accepted > drafted)
    fail(FLASHSPEC_ERR_INTERNAL, "verify: accepted count " + str(accepted) + " outside [0, " + str(drafted) + "]");

  // Drop the rejected drafts from the target's cache.
  if (accepted < drafted) {
    cache_length_ = length + accepted;
    if (config_.target_rollback)
      call_host("target rollback",
                [&] { return config_.target_rollback(config_.target_user_data, cache_length_); });
  }
  return StepOutcome{drafted, accepted, drafter_called};
}

void Engine::generate(const int32_t* prompt, int32_t prompt_len, const GenerateConfig& config,
                      int32_t* tokens_out) {
  // The C API refuses a nested generate before it gets here.
  if (busy_) fail(FLASHSPEC_ERR_INTERNAL, "Engine::generate entered while generating");
  BusyGuard busy(busy_);
  cancel_requested_.store(false, std::memory_order_relaxed);
  progress_ = GenerateProgress{};
  sequence_.assign(prompt, prompt + prompt_len);
  cache_length_ = 0;
  for (Drafter* drafter : config_.drafters) drafter->begin(prompt, prompt_len);

  const int32_t max_context = config_.max_context > 0 ? config_.max_context : INT32_MAX;
  for (uint64_t step = 0;; ++step) {
    if (progress_.num_tokens >= config.max_tokens) {
      progress_.finish_reason = FLASHSPEC_FINISH_LENGTH;
      return;
    }
    if (int64_t(sequence_.size()) > int64_t(max_context)) {
      progress_.finish_reason = FLASHSPEC_FINISH_CONTEXT_FULL;
      return;
    }
    if (cancel_requested_.load(std::memory_order_relaxed)) {
      progress_.finish_reason = FLASHSPEC_FINISH_CANCELLED;
      fail(FLASHSPEC_ERR_CANCELLED, "engine: generation cancelled after " + str(progress_.num_tokens) + " tokens");
    }
    const auto start = std::chrono::steady_clock::now();
    const int32_t arm_index = policy_->select();
    const Arm& arm = config_.arms[size_t(arm_index)];
    // A step emits up to k + 1 tokens into a cache of sequence + k tokens:
    // never draft past the token budget or the context.
    const int32_t remaining = config.max_tokens - progress_.num_tokens;
    const int64_t room = int64_t(max_context) - int64_t(sequence_.size());
    const int32_t draft_len = int32_t(std::min<int64_t>({arm.draft_len, remaining - 1, room}));

    const StepOutcome outcome = run_step(arm_index, draft_len, config, step);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress_.steps += 1;

    const DrafterCost cost =
        outcome.drafter_called ? config_.drafters[size_t(arm.drafter)]->cost() : DrafterCost{};
    const double cost_value = step_cost(config_.cost, cost, outcome.drafter_called, outcome.drafted);
    const double reward = step_reward(config_.cost, cost, outcome.drafter_called, outcome.drafted, outcome.accepted);
    // A step cut short by the budget or the context says little about its
    // arm: only full-length steps teach the policy.
    if (draft_len == arm.draft_len) policy_->update(arm_index, reward_scale_.normalize(reward));
    auto record = [&](int32_t delivered) {
      metrics_.record(StepRecord{arm_index, outcome.drafted, outcome.accepted, delivered, reward, cost_value, seconds});
    };

    // Emit the accepted drafts, then the recovered or bonus token.
    int32_t delivered = 0;
    bool stop = false;
    for (int32_t j = 0; j <= outcome.accepted && !stop; ++j) {
      const int32_t token = emitted_[size_t(j)];
      sequence_.push_back(token);
      if (tokens_out) tokens_out[progress_.num_tokens] = token;
      progress_.num_tokens += 1;
      delivered += 1;
      int rc = 0;
      if (config.on_token) {
        try {
          rc = config.on_token(config.on_token_user_data, token);
        } catch (...) {
          record(delivered);
          fail(FLASHSPEC_ERR_CALLBACK, "token callback: threw an exception");
        }
      }
      if (std::find(config.stop_tokens.begin(), config.stop_tokens.end(), token) != config.stop_tokens.end()) {
        progress_.finish_reason = FLASHSPEC_FINISH_STOP_TOKEN;
        stop = true;
      } else if (rc != 0) {
        progress_.finish_reason = FLASHSPEC_FINISH_HOST_STOP;
        stop = true;
      } else if (progress_.num_tokens >= config.max_tokens) {
        progress_.finish_reason = FLASHSPEC_FINISH_LENGTH;
        stop = true;
      }
    }
    record(delivered);
    if (stop) return;
  }
}

}  // namespace flashspec
