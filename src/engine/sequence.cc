#include "engine/sequence.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "util/status.h"

namespace flashspec {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

RewardScale make_reward_scale(const CostModel& cost, const std::vector<Arm>& arms,
                              const std::vector<Drafter*>& drafters) {
  std::vector<DrafterCost> costs;
  std::vector<int32_t> lengths;
  for (const Arm& arm : arms) {
    costs.push_back(arm.draft_len > 0 ? drafters[size_t(arm.drafter)]->cost() : DrafterCost{});
    lengths.push_back(arm.draft_len);
  }
  return RewardScale(cost, costs, lengths);
}

Sequence::Sequence(const SequenceShared& shared) : shared_(shared) {
  for (const Drafter* drafter : *shared_.drafters)
    draft_length_rules_.emplace_back(*shared_.cost, drafter->cost(), shared_.draft_len_memory);
}

void Sequence::begin(const int32_t* prompt, int32_t prompt_len, GenerateConfig config, int32_t* tokens_out) {
  config_ = std::move(config);
  tokens_out_ = tokens_out;
  progress_ = GenerateProgress{};
  tokens_.assign(prompt, prompt + prompt_len);
  prompt_len_ = prompt_len;
  cache_length_ = 0;
  step_ = 0;
  ended_ = false;
  for (Drafter* drafter : *shared_.drafters) drafter->begin(prompt, prompt_len);
}

void Sequence::end() {
  if (ended_) return;
  ended_ = true;
  for (Drafter* drafter : *shared_.drafters) drafter->finish(tokens_.data(), int32_t(tokens_.size()));
}

bool Sequence::finished_before_step() {
  if (progress_.num_tokens >= config_.max_tokens) {
    progress_.finish_reason = FLASHSPEC_FINISH_LENGTH;
    return true;
  }
  const int32_t max_context = shared_.max_context > 0 ? shared_.max_context : INT32_MAX;
  if (int64_t(tokens_.size()) > int64_t(max_context)) {
    progress_.finish_reason = FLASHSPEC_FINISH_CONTEXT_FULL;
    return true;
  }
  return false;
}

void Sequence::draft(LmHeadRunner& runner) {
  arm_index_ = shared_.policy->select();
  const Arm& arm = (*shared_.arms)[size_t(arm_index_)];
  // A step emits up to k + 1 tokens into a cache of sequence + k tokens:
  // never draft past the token budget or the context.
  const int32_t max_context = shared_.max_context > 0 ? shared_.max_context : INT32_MAX;
  const int32_t remaining = config_.max_tokens - progress_.num_tokens;
  const int64_t room = int64_t(max_context) - int64_t(tokens_.size());
  planned_draft_len_ = shared_.adaptive_draft_len && arm.draft_len > 0
                           ? draft_length_rules_[size_t(arm.drafter)].choose(arm.draft_len)
                           : arm.draft_len;
  draft_len_ = int32_t(std::min<int64_t>({planned_draft_len_, remaining - 1, room}));

  proposal_.clear();
  drafter_called_ = draft_len_ > 0;
  if (!drafter_called_) return;
  DraftRequest request{tokens_.data(), int32_t(tokens_.size()), draft_len_, shared_.vocab, step_};
  (*shared_.drafters)[size_t(arm.drafter)]->propose(request, runner, proposal_);
  if (int32_t(proposal_.tokens.size()) > draft_len_) {
    const int64_t proposed = int64_t(proposal_.tokens.size());
    proposal_.clear();
    fail(FLASHSPEC_ERR_CALLBACK,
         "drafter: proposed " + str(proposed) + " tokens, more than the " + str(draft_len_) + " asked for");
  }
  if (proposal_.parents.empty()) return;
  // Drafters check their trees; this guards the verify and the forward.
  bool valid = proposal_.parents.size() == proposal_.tokens.size() && !proposal_.has_logits;
  for (size_t i = 0; valid && i < proposal_.parents.size(); ++i)
    valid = proposal_.parents[i] >= -1 && proposal_.parents[i] < int32_t(i);
  if (!valid) {
    proposal_.clear();
    fail(FLASHSPEC_ERR_INTERNAL, "drafter: proposed a tree whose parents do not fit its tokens");
  }
}

void Sequence::append_forward_tokens(std::vector<int32_t>& tokens, std::vector<int32_t>* parents) const {
  const int32_t lacked = int32_t(tokens_.size()) - cache_length_;
  tokens.insert(tokens.end(), tokens_.begin() + cache_length_, tokens_.end());
  tokens.insert(tokens.end(), proposal_.tokens.begin(), proposal_.tokens.end());
  if (!parents) return;
  parents->insert(parents->end(), size_t(lacked), -1);
  if (!tree()) {
    parents->insert(parents->end(), proposal_.tokens.size(), -1);
    return;
  }
  // Node i's parent: the root (the last token the cache lacked) or node p.
  for (const int32_t p : proposal_.parents) parents->push_back(p < 0 ? lacked - 1 : lacked + p);
}

void Sequence::forwarded() {
  forward_past_ = cache_length_;
  forward_lacked_ = int32_t(tokens_.size()) - cache_length_;
  cache_length_ = int32_t(tokens_.size()) + drafted();
}

SequenceVerify Sequence::verify_request(const flashspec_tensor* hidden) const {
  SequenceVerify verify{};
  verify.drafts = proposal_.tokens.data();
  verify.parents = tree() ? proposal_.parents.data() : nullptr;
  verify.num_drafts = drafted();
  verify.hidden = hidden;
  verify.draft_logits = proposal_.has_logits ? &proposal_.logits : nullptr;
  verify.temperature = config_.temperature;
  verify.draft_temperature = proposal_.temperature;
  verify.seed = config_.seed;
  verify.request_id = config_.request_id;
  verify.step = step_;
  return verify;
}

CacheFix Sequence::verified(int32_t accepted, const int32_t* emitted, const int32_t* accepted_nodes) {
  // A device backend reports what only the device sees per request: the
  // engine's own values are valid, so a row was not finite.
  if (accepted < 0)
    fail(FLASHSPEC_ERR_NON_FINITE, "target forward: hidden: a row holds a non-finite value, or gives a logit "
                                   "that overflows fp32 (divided by the temperature)");
  if (accepted > drafted())
    fail(FLASHSPEC_ERR_INTERNAL, "verify: accepted count " + str(accepted) + " outside [0, " + str(drafted()) + "]");
  accepted_ = accepted;
  emitted_.assign(emitted, emitted + accepted + 1);
  const int32_t base = int32_t(tokens_.size());
  if (!tree()) {
    // Drop the rejected drafts from the target's cache.
    if (accepted == drafted()) return CacheFix::kNone;
    cache_length_ = base + accepted;
    return CacheFix::kRollback;
  }
  for (int32_t k = 0; k < accepted; ++k)
    if (accepted_nodes[k] < 0 || accepted_nodes[k] >= drafted() || (k > 0 && accepted_nodes[k] <= accepted_nodes[k - 1]))
      fail(FLASHSPEC_ERR_INTERNAL, "verify: accepted node " + str(k) + " is " + str(accepted_nodes[k]));
  // The path's nodes that sit where a chain would put them.
  int32_t in_place = 0;
  while (in_place < accepted && accepted_nodes[in_place] == in_place) ++in_place;
  if (in_place == drafted()) return CacheFix::kNone;
  if (shared_.target_keeps) {
    // Of the forward's tokens: those the cache lacked, then the path.
    keep_.clear();
    for (int32_t i = 0; i < forward_lacked_; ++i) keep_.push_back(i);
    for (int32_t k = 0; k < accepted; ++k) keep_.push_back(forward_lacked_ + accepted_nodes[k]);
    cache_length_ = base + accepted;
    return CacheFix::kKeep;
  }
  // Valid up to the path's nodes in place; the next forward sends the rest
  // of the path again.
  cache_length_ = base + in_place;
  return CacheFix::kRollback;
}

bool Sequence::deliver(double seconds) {
  const Arm& arm = (*shared_.arms)[size_t(arm_index_)];
  progress_.steps += 1;
  step_ += 1;
  const DrafterCost cost = drafter_called_ ? (*shared_.drafters)[size_t(arm.drafter)]->cost() : DrafterCost{};
  const int32_t drafted_count = drafted();
  const double cost_value = step_cost(*shared_.cost, cost, drafter_called_, drafted_count);
  const double reward = step_reward(*shared_.cost, cost, drafter_called_, drafted_count, accepted_);
  // A step cut short by the budget or the context says little about its
  // arm: only full-length steps teach the policy.
  if (draft_len_ == planned_draft_len_)
    shared_.policy->update(arm_index_, shared_.reward_scale->normalize(reward));
  if (drafter_called_) draft_length_rules_[size_t(arm.drafter)].record(drafted_count, accepted_);
  auto record = [&](int32_t delivered) {
    const StepRecord step{arm_index_, drafted_count, accepted_, delivered, reward, cost_value, seconds};
    shared_.metrics->record(step);
    if (shared_.extra_metrics) shared_.extra_metrics->record(step);
  };

  // Emit the accepted drafts, then the recovered or bonus token.
  int32_t delivered = 0;
  for (int32_t j = 0; j <= accepted_; ++j) {
    const int32_t token = emitted_[size_t(j)];
    tokens_.push_back(token);
    if (tokens_out_) tokens_out_[progress_.num_tokens] = token;
    progress_.num_tokens += 1;
    delivered += 1;
    int rc = 0;
    if (config_.on_token) {
      try {
        rc = config_.on_token(token);
      } catch (...) {
        record(delivered);
        fail(FLASHSPEC_ERR_CALLBACK, "token callback: threw an exception");
      }
    }
    bool stop = true;
    if (std::find(config_.stop_tokens.begin(), config_.stop_tokens.end(), token) != config_.stop_tokens.end())
      progress_.finish_reason = FLASHSPEC_FINISH_STOP_TOKEN;
    else if (rc != 0)
      progress_.finish_reason = FLASHSPEC_FINISH_HOST_STOP;
    else if (progress_.num_tokens >= config_.max_tokens)
      progress_.finish_reason = FLASHSPEC_FINISH_LENGTH;
    else
      stop = false;
    if (stop) {
      record(delivered);
      return true;
    }
  }
  record(delivered);
  return false;
}

}  // namespace flashspec
